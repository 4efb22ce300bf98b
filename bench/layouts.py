"""Old tree against new tree, on the same prepared corpora: the host path and cold start.

Not one of `BENCHMARKS`: it compares two source trees (e.g. a `git archive` of
the commit before a change, and the working tree), each in fresh processes
alternating A B A B, so one script gives before/after ratios on a shared
machine. It measures what issue 23 asks of the storage layout:

- `throughput`: non-padding tokens/s of `PlannedBatchDataset[i]` (0 workers,
  rows of 1024, host batch 8, best_fit), median of 5 rounds of 200 batches
  after 130 warm-up batches;
- `cold`: a fresh process's time from its imports to the first batch (source
  built from the config path, lengths, plan, first batch), page cache warm;
- `coldcache`: the same with the corpus's pages evicted first
  (`posix_fadvise(DONTNEED)` on its files only).

    python bench/layouts.py corpus N OUT.parquet      # N lognormal documents (mean 512)
    xlstm-data prepare OUT.parquet --field=tokens --vocab_size=32000 --num_shards=16 \\
        --output=DIR [--layout=array_record]
    python bench/layouts.py compare ROUNDS MODES NAME=TREE:PATH ...   # first is the baseline

`TREE` is put first on PYTHONPATH; `PATH` is what `kind="array_record"`'s
`path` gets (a prepared directory, or a glob for a tree that predates them).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time


def corpus(documents: int, out: str) -> None:
    """A Parquet file of `documents` lognormal token lists (mean 512, ids in [2, 32000))."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    mu = np.log(512.0) - 0.5
    writer = None
    for first in range(0, documents, 50_000):
        rng = np.random.default_rng([7, first])
        count = min(50_000, documents - first)
        lengths = np.clip(rng.lognormal(mu, 1.0, count), 1, 16384).astype(np.int64)
        flat = rng.integers(2, 32000, int(lengths.sum()), dtype=np.int32)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        table = pa.table({"tokens": pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat))})
        writer = writer or pq.ParquetWriter(out, table.schema)
        writer.write_table(table, row_group_size=10_000)
    assert writer is not None
    writer.close()


def measure(mode: str, path: str) -> dict:
    """One fresh process's figure (run by `compare` with the tree on PYTHONPATH)."""
    started = time.perf_counter()
    import numpy as np

    from bench.common import plan_spec
    from xlstm_data.config.data_config import SourceConfig
    from xlstm_data.plan.global_plan import GlobalPlan
    from xlstm_data.reading.planned_batches import PlannedBatchDataset

    imported = time.perf_counter()
    options = (("path", path), ("record_format", "tokens"), ("tokenizer", None))
    source = SourceConfig("corpus", "array_record", 1.0, (*options, ("vocab_size", None))).build()
    spec = plan_spec(["corpus"], {"corpus": 1.0}, 8, 1024, "best_fit")
    dataset = PlannedBatchDataset(GlobalPlan(spec, [source.lengths()]), [source], 0, 1, 1)
    dataset[0]
    first = time.perf_counter()
    if mode != "throughput":
        import resource

        return {
            "to_first_batch": first - imported,
            "with_imports": first - started,
            "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        }

    def tokens(first: int, count: int) -> int:
        return sum(
            int(np.count_nonzero(dataset[i]["fields"][2])) for i in range(first, first + count)
        )

    tokens(1, 129)
    rates = []
    for r in range(5):
        t = time.perf_counter()
        n = tokens(130 + 200 * r, 200)
        rates.append(n / (time.perf_counter() - t) / 1e6)
    return {"mtok_s": statistics.median(rates), "rounds": rates}


def _files(path: str) -> list[str]:
    directory = path.split("*")[0] if "*" in path else path
    directory = directory if os.path.isdir(directory) else os.path.dirname(directory)
    names = (os.path.join(directory, name) for name in os.listdir(directory))
    return [name for name in names if os.path.isfile(name)]


def _evict(path: str) -> None:
    """Drops the corpus's pages from the page cache (its files only)."""
    for file in _files(path):
        fd = os.open(file, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def _warm(path: str) -> None:
    """Reads the corpus once, so throughput rounds measure the warm path."""
    for file in _files(path):
        with open(file, "rb") as f:
            while f.read(1 << 24):
                pass


def compare(rounds: int, modes: list[str], variants: dict[str, tuple[str, str]]) -> None:
    """Prints each variant's median and its per-round ratio to the first variant."""
    names = list(variants)
    key = {"throughput": "mtok_s", "cold": "to_first_batch", "coldcache": "to_first_batch"}
    for mode in modes:
        results: dict[str, list[dict]] = {name: [] for name in names}
        if mode == "throughput":
            for _, path in variants.values():
                _warm(path)
        for r in range(rounds):
            for name in names if r % 2 == 0 else names[::-1]:
                tree, path = variants[name]
                if mode == "coldcache":
                    _evict(path)
                out = subprocess.run(
                    [sys.executable, __file__, "measure", mode, path],
                    env={**os.environ, "PYTHONPATH": tree},
                    cwd=tree,
                    capture_output=True,
                    text=True,
                    check=True,
                )
                results[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
        for name in names:
            values = [x[key[mode]] for x in results[name]]
            pairs = zip(results[names[0]], results[name], strict=True)
            ratios = [b[key[mode]] / a[key[mode]] for a, b in pairs]
            print(
                f"{mode} {name}: median {statistics.median(values):.4g} "
                f"({', '.join(f'{v:.4g}' for v in values)}); /{names[0]} per round: median "
                f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})",
                flush=True,
            )


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    if command == "corpus":
        corpus(int(float(args[0])), args[1])
    elif command == "measure":
        print(json.dumps(measure(args[0], args[1])))
    else:
        pairs = dict(arg.split("=", 1) for arg in args[2:])
        compare(
            int(args[0]), args[1].split(","), {k: tuple(v.split(":", 1)) for k, v in pairs.items()}
        )
