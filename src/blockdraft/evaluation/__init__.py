"""Evaluating a drafter before deploying it: the same prompts with and without drafting, scored
(`run.py`, `sets.py`, `sandbox.py` for HumanEval's code; `lm_eval_task.py` for any lm-eval task),
compared with exact statistics (`stats.py`), and acceptance lengths held against a versioned
reference file (`gate.py`); `evaluate.py` ties them together for `blockdraft eval`. Nothing here
knows about model internals: it drives the batch engine like `generate` does."""
