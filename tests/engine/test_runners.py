"""The engine's backends share one explicit interface (`engine/runner.py: StepRunner`)."""

import pytest

from blockdraft.engine.onnx_runner import OnnxRunner
from blockdraft.engine.runner import ModelRunner, StepRunner
from blockdraft.layers import cpu_kernels as kernels


def test_both_backends_satisfy_the_step_interface_and_neither_borrows_the_other():
    assert issubclass(ModelRunner, StepRunner) and issubclass(OnnxRunner, StepRunner)
    assert not issubclass(OnnxRunner, ModelRunner)          # no half-built torch runner under the ONNX one
    assert OnnxRunner.run is StepRunner.run is ModelRunner.run   # one step body
    for name in ("prefill", "decode"):
        assert getattr(StepRunner, name).__isabstractmethod__
    with pytest.raises(TypeError, match="abstract"):
        StepRunner()


def test_a_backend_missing_a_model_half_cannot_be_built():
    class PrefillOnly(StepRunner):
        def prefill(self, seqs, counts):
            return []

    with pytest.raises(TypeError, match="decode"):
        PrefillOnly()


@pytest.mark.skipif(not kernels.available(), reason="no C compiler: the layers run unfused")
def test_a_lone_plain_decoding_row_takes_the_address_pass_with_the_same_tokens():
    """The default model in int4, one request: every decode step without drafts runs `TargetModel.fused_row`,
    and the tokens equal those of the paged batch step it stands in for (and of a drafting engine)."""
    import blockdraft
    from blockdraft.models.target import TargetModel

    params = blockdraft.SamplingParams(max_tokens=40, ignore_eos=True)
    llm = blockdraft.LLM(drafter="none", quantization="int4", max_batch=1)
    prompt = llm.encode("Write a haiku about rivers.", chat=True)
    served, row = [], TargetModel.fused_row

    def counted(self, *args):
        served.append(row(self, *args))
        return served[-1]

    TargetModel.fused_row = counted
    try:
        by_row = llm.generate(prompt_token_ids=[prompt], sampling_params=params)[0].token_ids
    finally:
        TargetModel.fused_row = row
    assert len(served) == 39 and all(out is not None for out in served)
    llm.engine.runner._row_pass = lambda seq: None
    assert llm.generate(prompt_token_ids=[prompt], sampling_params=params)[0].token_ids == by_row
    spec = blockdraft.LLM(drafter="dspark", quantization="int4", max_batch=1, adaptive_speculation=False)
    assert spec.generate(prompt_token_ids=[prompt], sampling_params=params)[0].token_ids == by_row
