"""The `xlstm-data` command line: prepare, inspect and bench.

`prepare` tokenizes raw text, JSONL or token arrays into ArrayRecord shards
with an index; `inspect` prints what a config will do before a long run is
launched; `bench` runs the benchmarks in `bench/`. User errors print one
line naming the bad argument or file and exit with status 2.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Sequence
from typing import Any

from xlstm_data.errors import DataConfigError, DataReadError


def _prepare(args: argparse.Namespace) -> int:
    from xlstm_data.prepare import prepare_corpus

    def progress(done: int, total: int, shard: dict[str, Any]) -> None:
        width = 30
        filled = int(width * done / total)
        print(
            f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} shards "
            f"(last: {shard['documents']:,} documents, {shard['tokens']:,} tokens)",
            end="" if done < total else "\n",
            file=sys.stderr,
            flush=True,
        )

    index = prepare_corpus(
        args.inputs,
        args.output,
        input_format=args.format,
        field=args.field,
        unit=args.unit,
        tokenizer=args.tokenizer,
        workers=args.workers,
        progress=progress,
    )
    print(
        f"prepared {index['documents']:,} documents, {index['tokens']:,} tokens in "
        f"{len(index['shards'])} shards: {args.output}/*.array_record "
        f"(use kind='array_record', path='{args.output}/*.array_record')"
    )
    return 0


def _inspect(args: argparse.Namespace) -> int:
    import jax

    from xlstm_data.inspect_config import inspect_config, load_config, smallest_device_count

    # A CPU-only machine plans the mesh on as many CPU devices as its fixed axes need.
    devices = args.cpu_devices or smallest_device_count(load_config(args.config, args.override))
    with contextlib.suppress(RuntimeError):  # JAX already started: keep its devices
        jax.config.update("jax_num_cpu_devices", devices)

    inspect_config(
        args.config,
        png=args.png,
        overrides=args.override,
        plot_steps=args.steps,
        out=sys.stdout,
    )
    return 0


def _bench(args: argparse.Namespace) -> int:
    try:
        from bench.run import main as bench_main
    except ImportError as error:
        print(f"xlstm-data bench: the bench package is not installed ({error})", file=sys.stderr)
        return 2
    return bench_main(args.bench_args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="xlstm-data", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    prepare = sub.add_parser("prepare", help="tokenize text/JSONL/token arrays into shards")
    prepare.add_argument("inputs", nargs="+", help="input files or globs")
    prepare.add_argument("--output", required=True, help="output directory")
    prepare.add_argument(
        "--format", default="auto", help="auto (by suffix), text, jsonl or tokens (.npy/.npz)"
    )
    prepare.add_argument("--field", default="text", help="JSONL key holding the text")
    prepare.add_argument("--unit", default="line", help="text documents: line or file")
    prepare.add_argument("--tokenizer", default="byte", help="byte, or a HF tokenizer .json")
    prepare.add_argument("--workers", type=int, default=1, help="input files in parallel")
    prepare.set_defaults(run=_prepare)

    inspect = sub.add_parser("inspect", help="print the data plan of a config")
    inspect.add_argument("--config", required=True, help="a configs/*.py file")
    inspect.add_argument("--png", default=None, help="write the plan's plot here")
    inspect.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config value, e.g. data.global_batch_size=32 (repeatable)",
    )
    inspect.add_argument(
        "--steps", type=int, default=None, help="steps of the real pipeline to plot"
    )
    inspect.add_argument(
        "--cpu_devices",
        type=int,
        default=None,
        help="CPU devices to plan the mesh with (default: what the mesh's fixed axes need)",
    )
    inspect.set_defaults(run=_inspect)

    bench = sub.add_parser("bench", help="run the benchmarks in bench/")
    bench.add_argument("bench_args", nargs=argparse.REMAINDER, help="passed to bench.run")
    bench.set_defaults(run=_bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `xlstm-data` console script."""
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except (DataConfigError, DataReadError) as error:
        print(f"xlstm-data {args.command}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
