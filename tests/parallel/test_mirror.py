"""`MirroredEngine` keeps every rank's engine in step: each command that changes rank 0's engine reaches the
others (here a second, unsharded engine stands in for rank 1, and the broadcast is a direct call), and a
command it does not mirror is an error, never a change to rank 0 alone."""

import pytest

from blockdraft.llm import LLM
from blockdraft.parallel import mirror
from blockdraft.sampling.params import SamplingParams
from conftest import ASSETS, random_prompts


@pytest.fixture
def ranks(monkeypatch):
    """(rank 0's mirrored engine, rank 1's engine), joined by an in-process broadcast."""
    def engine():
        return LLM(target=ASSETS / "target-qwen3", drafter=ASSETS / "dspark", dtype="float32", max_batch=4,
                   adaptive_speculation=False).engine

    follower = engine()

    def broadcast(commands):                 # rank 1's `follow` loop, one turn per broadcast
        if commands is not None:
            mirror.apply(follower, commands)
            follower.step()
        return commands

    monkeypatch.setattr(mirror, "_broadcast", broadcast)
    return mirror.MirroredEngine(engine(), tp=None), follower


def _state(engine) -> tuple:
    s = engine.scheduler
    return ([q.request_id for q in s.running], [q.request_id for q in s.waiting], engine.blocks.num_free,
            {rid: list(q.generated) for rid, q in engine.seqs.items()})


def test_abort_all_reaches_every_rank_and_the_next_request_runs_in_step(ranks):
    leader, follower = ranks
    for prompt in random_prompts(3, seed=3):
        leader.add_request(prompt, SamplingParams(max_tokens=24, ignore_eos=True))
    leader.step()
    leader.step()
    assert leader.has_unfinished()
    leader.abort_all("error")                # what the server's driver does after a failed step
    leader.add_request([5, 6, 7], SamplingParams(max_tokens=8, ignore_eos=True))
    leader.step()
    assert _state(leader._engine) == _state(follower)
    assert follower.seqs.keys() == leader._engine.seqs.keys()


def test_unmirrored_commands_are_refused_not_run_on_rank_0_alone(ranks):
    leader, follower = ranks
    rid = leader.add_request([5, 6, 7], SamplingParams(max_tokens=8, ignore_eos=True))
    for name in ("runner", "scheduler", "_run", "policy"):
        with pytest.raises(AttributeError, match="not mirrored"):
            getattr(leader, name)
    with pytest.raises(AttributeError, match="not mirrored"):
        leader.eos_ids = frozenset({1})
    assert leader.has_unfinished() and rid in leader.seqs and leader.stats.steps == 0
    tokens = [t for chunk in leader.stream(rid) for t in chunk]     # stream steps through the mirror
    assert len(tokens) == 8 and _state(leader._engine) == _state(follower)
