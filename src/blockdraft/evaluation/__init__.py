"""Evaluating a drafter before deploying it: the same prompts with and without drafting, scored
(`run.py`, `sets.py`, `sandbox.py` for HumanEval's code), compared with exact statistics
(`stats.py`), and acceptance lengths held against a versioned reference file (`gate.py`).
Nothing here knows about model internals: it drives the batch engine like `generate` does."""
