"""Drafts, tokens and per-step acceptance lengths equal the reference implementations.

Goldens come from `dflash` (torch; `dflash_generate`) and `dspark-mlx` (MLX;
`generate_eager`) run on the same shipped tiny weights, each in its own venv
(scripts/goldens/regen.sh). The `-last` fixtures tap the target's last layer, where the
tap points differ: dspark-mlx hooks layer outputs (before the final norm), dflash reads HF
hidden_states (after it); both must be matched through every surface.
"""

import functools
import json

import pytest
import torch

from decode_oracle import generate_one, propose
from blockdraft.loading import load_drafter
from blockdraft.sampling.params import SamplingParams
from blockdraft.sampling.stops import StopCriteria
from blockdraft.drafters.dspark import markov_chain
from blockdraft.cli import main
from conftest import ASSETS, load_golden

DFLASH = load_golden("dflash.json")
DSPARK = load_golden("dspark.json")


@functools.cache
def _drafter(name: str):
    from blockdraft.loading import load_target

    return load_drafter(ASSETS / name, load_target(ASSETS / "target-qwen3"))


def _first_block_hidden(target, drafter, prompt):
    with torch.no_grad():
        out = target(torch.tensor([prompt]), tap_layers=drafter.config.taps)
        anchor = int(out.logits[0, -1].argmax())
        cache = drafter.new_cache()
        drafter.extend_context(out.taps, cache)
        return anchor, cache, drafter.block_hidden(torch.tensor([anchor]), drafter.config.block_size, cache)


@pytest.mark.parametrize("case", DFLASH["blocks"], ids=lambda c: c["drafter"])
def test_dflash_first_block_drafts(target, case):
    drafter = _drafter(case["drafter"])
    anchor, cache, hidden = _first_block_hidden(target, drafter, case["prompt"])
    assert anchor == case["anchor"]
    logits = drafter.logits(hidden[:, 1:])[0]
    assert (logits - torch.tensor(case["draft_logits"])).abs().max().item() <= 1e-4
    proposal = propose(drafter, torch.tensor([anchor]), cache, drafter.config.num_draft_tokens,
                       SamplingParams(), None)
    assert proposal.tokens[0].tolist() == case["drafts"]


@pytest.mark.parametrize("case", DFLASH["cases"],
                         ids=lambda c: f"{c['drafter']}-b{c['block_size']}-p{len(c['prompt'])}"
                         + ("-stop" if "stop_token_ids" in c else ""))
def test_dflash_generate_tokens_and_acceptance(target, case):
    drafter = load_drafter(ASSETS / case["drafter"], target, block_size=case["block_size"])
    stop = StopCriteria(eos_ids=frozenset(case.get("stop_token_ids", ())))
    gen = generate_one(target, case["prompt"], SamplingParams(max_tokens=DFLASH["max_new_tokens"]), drafter, stop)
    assert gen.token_ids == case["tokens"]
    assert gen.acceptance_lengths == case["acceptance_lengths"]
    assert sum(gen.acceptance_lengths) == len(gen.token_ids) - 1


@pytest.mark.parametrize("case", DSPARK["blocks"], ids=lambda c: c.get("drafter", "dspark"))
def test_dspark_first_block_chain_and_confidence(target, case):
    drafter = _drafter(case.get("drafter", "dspark"))
    anchor, _, hidden = _first_block_hidden(target, drafter, case["prompt"])
    assert anchor == case["anchor"]
    logits = drafter.logits(hidden)
    tokens, _, embeds = markov_chain(logits, torch.tensor([anchor]), drafter.markov_head, SamplingParams(), None)
    assert tokens[0].tolist() == case["drafts"]
    prevs = [anchor] + tokens[0, :-1].tolist()
    bias = torch.cat([drafter.markov_head(torch.tensor([p]))[0] for p in prevs])          # [n, vocab]
    assert (logits[0].float() + bias - torch.tensor(case["biased_logits"])).abs().max().item() <= 1e-4
    conf = drafter.confidence_head(hidden, embeds)
    assert (conf - torch.tensor([case["confidence_logits"]])).abs().max().item() <= 1e-4


@pytest.mark.parametrize("case", DSPARK["cases"],
                         ids=lambda c: f"{c['drafter']}-p{len(c['prompt'])}-t{c['threshold']}"
                         + ("-eos" if "eos" in c else ""))
def test_dspark_generate_tokens_and_acceptance(target, case):
    stop = StopCriteria(eos_ids=frozenset([case["eos"]] if "eos" in case else ()))
    gen = generate_one(target, case["prompt"], SamplingParams(max_tokens=DSPARK["max_new_tokens"]),
                       _drafter(case["drafter"]), stop, confidence_threshold=case["threshold"])
    assert gen.token_ids == case["tokens"]
    assert gen.acceptance_lengths == case["acceptance_lengths"]


LAST_LAYER = [(DSPARK, c) for c in DSPARK["cases"] if c["drafter"] == "dspark-last"] + \
             [(DFLASH, c) for c in DFLASH["cases"] if c["drafter"] == "dflash-last" and "stop_token_ids" not in c]


def test_last_layer_goldens_exist_and_accept():
    """The goldens that can see the tap point: present, and not vacuous (drafts get accepted)."""
    for name in ("dspark-last", "dflash-last"):
        lengths = [a for _, c in LAST_LAYER if c["drafter"] == name for a in c["acceptance_lengths"]]
        assert lengths and max(lengths) > 1, name


def test_last_layer_through_the_python_api():
    import blockdraft

    for name in ("dspark-last", "dflash-last"):
        cases = [(g, c) for g, c in LAST_LAYER if c["drafter"] == name]
        llm = blockdraft.LLM(target=ASSETS / "target-qwen3", drafter=ASSETS / name, max_batch=4, dtype="float32",
                             adaptive_speculation=False)      # the goldens are fp32 runs
        outs = llm.generate(prompt_token_ids=[c["prompt"] for _, c in cases],
                            sampling_params=SamplingParams(max_tokens=cases[0][0]["max_new_tokens"], ignore_eos=True))
        assert [o.token_ids for o in outs] == [c["tokens"] for _, c in cases]
        assert [o.acceptance_lengths for o in outs] == [c["acceptance_lengths"] for _, c in cases]


@pytest.mark.parametrize("name", ["dspark-last", "dflash-last"])
def test_last_layer_through_the_cli(capsys, name):
    golden, case = next((g, c) for g, c in LAST_LAYER if c["drafter"] == name)
    assert main(["generate", "--target", str(ASSETS / "target-qwen3"), "--drafter", str(ASSETS / name),
                 "--prompt-ids", ",".join(map(str, case["prompt"])), "--max-new-tokens",
                 str(golden["max_new_tokens"]), "--ignore-eos", "--json", "--no-adaptive-speculation",
                 "--dtype", "float32"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["token_ids"] == case["tokens"] and out["acceptance_lengths"] == case["acceptance_lengths"]
