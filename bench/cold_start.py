"""Cold start: from building the planned iterator to its first batch, as the corpus grows.

Issue 14, target 3: for a corpus of 10^5 .. 10^8 documents, the time from
opening the lengths index and building the `PlannedDataIterator` to the
first batch is < 5 s, and the process stays under 1 GB resident.

The corpus is lengths-only: a synthetic lengths index (lognormal, mean 512
tokens, int32 `.npy`, written once into the bench cache and memory-mapped) and
an ArrayRecord file holding only the documents the first batch reads (found
by planning that batch once beforehand, outside the timed span). Its source
(`SparseSource`) answers `lengths()` with the memory map and reads those
documents from the small file: the iterator sees a source of N documents.

Each size is measured in a fresh Python process (so resident memory is that
size's alone): imports first, then the timed span, then the peak resident set
(`ru_maxrss`) and the resident set before the span. Tiny mode measures one
small size in this process.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, SupportsIndex

import numpy as np

from bench import common

NAME = "cold_start"
SIZES = (10**5, 10**6, 10**7, 10**8)
SIZES_TINY = (10**4,)
REPEATS, REPEATS_TINY = 3, 1
ROW_LENGTH, BATCH_SIZE, EOD = 1024, 8, 1
MEAN_LENGTH, SIGMA, MAX_LENGTH, VOCAB = 512.0, 1.0, 16384, 32000
TARGET_SECS, TARGET_RSS_MB = 5.0, 1024.0
#: Lengths are generated and written in chunks of this many documents.
CHUNK = 1 << 22


def lengths_index(documents: int) -> Path:
    """The cached lengths index of `documents` documents (written once, atomically)."""
    path = common.cache_dir() / f"lengths-lognormal-{documents}.npy"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        staging = path.with_name(f".{path.name}.{os.getpid()}")
        out = np.lib.format.open_memmap(staging, mode="w+", dtype=np.int32, shape=(documents,))
        mu = np.log(MEAN_LENGTH) - SIGMA**2 / 2
        for first in range(0, documents, CHUNK):
            rng = np.random.default_rng([7, first])
            count = min(CHUNK, documents - first)
            drawn = rng.lognormal(mu, SIGMA, count)
            out[first : first + count] = np.clip(drawn, 1, MAX_LENGTH).astype(np.int32)
        out.flush()
        del out
        os.replace(staging, path)
    return path


def _tokens(document: int, length: int) -> np.ndarray:
    return np.random.default_rng([11, document]).integers(2, VOCAB, length, dtype=np.int32)


class SparseSource:
    """N documents of which only some are stored: lengths from the index, tokens from a file.

    Args:
      lengths: The memory-mapped lengths index (N entries).
      documents: Sorted indices of the documents stored.
      path: ArrayRecord file of those documents, in that order.
    """

    def __init__(self, lengths: np.ndarray, documents: np.ndarray, path: str):
        from xlstm_data.sources import ArrayRecordSource

        self._lengths = lengths
        self._documents = documents
        self._file = ArrayRecordSource(path, vocab_size=VOCAB)

    def __len__(self) -> int:
        return len(self._lengths)

    def lengths(self) -> np.ndarray:
        return self._lengths

    def _records(self, indices: np.ndarray) -> np.ndarray:
        records = np.searchsorted(self._documents, indices)
        if np.any(records >= len(self._documents)) or np.any(
            self._documents[np.minimum(records, len(self._documents) - 1)] != indices
        ):
            raise KeyError(f"a document outside the stored ones was read ({indices[:5]} ...)")
        return records

    def read_many(self, indices: Sequence[SupportsIndex] | np.ndarray) -> list[np.ndarray]:
        return self._file.read_many(self._records(np.asarray(indices, dtype=np.int64)))

    def __getitem__(self, index: SupportsIndex) -> dict[str, np.ndarray]:
        return {"tokens": self.read_many([index])[0]}


def _plan(lengths: np.ndarray) -> Any:
    from xlstm_data.plan.global_plan import GlobalPlan

    spec = common.plan_spec(("web",), {"web": 1.0}, BATCH_SIZE, ROW_LENGTH)
    return GlobalPlan(spec, [lengths])


def first_batch_file(documents: int) -> tuple[Path, np.ndarray]:
    """The ArrayRecord file of the documents the first batch reads, and their indices.

    The first batch is a chunk of its own, and the prefetch thread goes on
    with the next chunk (`chunk_steps` steps) before the iterator is
    closed, so the documents of those steps are stored too.
    """
    from xlstm_data.plan.global_plan import HostPlanner
    from xlstm_data.reading.planned_batches import chunk_steps
    from xlstm_data.sources import write_array_record

    index = lengths_index(documents)
    lengths = np.load(index, mmap_mode="r")
    planner = HostPlanner(_plan(lengths), 0, 1)
    steps = 1 + chunk_steps(ROW_LENGTH, BATCH_SIZE)
    wanted = np.unique(np.concatenate([planner.pieces_at(step).document for step in range(steps)]))
    path = index.with_name(f"first-{steps}-steps-{documents}.array_record")
    if not path.exists():
        staging = path.with_name(f".{path.name}.{os.getpid()}")
        write_array_record(staging, (_tokens(int(d), int(lengths[d])) for d in wanted))
        os.replace(staging, path)
    return path, wanted


def measure(documents: int) -> dict[str, float]:
    """One cold start in this process (its files already written)."""
    import jax  # noqa: F401 - imported before the span, as a training program has

    from xlstm_data.multihost.iterator import PlannedDataIterator

    common.ensure_flags_parsed()
    path, wanted = first_batch_file(documents)
    index = lengths_index(documents)
    mesh = common.single_device_mesh()
    rss_before = common.rss_mb()
    started = time.perf_counter()
    lengths = np.load(index, mmap_mode="r")
    source = SparseSource(lengths, wanted, str(path))
    iterator = PlannedDataIterator(_plan(source.lengths()), [source], mesh, eod_token_id=EOD)
    try:
        batch = next(iterator)
        secs = time.perf_counter() - started
        tokens = int(np.count_nonzero(np.asarray(batch["targets_segmentation"])))
    finally:
        iterator.close()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    return {"secs": secs, "rss_before_mb": rss_before, "peak_rss_mb": peak, "tokens": tokens}


def _measure_in_subprocess(documents: int) -> dict[str, float]:
    code = (
        "import json, sys; from bench import cold_start; "
        f"print(json.dumps(cold_start.measure({documents})))"
    )
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu")},
        check=False,
    )
    if done.returncode:
        raise RuntimeError(f"cold start of {documents} documents failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(config: common.BenchConfig) -> dict[str, Any]:
    started = time.perf_counter()
    sizes = SIZES_TINY if config.tiny else SIZES
    repeats = REPEATS_TINY if config.tiny else REPEATS
    results = {}
    for documents in sizes:
        first_batch_file(documents)  # written once, outside the timed span
        runs = [
            measure(documents) if config.tiny else _measure_in_subprocess(documents)
            for _ in range(repeats)
        ]
        results[str(documents)] = {
            "secs": common.summarize([r["secs"] for r in runs]),
            "peak_rss_mb": common.summarize([r["peak_rss_mb"] for r in runs]),
            "rss_before_mb": common.summarize([r["rss_before_mb"] for r in runs]),
            "index_mb": lengths_index(documents).stat().st_size / 2**20,
        }
    largest = results[str(sizes[-1])]
    targets = [
        common.target(
            f"secs_at_{sizes[-1]}",
            largest["secs"]["median"],
            "<",
            TARGET_SECS,
            f"building the iterator to the first batch < {TARGET_SECS} s at {sizes[-1]:,} "
            "documents",
        ),
        common.target(
            f"peak_rss_mb_at_{sizes[-1]}",
            largest["peak_rss_mb"]["max"],
            "<",
            TARGET_RSS_MB,
            f"peak resident memory < {TARGET_RSS_MB:.0f} MB at {sizes[-1]:,} documents",
        ),
    ]
    payload = {
        "settings": {
            "row_length": ROW_LENGTH,
            "batch_size": BATCH_SIZE,
            "repeats": repeats,
            "lengths": f"lognormal mean {MEAN_LENGTH}, sigma {SIGMA}, int32 .npy, mmap",
            "process": "in this process" if config.tiny else "a fresh process per measurement",
            "span": "np.load(mmap) + GlobalPlan + PlannedDataIterator + first next()",
        },
        "documents": results,
        "targets": targets,
    }
    return common.write_result(config, NAME, payload, started)


def summary(result: Mapping[str, Any]) -> list[tuple[str, str, str, str]]:
    met = {t["metric"]: t["met"] for t in result["targets"]}
    rows = []
    sizes = list(result["documents"])
    for documents, stats in result["documents"].items():
        last = documents == sizes[-1]
        secs, rss = stats["secs"], stats["peak_rss_mb"]
        rows.append(
            (
                f"cold start to first batch, {int(documents):,} documents",
                f"{secs['median']:.2f} s ({secs['min']:.2f}-{secs['max']:.2f})",
                f"< {TARGET_SECS:.0f} s" if last else "-",
                ("yes" if met[f"secs_at_{documents}"] else "NO") if last else "-",
            )
        )
        rows.append(
            (
                f"peak RSS, {int(documents):,} documents",
                f"{rss['max']:.0f} MB",
                f"< {TARGET_RSS_MB:.0f} MB" if last else "-",
                ("yes" if met[f"peak_rss_mb_at_{documents}"] else "NO") if last else "-",
            )
        )
    return rows
