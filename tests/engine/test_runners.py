"""The engine's backends share one explicit interface (`engine/runner.py: StepRunner`)."""

import pytest

from blockdraft.engine.onnx_runner import OnnxRunner
from blockdraft.engine.runner import ModelRunner, StepRunner


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
