"""Pure nn.Modules: the target shell (`target.py`) over a family's layers, the block drafters
(`drafter.py`), and the family registry.

`registry.py` maps a Hugging Face architecture name or `model_type` to a `Family` (`family.py`); each
family's file under `families/` (llama with qwen3, qwen3_5, lfm2, gpt_oss, gemma4) holds its config
resolver, tensor names, layer constructor and capabilities. Layer modules: `decoder.py` (the Llama-style
layer), `qwen3_5.py`, `lfm2.py`, `gemma4.py`; `kv_cache.py`: the step-view interface and contiguous cache.
"""
