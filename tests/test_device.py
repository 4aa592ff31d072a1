"""--device: a named error for a device that is not there; every tensor of a step on the chosen one.

The CUDA test runs wherever a GPU is visible (`scripts/gpu_check.sh` runs it with the speed check)
and is skipped here.
"""

import pytest
import torch

import blockdraft
from blockdraft.cli import main
from blockdraft.errors import ConfigError
from blockdraft.numerics import resolve_device
from conftest import ASSETS, DRAFTER_NAMES, random_prompts

TINY = str(ASSETS / "target-qwen3")
PROMPTS = random_prompts(3, seed=91)


def test_devices_are_validated_by_name(capsys):
    assert resolve_device(None) == resolve_device("cpu") == "cpu"
    with pytest.raises(ConfigError, match="is not a device"):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="no CUDA device is visible"):
            blockdraft.LLM(target=TINY, drafter="none", device="cuda")
    assert main(["generate", "--target", TINY, "--prompt-ids", "1,2", "--tp", "2", "--device", "cuda:0"]) == 2
    assert "with --tp is not supported" in capsys.readouterr().err


def test_cpu_device_places_everything_on_cpu():
    """Every weight and buffer on the CPU, and speculation there equals plain decoding with drafts accepted."""
    params = blockdraft.SamplingParams(max_tokens=16, ignore_eos=True)
    llm = blockdraft.LLM(target=TINY, drafter=str(ASSETS / "dspark"), device="cpu", max_batch=2,
                         adaptive_speculation=False)
    for model in (llm.target, llm.drafter):
        assert {t.device.type for t in [*model.parameters(), *model.buffers()]} == {"cpu"}
    plain = blockdraft.LLM(target=TINY, drafter="none", device="cpu", max_batch=2)
    out = llm.generate(prompt_token_ids=PROMPTS[:2], sampling_params=params)
    ref = plain.generate(prompt_token_ids=PROMPTS[:2], sampling_params=params)
    assert [o.token_ids for o in out] == [o.token_ids for o in ref] and all(len(o.token_ids) == 16 for o in out)
    assert sum(o.accepted for o in out) > 0 and llm.numerics["device"] == "cpu"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("drafter", [None, *DRAFTER_NAMES])
def test_cuda_speculation_is_lossless_and_stays_on_the_gpu(drafter):
    params = blockdraft.SamplingParams(max_tokens=24, ignore_eos=True)
    plain = blockdraft.LLM(target=TINY, drafter="none", device="cuda", dtype="float32", max_batch=4)
    ref = [o.token_ids for o in plain.generate(prompt_token_ids=PROMPTS, sampling_params=params)]
    if drafter is None:
        assert plain.target.lm_head.weight.device.type == "cuda"
        return
    llm = blockdraft.LLM(target=TINY, drafter=str(ASSETS / drafter), device="cuda", dtype="float32", max_batch=4,
                         adaptive_speculation=False)
    assert llm.drafter.fc.weight.device.type == "cuda"
    out = llm.generate(prompt_token_ids=PROMPTS, sampling_params=params)
    assert [o.token_ids for o in out] == ref
    seeded = blockdraft.SamplingParams(max_tokens=16, temperature=1.0, seed=4)
    a = llm.generate(prompt_token_ids=PROMPTS, sampling_params=seeded)
    b = llm.generate(prompt_token_ids=PROMPTS[:1], sampling_params=seeded)
    assert a[0].token_ids == b[0].token_ids            # seeded output independent of the batch
