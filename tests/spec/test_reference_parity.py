"""Drafts, tokens and per-step acceptance lengths equal the reference implementations.

Goldens come from `dflash` (torch; `dflash_generate`) and `dspark-mlx` (MLX;
`generate_eager`) run on the same shipped tiny weights, each in its own venv
(scripts/goldens/regen.sh).
"""

import pytest
import torch

from blockdraft.decode import generate_one
from blockdraft.loading import load_drafter
from blockdraft.sampling.params import SamplingParams
from blockdraft.sampling.stops import StopCriteria
from blockdraft.spec.propose import markov_chain, propose
from conftest import ASSETS, load_golden

DFLASH = load_golden("dflash.json")
DSPARK = load_golden("dspark.json")


def _first_block_hidden(target, drafter, prompt):
    with torch.no_grad():
        out = target(torch.tensor([prompt]), tap_layers=drafter.config.target_layer_ids)
        anchor = int(out.logits[0, -1].argmax())
        cache = drafter.new_cache()
        drafter.extend_context(out.taps, cache)
        return anchor, cache, drafter.block_hidden(torch.tensor([anchor]), drafter.config.block_size, cache)


@pytest.mark.parametrize("case", DFLASH["blocks"], ids=lambda c: c["drafter"])
def test_dflash_first_block_drafts(target, drafters, case):
    drafter = drafters[case["drafter"]]
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


def test_dspark_first_block_chain_and_confidence(target, drafters):
    case = DSPARK["blocks"][0]
    drafter = drafters["dspark"]
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
                         ids=lambda c: f"p{len(c['prompt'])}-t{c['threshold']}" + ("-eos" if "eos" in c else ""))
def test_dspark_generate_tokens_and_acceptance(target, drafters, case):
    stop = StopCriteria(eos_ids=frozenset([case["eos"]] if "eos" in case else ()))
    gen = generate_one(target, case["prompt"], SamplingParams(max_tokens=DSPARK["max_new_tokens"]),
                       drafters["dspark"], stop, confidence_threshold=case["threshold"])
    assert gen.token_ids == case["tokens"]
    assert gen.acceptance_lengths == case["acceptance_lengths"]
