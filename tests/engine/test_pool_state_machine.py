"""Stateful test: any interleaving of add / step / abort leaves every block free at the end."""

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from blockdraft.engine.engine import EngineConfig, LLMEngine
from blockdraft.llm import TINY_ASSETS as ASSETS
from blockdraft.loading import load_drafter, load_target
from blockdraft.sampling.params import SamplingParams

TARGET = load_target(ASSETS / "target-qwen3")
DRAFTER = load_drafter(ASSETS / "dspark", TARGET)


class EngineMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        cfg = EngineConfig(max_batch=4, cache_budget_bytes=200_000, page_size=8, max_model_len=64,
                           prefill_chunk=8)
        self.engine = LLMEngine(TARGET, DRAFTER, cfg)
        self.ids: list[str] = []

    @rule(prompt=st.lists(st.integers(0, 123), min_size=1, max_size=30), max_tokens=st.integers(1, 30),
          temperature=st.sampled_from([0.0, 1.0]))
    def add(self, prompt, max_tokens, temperature):
        self.ids.append(self.engine.add_request(prompt, SamplingParams(max_tokens=max_tokens,
                                                                       temperature=temperature, seed=1)))

    @rule()
    def step(self):
        self.engine.step()

    @precondition(lambda self: self.ids)
    @rule(data=st.data())
    def abort(self, data):
        self.engine.abort(data.draw(st.sampled_from(self.ids)))

    @invariant()
    def blocks_are_accounted_for(self):
        bm = self.engine.blocks
        held = {}
        for seq in self.engine.scheduler.running:
            for b in seq.block_table:
                held[b] = held.get(b, 0) + 1
        for seq in self.engine.scheduler.waiting:
            assert not seq.block_table, "a waiting sequence holds blocks"
        assert all(bm.ref[b] == n for b, n in held.items())
        assert bm.num_free == sum(1 for r in bm.ref if r == 0)
        assert set(bm.free) == {b for b, r in enumerate(bm.ref) if r == 0}

    def teardown(self):
        while self.engine.has_unfinished():
            self.engine.step()
        assert self.engine.blocks.num_free == self.engine.plan.num_blocks
        assert all(r == 0 for r in self.engine.blocks.ref)


EngineMachine.TestCase.settings = settings(max_examples=25, stateful_step_count=30, deadline=None)
TestEngineMachine = EngineMachine.TestCase
