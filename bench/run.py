"""Runs the benchmarks and prints a summary table.

    python -m bench.run [names...] [--tiny] [--out DIR]

Names are any of throughput, packing, resume, loop_wait, memory (default:
all). `--tiny` runs smoke-test sizes in seconds (the figures mean nothing);
results go to `--out` (default `bench/results/`, or `bench/results/tiny/`
with `--tiny`, so a smoke run never overwrites the full figures).
"""

from __future__ import annotations

import argparse
import importlib
import sys
import traceback
from pathlib import Path

from absl import logging

from bench import BENCHMARKS, common

#: Default results directory (next to this file).
RESULTS_DIR = Path(__file__).resolve().parent / "results"


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="xlstm-data bench", description="Run the xlstm-data benchmarks."
    )
    parser.add_argument(
        "names", nargs="*", metavar="NAME", help=f"benchmarks to run: {', '.join(BENCHMARKS)}"
    )
    parser.add_argument("--tiny", action="store_true", help="smoke-test sizes (seconds)")
    parser.add_argument("--out", type=Path, default=None, help="results directory")
    parser.add_argument("--verbose", action="store_true", help="keep INFO logs")
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark(s) {unknown}; choose from {list(BENCHMARKS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    """Runs the named benchmarks (default all); returns 0, or 1 if one failed.

    Missed targets do not fail the run: they are figures, recorded in each
    JSON with `met: false` and shown in the table.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parse(argv)
    names = list(dict.fromkeys(args.names)) or list(BENCHMARKS)
    out = args.out or (RESULTS_DIR / "tiny" if args.tiny else RESULTS_DIR)
    common.ensure_flags_parsed()
    if not args.verbose:
        logging.set_verbosity(logging.WARNING)
    config = common.BenchConfig(
        out_dir=Path(out).resolve(), tiny=args.tiny, command=common.python_command(argv)
    )
    rows, failed = [], []
    for name in names:
        module = importlib.import_module(f"bench.{name}")
        print(f"running {name} ({config.mode}) ...", flush=True)
        try:
            result = module.run(config)
        except Exception:  # noqa: BLE001 - report and go on with the others
            traceback.print_exc()
            failed.append(name)
            rows.append((name, "FAILED", "see traceback", "", ""))
            continue
        for figure, value, goal, met in module.summary(result):
            rows.append((name, figure, value, goal, met))
        print(f"  {name}: {result['duration_secs']:.0f} s -> {config.out_dir / name}.json")
    print()
    print(common.format_table(rows, ("benchmark", "figure", "value", "target", "met")))
    if failed:
        print(f"\nfailed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
