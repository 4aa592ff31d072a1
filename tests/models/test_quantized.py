"""Weight-only int8 / int4 targets: every row rounds as a one-row step does, so speculation is
lossless against the quantized model (which is a different model from its bf16 source)."""

import pytest
import torch

from decode_oracle import generate_one
from blockdraft.errors import ConfigError
from blockdraft.layers.quant import QuantizedLinear, check_scheme
from blockdraft.llm import LLM
from blockdraft.loading import load_drafter, load_target
from blockdraft.sampling.params import SamplingParams
from conftest import ASSETS, DRAFTER_NAMES, random_prompts

PROMPTS = random_prompts(4, seed=81)


@pytest.mark.parametrize("scheme", ["int8", "int4", "int8_g32"])
@pytest.mark.parametrize("shape", [(192, 576), (1536, 576), (576, 1536)])
def test_quantized_rows_independent_of_row_count(scheme, shape):
    g = torch.Generator().manual_seed(0)
    layer = QuantizedLinear(torch.randn(shape, generator=g) * 0.05, None, scheme)
    x = torch.randn(40, shape[1], generator=g).bfloat16()
    one = torch.cat([layer(x[i:i + 1]) for i in range(40)])
    for rows in (2, 9, 16, 17, 40):
        assert torch.equal(layer(x[:rows]), one[:rows]), rows
    ref = x.float() @ layer.weight.float().T                                 # the dequantized weight
    torch.testing.assert_close(layer(x).float(), ref, rtol=0.02, atol=0.05)


@pytest.mark.parametrize("scheme", ["int8", "int4", "int8_g32"])
def test_quantization_error_is_small(scheme):
    g = torch.Generator().manual_seed(1)
    w = torch.randn(256, 512, generator=g) * 0.05
    err = (QuantizedLinear(w, None, scheme).weight.float() - w).abs().max() / w.abs().max()
    assert err < {"int8": 0.01, "int8_g32": 0.01, "int4": 0.1}[scheme]


def test_grouped_8bit_head_is_closer_than_per_channel():
    """A row whose weights span a wide range: one scale per row loses its small weights, one per 32 does not."""
    g = torch.Generator().manual_seed(2)
    w = torch.randn(64, 256, generator=g) * torch.logspace(-3, 0, 256)[torch.randperm(256, generator=g)]
    err = {s: ((QuantizedLinear(w, None, s).weight.float() - w).abs() / w.abs()).median() for s in ("int8", "int8_g32")}
    assert err["int8_g32"] < 0.5 * err["int8"], err


@pytest.fixture(scope="module", params=["int8", "int4"])
def quantized(request):
    target = load_target(ASSETS / "target-qwen3", "bfloat16", request.param)
    return target, {name: load_drafter(ASSETS / name, target) for name in DRAFTER_NAMES}


def test_speculation_is_lossless_against_the_quantized_target(quantized):
    target, drafters = quantized
    assert isinstance(target.lm_head, QuantizedLinear) and target.lm_head.scheme == "int8_g32" and isinstance(target.layers[0].mlp.gate_up_proj, QuantizedLinear)
    assert isinstance(target.layers[0].self_attn.qkv_proj, QuantizedLinear)
    for prompt in PROMPTS:
        ref = generate_one(target, prompt, SamplingParams(max_tokens=28, ignore_eos=True)).token_ids
        for name, drafter in drafters.items():
            gen = generate_one(target, prompt, SamplingParams(max_tokens=28, ignore_eos=True), drafter)
            assert gen.token_ids == ref, name


@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_llm_quantized_engine_matches_its_own_plain_decoding(scheme):
    kw = dict(target=str(ASSETS / "target-qwen3"), dtype="bfloat16", quantization=scheme, max_batch=4)
    spec = LLM(drafter=str(ASSETS / "dspark"), adaptive_speculation=False, **kw)
    plain = LLM(drafter="none", **kw)
    assert spec.numerics["quantization"] == scheme
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    a = spec.generate(prompt_token_ids=PROMPTS, sampling_params=params)
    b = plain.generate(prompt_token_ids=PROMPTS, sampling_params=params)
    assert [o.token_ids for o in a] == [o.token_ids for o in b]


def test_bad_quantization_is_named():
    with pytest.raises(ConfigError, match="quantization 'int3' is not supported"):
        check_scheme("int3", torch.bfloat16)
    with pytest.raises(ConfigError, match="runs with bf16 activations; dtype is float32"):
        load_target(ASSETS / "target-qwen3", "float32", "int8")
    with pytest.raises(ConfigError, match="on cuda use quantization=none"):
        check_scheme("int4", torch.bfloat16, "cuda")
