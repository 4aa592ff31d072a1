"""The drafters shipped for SmolLM2 load as published, run losslessly, and interoperate.

Interop: `tests/goldens/smollm2_dflash.json` holds the reference `dflash` package's greedy
tokens and per-step acceptance lengths for the shipped SmolLM2 DFlash drafter (z-lab layout, the
target's full vocabulary: the reference has no pruned-vocabulary support, so DFlash keeps the full
one) on the converted SmolLM2 (fp32; scripts/goldens/gen_smollm2_dflash.py). Equal ALs mean the reference read our
published layout exactly as we do.
"""

import json

import pytest

from decode_oracle import generate_one
from blockdraft.checkpoints.digest import dir_digest
from blockdraft.default_model import smollm2_dir
from blockdraft.llm import DEFAULT_DRAFTERS
from blockdraft.loading import load_drafter, load_target
from blockdraft.sampling.params import SamplingParams
from blockdraft.sampling.stops import StopCriteria
from conftest import GOLDENS

INTEROP = DEFAULT_DRAFTERS["dflash"]

pytestmark = pytest.mark.slow
GOLDEN = json.loads((GOLDENS / "smollm2_dflash.json").read_text())


@pytest.fixture(scope="module")
def smollm2_fp32():
    return load_target(smollm2_dir(), "float32")


def test_golden_matches_the_shipped_weights():
    assert GOLDEN["digests"]["drafter"] == dir_digest(INTEROP), \
        "smollm2_dflash.json was made from other weights; run scripts/goldens/regen.sh"
    assert GOLDEN["digests"]["target"] == dir_digest(smollm2_dir())


@pytest.mark.parametrize("i", range(len(GOLDEN["cases"])))
def test_shipped_dflash_equals_reference_dflash(smollm2_fp32, i):
    case = GOLDEN["cases"][i]
    drafter = load_drafter(INTEROP, smollm2_fp32)
    gen = generate_one(smollm2_fp32, case["prompt"], SamplingParams(max_tokens=GOLDEN["max_new_tokens"]), drafter,
                       StopCriteria(eos_ids=frozenset(GOLDEN["stop_token_ids"])))
    assert gen.token_ids == case["tokens"]
    assert gen.acceptance_lengths == case["acceptance_lengths"]


@pytest.mark.parametrize("kind", ["dflash", "dspark"])
def test_shipped_drafters_are_published_layouts_and_lossless(smollm2_fp32, kind):
    cfg = json.loads((DEFAULT_DRAFTERS[kind] / "config.json").read_text())
    assert cfg["architectures"] == (["Qwen3DSparkModel"] if kind == "dspark" else ["DFlashDraftModel"])
    assert (DEFAULT_DRAFTERS[kind] / "MODEL_CARD.md").is_file()
    assert (DEFAULT_DRAFTERS[kind] / "model.safetensors").stat().st_size < 40 * 2**20
    drafter = load_drafter(DEFAULT_DRAFTERS[kind], smollm2_fp32)
    prompt = GOLDEN["cases"][1]["prompt"]
    params = SamplingParams(max_tokens=48)
    stop = StopCriteria(eos_ids=frozenset(GOLDEN["stop_token_ids"]))
    spec = generate_one(smollm2_fp32, prompt, params, drafter, stop)
    assert spec.token_ids == generate_one(smollm2_fp32, prompt, params, None, stop).token_ids
    assert spec.mean_acceptance_length > 1.1        # a trained drafter (a random one stays at ~1.0)
