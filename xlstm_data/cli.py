"""The `xlstm-data` command line: prepare, inspect and bench.

Only the command skeleton exists so far; each subcommand says so plainly
instead of pretending to work.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

_PLANNED = {
    "prepare": "tokenize text/JSONL into ArrayRecord shards",
    "inspect": "print the data plan of a config",
    "bench": "run the benchmarks in bench/",
}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `xlstm-data` console script."""
    parser = argparse.ArgumentParser(prog="xlstm-data", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_text in _PLANNED.items():
        sub.add_parser(name, help=help_text)
    args = parser.parse_args(argv)
    print(f"xlstm-data {args.command}: not implemented yet", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
