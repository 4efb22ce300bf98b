"""`python -m bench.peers [--tiny] [--rounds N] [--docs N] [--out DIR] [--cold_10m] [--profile]`.

`--cold_100m` adds the 10^8-document cold start (ours alone).

Compares our train iterator with Megatron-core, OLMo-core and
mosaicml-streaming on the same documents (see `bench/peers/__init__.py`),
writes `<out>/peers.json` (default `bench/results/`, or
`bench/results/tiny/` with `--tiny`) and prints the ratio table. The peers
run in `.venv-peers` (`make bench-peers`); a peer that is not installed is
reported as missing and the others still run.
"""

from __future__ import annotations

import argparse
import logging as std_logging
import pstats
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from absl import logging

from bench import common
from bench.peers import corpus, harness

RESULTS_DIR = Path(__file__).resolve().parents[1] / "results"
NAME = "peers"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.peers", description=__doc__)
    parser.add_argument(
        "--tiny", action="store_true", help="smoke-test sizes (figures mean nothing)"
    )
    parser.add_argument("--rounds", type=int, default=None, help="rounds per group (default 5)")
    parser.add_argument(
        "--docs", type=int, default=None, help="documents of the corpus (default 100000)"
    )
    parser.add_argument("--out", default=None, help="results directory")
    parser.add_argument(
        "--cold_10m", action="store_true", help="add the 10^7-document cold start (slow)"
    )
    parser.add_argument(
        "--cold_100m",
        action="store_true",
        help="add the 10^8-document cold start, ours alone against its absolute bounds (slow)",
    )
    parser.add_argument(
        "--groups",
        default="w0,mixture,w2,target6,cold_start,prepare",
        help="comma-separated groups to run (w0, mixture, w2, target6, cold_start, prepare)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also cProfile our 0-worker best_fit host pipeline once",
    )
    parser.add_argument("--verbose", action="store_true", help="log every round")
    args = parser.parse_args(argv)
    if args.rounds is not None and args.rounds < 1:
        parser.error(f"--rounds={args.rounds}: give 1 or more")
    if args.docs is not None and args.docs < 100:
        parser.error(f"--docs={args.docs}: give at least 100")
    return args


def profile_ours(settings: harness.Settings, out_dir: Path, top: int = 25) -> dict[str, Any]:
    """cProfile of our 0-worker best_fit host pipeline (one run; the runner dumps the stats).

    The host pipeline runs in the profiled thread: in the whole iterator it
    runs in a prefetch thread, which cProfile does not see (the main thread
    would show only its waits).
    """
    web = settings.specs()["web"]
    path = out_dir / "peers_ours_w0.prof"
    task = {
        "task": "throughput",
        "sources": {"web": {"dir": str(corpus.write_ours(web))}},
        "packing": "best_fit",
        "path": "host",
        "warmup": settings.warmup,
        "timed": settings.timed,
        "seq_len": settings.seq_len,
        "batch_size": settings.batch_size,
        "profile": str(path),
    }
    result = harness.run_runner("ours", task)
    stats = pstats.Stats(str(path))
    total = stats.total_tt
    rows = []
    for (filename, line, function), (_, calls, tottime, cumtime, _) in sorted(
        stats.stats.items(), key=lambda item: item[1][2], reverse=True
    )[:top]:
        rows.append(
            {
                "function": f"{Path(filename).name}:{line}({function})",
                "calls": calls,
                "tottime_secs": tottime,
                "cumtime_secs": cumtime,
                "share_of_total": tottime / total if total else 0.0,
            }
        )
    return {"run": result, "file": path.name, "total_secs": total, "top_by_tottime": rows}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    logging.set_verbosity(logging.INFO if args.verbose else logging.WARNING)
    std_logging.getLogger("absl").setLevel(
        std_logging.INFO if args.verbose else std_logging.WARNING
    )
    settings = harness.Settings.create(
        tiny=args.tiny,
        rounds=args.rounds,
        docs=args.docs,
        cold_10m=args.cold_10m,
        cold_100m=args.cold_100m,
    )
    out_dir = Path(args.out or (RESULTS_DIR / "tiny" if args.tiny else RESULTS_DIR)).resolve()
    config = common.BenchConfig(
        out_dir=out_dir, tiny=args.tiny, command=" ".join(["python -m bench.peers", *argv])
    )
    groups = [g for g in args.groups.split(",") if g]
    started = time.perf_counter()
    print(f"bench peers ({config.mode}): {settings}", flush=True)
    result = harness.measure(settings, groups=groups)
    if args.profile:
        out_dir.mkdir(parents=True, exist_ok=True)
        result["profile"] = profile_ours(settings, out_dir)
    payload = {
        "settings": {
            **{k: v for k, v in vars(settings).items()},
            "groups": groups,
            "ours_measured": (
                "the train iterator of xlstm_data.iterators_from_config (global jax.Arrays on "
                "one CPU device, each batch waited for); ours_best_fit_host: its host pipeline"
            ),
            "peers_python": str(harness.peers_python()),
            "corpus_cache": str(corpus.root_dir()),
            "scratch": tempfile.gettempdir(),
        },
        **result,
    }
    written = common.write_result(config, NAME, payload, started)
    print()
    print(
        common.format_table(
            harness.summary_rows(written), ("figure", "median (min-max)", "target", "met")
        )
    )
    if written["failures"]:
        print(
            f"\n{len(written['failures'])} runs failed (see failures in the JSON)", file=sys.stderr
        )
    print(f"\nwrote {out_dir / NAME}.json ({written['duration_secs']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
