"""Resume cost: time from restoring a saved position to the first batch.

One train iterator (the 3-source lognormal mixture, packed, short rows and a
small batch so that 100,000 steps are reached in about a minute) is advanced
once, saving its position (`save`, the CLU JSON surface) at steps 10, 1,000
and 100,000 and fingerprinting the batch that follows each. Then, in rotating
order and repeated, a new iterator is built and the clock runs from
`restore(path)` (which reads the JSON and calls `set_state`) until the first
batch is in hand; that batch must equal the one recorded after the saved step.
For comparison, a fresh iterator's time from construction to its first batch
is measured too. Tiny mode saves at steps 10, 100 and 1,000.
"""

from __future__ import annotations

import dataclasses
import hashlib
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from absl import logging

from bench import common
from xlstm_data.batch import LLM_BATCH_FIELDS

NAME = "resume"
TARGET_RATIO = 1.5
TARGET_SECS = 1.0


@dataclasses.dataclass(frozen=True)
class Sizes:
    positions: tuple[int, ...]
    seq_len: int
    batch_size: int
    repeats: int


FULL = Sizes((10, 1_000, 100_000), 64, 2, 5)
TINY = Sizes((10, 100, 1_000), 64, 2, 2)


def fingerprint(batch: Any) -> str:
    """SHA-1 of a batch's fields (an LLMBatch of global arrays)."""
    digest = hashlib.sha1()
    for field in LLM_BATCH_FIELDS:
        digest.update(np.ascontiguousarray(np.asarray(getattr(batch, field))).tobytes())
    return digest.hexdigest()


def run(config: common.BenchConfig) -> dict[str, Any]:
    """Advances, saves, restores; writes resume.json and resume.png."""
    started = time.perf_counter()
    common.ensure_flags_parsed()
    sizes = TINY if config.tiny else FULL
    specs = common.lognormal_corpus(config.tiny)
    files = {name: common.prepare_corpus(spec) for name, spec in specs.items()}
    seeds = {name: spec.seed for name, spec in specs.items()}
    mesh = common.single_device_mesh()

    def build():
        return common.our_iterator(
            files,
            common.MIXTURE_WEIGHTS,
            seeds,
            seq_len=sizes.seq_len,
            batch_size=sizes.batch_size,
            packed=True,
            workers=0,
            mesh=mesh,
        )

    with tempfile.TemporaryDirectory(prefix="xlstm_data_bench_resume_") as tmp:
        paths = {p: Path(tmp) / f"state_{p}.json" for p in sizes.positions}
        expected: dict[int, str] = {}
        iterator = build()
        advance_started = time.perf_counter()
        last = max(sizes.positions)
        try:
            for step in range(1, last + 2):
                batch = next(iterator)
                if step - 1 in paths:
                    expected[step - 1] = fingerprint(batch)
                if step in paths:
                    iterator.save(paths[step])
        finally:
            iterator.close()
        advance_secs = time.perf_counter() - advance_started
        logging.info("bench resume: advanced %d steps in %.1f s", last + 1, advance_secs)
        state_bytes = {str(p): path.stat().st_size for p, path in paths.items()}

        resume_secs: dict[int, list[float]] = {p: [] for p in sizes.positions}
        build_secs, fresh_secs, matches = [], [], []
        for round_index in range(sizes.repeats):
            for position in common.rotated(sizes.positions, round_index):
                iterator, secs = common.timed(build)
                build_secs.append(secs)
                try:
                    t0 = time.perf_counter()
                    iterator.restore(paths[position])
                    batch = next(iterator)
                    resume_secs[position].append(time.perf_counter() - t0)
                finally:
                    iterator.close()
                matches.append(fingerprint(batch) == expected[position])
            t0 = time.perf_counter()
            iterator = build()
            try:
                next(iterator)
                fresh_secs.append(time.perf_counter() - t0)
            finally:
                iterator.close()
            logging.info(
                "bench resume round %d: %s",
                round_index,
                {p: f"{v[-1]:.3f}s" for p, v in resume_secs.items()},
            )

    first, last_position = min(sizes.positions), max(sizes.positions)
    stats = {str(p): common.summarize(v) for p, v in resume_secs.items()}
    ratio = stats[str(last_position)]["median"] / stats[str(first)]["median"]
    payload = {
        "settings": {
            **dataclasses.asdict(sizes),
            "pipeline": "3-source lognormal ArrayRecord mixture (web/books/code "
            f"{list(common.MIXTURE_WEIGHTS.values())}), first-fit packed, worker_count 0",
            "measured": "restore(path) [JSON read + set_state] until next() returns",
        },
        "advance_secs": advance_secs,
        "resume_secs": stats,
        "state_json_bytes": state_bytes,
        "build_secs": common.summarize(build_secs),
        "fresh_first_batch_secs": common.summarize(fresh_secs),
        "largest_over_smallest": ratio,
        "first_batch_matches": all(matches),
        "targets": [
            common.target(
                "resume_largest_over_smallest",
                ratio,
                "<=",
                TARGET_RATIO,
                f"resume at step {last_position:,} within {TARGET_RATIO}x of step {first}",
            ),
            common.target(
                f"resume_secs_at_{last_position}",
                stats[str(last_position)]["median"],
                "<",
                TARGET_SECS,
                f"resume at step {last_position:,} under {TARGET_SECS:g} s",
            ),
        ],
        "png": _plot(config, stats),
    }
    return common.write_result(config, NAME, payload, started)


def _plot(config: common.BenchConfig, stats: Mapping[str, Any]) -> str:
    figure = common.new_figure(figsize=(5, 3.5))
    ax = figure.add_subplot()
    names = list(stats)
    medians, errors = common.error_bars([stats[n] for n in names])
    ax.bar([f"{int(n):,}" for n in names], medians, yerr=errors, capsize=3)
    ax.set_xlabel("saved at step")
    ax.set_ylabel("restore -> first batch (s)")
    ax.set_title(f"Resume cost ({config.mode} mode)")
    return common.save_figure(config, NAME, figure)


def summary(result: Mapping[str, Any]) -> list[tuple[str, str, str, str]]:
    """Rows (figure, value, target, met) for the summary table."""
    met = {t["metric"]: t["met"] for t in result["targets"]}
    positions = list(result["resume_secs"])
    last = positions[-1]
    rows = []
    for position in positions:
        s = result["resume_secs"][position]
        is_last = position == last
        rows.append(
            (
                f"resume at step {int(position):,}",
                f"{s['median']:.3f} s ({s['min']:.3f}-{s['max']:.3f})",
                f"< {TARGET_SECS:g} s" if is_last else "-",
                ("yes" if met[f"resume_secs_at_{last}"] else "NO") if is_last else "-",
            )
        )
    rows.append(
        (
            f"resume {int(last):,} / {int(positions[0]):,}",
            f"{result['largest_over_smallest']:.2f}x",
            f"<= {TARGET_RATIO}x",
            "yes" if met["resume_largest_over_smallest"] else "NO",
        )
    )
    fresh = result["fresh_first_batch_secs"]
    rows.append(
        (
            "fresh build -> first batch",
            f"{fresh['median']:.3f} s; batches match: {result['first_batch_matches']}",
            "-",
            "-",
        )
    )
    return rows
