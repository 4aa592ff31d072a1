#!/usr/bin/env bash
# One short run on a CUDA machine (a few minutes): the GPU lossless tests, then the default model's
# batch-1 and batch-8 speed ratios (speculative vs plain, same numerics) through the engine.
#   scripts/gpu_check.sh [OUT_DIR]      (run from an installed checkout: pip install -e ".[test,bench]")
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-gpu-check}"
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$OUT/gpu.txt"
python -m pytest -q tests/test_device.py 2>&1 | tee "$OUT/pytest.txt"
blockdraft bench --device cuda --dtype bfloat16 --quantization none --sets chat,math --prompts 4 \
    --max-new-tokens 64 --repeats 2 --temperatures 0 --batch-sizes 1,8 --no-hf --out "$OUT/bench" 2>&1 | tail -40
