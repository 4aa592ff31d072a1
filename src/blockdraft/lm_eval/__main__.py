"""`python -m blockdraft.lm_eval [lm-eval's flags]`: lm-eval's command line, with `--model blockdraft`
registered first. Every other flag is lm-eval's own, passed on unchanged."""

import sys

from lm_eval.__main__ import cli_evaluate

import blockdraft.lm_eval  # noqa: F401  (registers the model)

if __name__ == "__main__":
    sys.exit(cli_evaluate())
