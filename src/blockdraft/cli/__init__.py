"""`blockdraft` command line: one module per command, each with `add_parser(sub)` and `run(args)`.

Commands parse flags and call one library function; user errors (BlockdraftError) print one red line on
stderr and exit 2; `--debug` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import sys

from . import bench, convert, evaluate, export, generate, serve, train
from .args import HelpFormatter

COMMANDS = (generate, serve, convert, train, export, bench, evaluate)      # in `blockdraft --help`'s order


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__

    parser = argparse.ArgumentParser(prog="blockdraft", description="Lossless speculative decoding with block "
                                     "drafters (DFlash, DFlash2, DSpark).", formatter_class=HelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}",
                        help="print the version and exit")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                help="generate, serve, convert, train, export, bench or eval (COMMAND --help for its flags)")
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def _progress_handler():
    """Loading stages (`blockdraft.*` INFO lines) on stderr when it is a terminal; warnings always.
    stdout stays what the command prints (pure JSON with --json)."""
    import logging

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    handler.setLevel(logging.INFO if sys.stderr.isatty() else logging.WARNING)
    logger = logging.getLogger("blockdraft")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    return handler


def main(argv: list[str] | None = None) -> int:
    import logging

    from ..errors import BlockdraftError

    parser = build_parser()
    args = parser.parse_args(argv)
    handler = _progress_handler()
    try:
        return args.func(args)
    except BlockdraftError as e:
        if args.debug:
            raise
        red = "\033[31m" if sys.stderr.isatty() else ""
        reset = "\033[0m" if red else ""
        print(f"{red}error: {e}{reset}", file=sys.stderr)
        return 2
    finally:
        logging.getLogger("blockdraft").removeHandler(handler)
