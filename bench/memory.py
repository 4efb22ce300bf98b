"""Memory: resident set size (RSS) of the process over 100,000 train-iterator steps.

The demo's train iterator (configs/demo.py data: the 2-component standard
library mixture, packed rows of 128, the 3-stage batch-size ramp-up to 32
rows) is advanced 100,000 steps (issue 14, target 6: growth < 20 MB), the
batches dropped as a training loop would, and the process's RSS sampled every
500 steps. Growth is the RSS at
the last step minus the RSS after the first batch (so one-time start-up is
not counted, everything after it is); the growth after the first 10% of the
steps is reported too, to tell warm-up from a steady leak. The process is
warmed up first by a throwaway iterator of the same config
(`_warm_up_process`), so that what any process pays once is not counted as
this iterator's growth. Repeats build a fresh iterator in the same process.
Tiny mode runs 400 steps.

The worker soak (issue 25, item 8: growth < 2 MB per worker from step 10,000
to step 100,000) runs the same iterator with 2 grain worker processes, which
then plan and assemble every step, and samples each worker's RSS (and its
anonymous, file and shared-memory parts, to tell a heap leak from pages of
mapped files or segments) every 1,000 steps. Workers only ever walk forward,
so state that grows with the step shows there first: each one's epoch-order
cache grew by one table per epoch it planned, +0.05 MB per 1,000 steps.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
from absl import logging

import xlstm_data as xd
from bench import common

NAME = "memory"
TARGET_MB = 20.0
#: Per worker, RSS growth from 10% of the soak's steps to its end (issue 25).
WORKER_TARGET_MB = 2.0
WORKERS = 2


@dataclasses.dataclass(frozen=True)
class Sizes:
    steps: int
    sample_every: int
    repeats: int
    #: Steps of a throwaway iterator run before the measured one (see `_warm_up_process`).
    process_warmup: int = 0


#: 1,000 steps: past the demo's last ramp-up stage (step 200), its pick's
#: compile (`global_arrays.PYTREE_STEPS` steps later) and a few chunks.
FULL = Sizes(100_000, 500, 1, process_warmup=1_000)
TINY = Sizes(400, 20, 1, process_warmup=40)
WORKER_FULL = Sizes(100_000, 1_000, 1)
WORKER_TINY = Sizes(400, 40, 1)


def _demo_data() -> dict[str, Any]:
    data = common.load_config("demo").data.to_dict()
    data["eval"] = {}
    return data


def _warm_up_process(steps: int, mesh: Any) -> float:
    """Runs a throwaway demo iterator `steps` steps; returns the RSS after it (MiB).

    What a process pays once, whatever iterator it later builds, is paid
    here: JAX's backend and its first dispatches, the compiled pick of each
    ramp-up stage's chunk shape (kept per process, `global_arrays._PICKS`),
    malloc's arenas for the threads. Counted as growth, that start-up read
    80 MB in the first 500 steps of a run that began in a fresh process, and
    1.1 MB after step 10,000 (2026-11-28), against 4.5 MB in a process that
    had run three benchmarks before. The measured iterator is then a second
    one, as after an eval pass, a restore or a `set_mixture`.
    """
    iterator, _ = xd.iterators_from_config(_demo_data(), mesh)
    try:
        for _ in range(steps):
            next(iterator)
    finally:
        iterator.close()
    gc.collect()
    return common.rss_mb()


def _one_run(sizes: Sizes, mesh: Any) -> dict[str, Any]:
    warmed_mb = _warm_up_process(sizes.process_warmup, mesh) if sizes.process_warmup else None
    iterator, _ = xd.iterators_from_config(_demo_data(), mesh)
    steps, rss = [], []
    started = time.perf_counter()
    try:
        next(iterator)
        gc.collect()
        steps.append(1)
        rss.append(common.rss_mb())
        for step in range(2, sizes.steps + 1):
            next(iterator)
            if step % sizes.sample_every == 0 or step == sizes.steps:
                steps.append(step)
                rss.append(common.rss_mb())
    finally:
        iterator.close()
    elapsed = time.perf_counter() - started
    warm = next(i for i, s in enumerate(steps) if s >= sizes.steps // 10)
    second_half = len(steps) // 2
    slope = np.polyfit(steps[second_half:], rss[second_half:], 1)[0] if len(steps) > 3 else 0.0
    return {
        "steps": steps,
        "rss_mb": rss,
        "growth_mb": rss[-1] - rss[0],
        "growth_after_warmup_mb": rss[-1] - rss[warm],
        "peak_mb": max(rss),
        "start_mb": rss[0],
        "second_half_slope_mb_per_10k_steps": float(slope) * 10_000,
        "steps_per_sec": sizes.steps / elapsed,
        "tokens": int(iterator.data_counters.tokens),
        "rss_after_process_warmup_mb": warmed_mb,
    }


def _worker_memory_mb(process: Any) -> dict[str, float]:
    """RSS of a worker and its anonymous, file-backed and shared-memory parts (MiB)."""
    parts = {"rss_mb": process.memory_info().rss / 2**20}
    # /proc/<pid>/status: Linux only.
    with contextlib.suppress(OSError), open(f"/proc/{process.pid}/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("RssAnon", "RssFile", "RssShmem"):
                parts[f"{key[3:].lower()}_mb"] = int(value.split()[0]) / 1024
    return parts


def _grain_workers() -> list[Any]:
    """This process's grain worker processes (spawned children, not the resource tracker)."""
    import psutil

    workers = []
    for child in psutil.Process().children():
        with contextlib.suppress(psutil.Error):
            if "spawn_main" in " ".join(child.cmdline()):
                workers.append(child)
    return sorted(workers, key=lambda p: p.pid)


def worker_soak(sizes: Sizes, mesh: Any) -> dict[str, Any]:
    """Each grain worker's memory over `sizes.steps` steps of the demo with 2 workers."""
    data = _demo_data()
    data["worker_count"] = WORKERS
    iterator, _ = xd.iterators_from_config(data, mesh)
    steps: list[int] = []
    samples: dict[int, list[dict[str, float]]] = {}
    started = time.perf_counter()
    try:
        for step in range(1, sizes.steps + 1):
            next(iterator)
            if step % sizes.sample_every == 0 or step == sizes.steps:
                workers = _grain_workers()
                if len(workers) != WORKERS:  # not started yet (the first steps are in process)
                    continue
                steps.append(step)
                for worker in workers:
                    samples.setdefault(worker.pid, []).append(_worker_memory_mb(worker))
    finally:
        iterator.close()
    elapsed = time.perf_counter() - started
    warm = next(i for i, s in enumerate(steps) if s >= sizes.steps // 10)
    workers = []
    for pid, rows in samples.items():
        if len(rows) != len(steps):  # a worker restarted: its curve is not one process's
            raise RuntimeError(f"grain worker {pid} was sampled {len(rows)} of {len(steps)} times")
        rss = [r["rss_mb"] for r in rows]
        tail = slice(warm, None)
        slope = np.polyfit(steps[tail], rss[tail], 1)[0] if len(steps) - warm > 2 else 0.0
        workers.append(
            {
                "pid": pid,
                "rss_mb": rss,
                "rss_at_warm_mb": rss[warm],
                "rss_at_end_mb": rss[-1],
                "growth_after_warmup_mb": _window_growth(rss[warm:]),
                "slope_mb_per_1k_steps": float(slope) * 1_000,
                "parts_at_warm_mb": rows[warm],
                "parts_at_end_mb": rows[-1],
            }
        )
    return {
        "steps": steps,
        "warm_step": steps[warm],
        "workers": workers,
        "max_growth_after_warmup_mb": max(w["growth_after_warmup_mb"] for w in workers),
        "steps_per_sec": sizes.steps / elapsed,
    }


def _window_growth(rss: list[float]) -> float:
    """Median RSS over the last tenth of the samples minus the median over the first tenth.

    A worker's RSS moves up and down by 1-2 MB from sample to sample without
    a trend (malloc's arenas): the last sample minus one at the warm-up read
    2.19 MB for a worker whose fitted slope was -0.001 MB per 1,000 steps,
    because the warm-up sample fell in a dip (2026-11-28).
    """
    tenth = max(1, len(rss) // 10)
    return float(np.median(rss[-tenth:]) - np.median(rss[:tenth]))


def run(config: common.BenchConfig) -> dict[str, Any]:
    """Samples RSS over the steps, in process and per worker; writes memory.json and memory.png."""
    started = time.perf_counter()
    common.ensure_flags_parsed()
    sizes = TINY if config.tiny else FULL
    mesh = common.single_device_mesh()
    runs = []
    for round_index in range(sizes.repeats):
        runs.append(_one_run(sizes, mesh))
        logging.info(
            "bench memory round %d: growth %.1f MB (after warm-up %.1f MB)",
            round_index,
            runs[-1]["growth_mb"],
            runs[-1]["growth_after_warmup_mb"],
        )
    soak_sizes = WORKER_TINY if config.tiny else WORKER_FULL
    soak = worker_soak(soak_sizes, mesh)
    logging.info(
        "bench memory worker soak: growth per worker after step %d %s MB",
        soak["warm_step"],
        [round(w["growth_after_warmup_mb"], 2) for w in soak["workers"]],
    )
    result = payload(config, sizes, runs, soak_sizes, soak)
    return common.write_result(config, NAME, result, started)


def payload(
    config: common.BenchConfig,
    sizes: Sizes,
    runs: list[Mapping[str, Any]],
    soak_sizes: Sizes,
    soak: Mapping[str, Any],
) -> dict[str, Any]:
    """The JSON of the in-process runs and the worker soak, with the figure."""
    growth = common.summarize([r["growth_mb"] for r in runs])
    return {
        "settings": {
            **dataclasses.asdict(sizes),
            "iterator": "configs/demo.py data, train iterator (ramp-up 8/16/32 rows of 128)",
            "growth": (
                "RSS at the last step minus RSS after the first batch, of an iterator built "
                "after a throwaway one ran `process_warmup` steps in the same process"
            ),
            "worker_soak": {
                **dataclasses.asdict(soak_sizes),
                "workers": WORKERS,
                "growth": (
                    "per worker, median RSS over the last tenth of the samples after step "
                    "steps/10 minus the median over the first tenth of them"
                ),
            },
        },
        "growth_mb": growth,
        "growth_after_warmup_mb": common.summarize([r["growth_after_warmup_mb"] for r in runs]),
        "second_half_slope_mb_per_10k_steps": common.summarize(
            [r["second_half_slope_mb_per_10k_steps"] for r in runs]
        ),
        "runs": runs,
        "worker_soak": soak,
        "targets": [
            common.target(
                "growth_mb",
                growth["median"],
                "<",
                TARGET_MB,
                f"RSS growth < {TARGET_MB:g} MB over {sizes.steps:,} steps",
            ),
            common.target(
                "worker_growth_after_warmup_mb",
                soak["max_growth_after_warmup_mb"],
                "<",
                WORKER_TARGET_MB,
                f"RSS growth of each of {WORKERS} workers < {WORKER_TARGET_MB:g} MB from step "
                f"{soak['warm_step']:,} to step {soak['steps'][-1]:,}",
            ),
        ],
        "png": _plot(config, runs, soak),
    }


def _plot(
    config: common.BenchConfig, runs: list[Mapping[str, Any]], soak: Mapping[str, Any]
) -> str:
    figure = common.new_figure(figsize=(11, 3.8))
    ax = figure.add_subplot(1, 2, 1)
    for i, run_ in enumerate(runs):
        ax.plot(run_["steps"], run_["rss_mb"], label=f"run {i + 1}")
    ax.set_xlabel("step")
    ax.set_ylabel("RSS (MiB)")
    ax.set_title(f"Train iterator, no workers ({config.mode} mode)")
    ax.legend(fontsize=8)
    ax = figure.add_subplot(1, 2, 2)
    for i, worker in enumerate(soak["workers"]):
        ax.plot(soak["steps"], worker["rss_mb"], label=f"worker {i}")
    ax.axvline(soak["warm_step"], color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("step")
    ax.set_ylabel("RSS (MiB)")
    ax.set_title(f"Each of {WORKERS} grain workers ({config.mode} mode)")
    ax.legend(fontsize=8)
    return common.save_figure(config, NAME, figure)


def summary(result: Mapping[str, Any]) -> list[tuple[str, str, str, str]]:
    """Rows (figure, value, target, met) for the summary table."""
    growth = result["growth_mb"]
    warm = result["growth_after_warmup_mb"]
    steps = result["settings"]["steps"]
    rows = [
        (
            f"RSS growth over {steps:,} steps",
            f"{growth['median']:.1f} MB ({growth['min']:.1f}-{growth['max']:.1f}); "
            f"after warm-up {warm['median']:.1f} MB",
            f"< {TARGET_MB:g} MB",
            "yes" if result["targets"][0]["met"] else "NO",
        )
    ]
    soak = result.get("worker_soak")
    if soak is not None:
        per_worker = ", ".join(
            f"{w['growth_after_warmup_mb']:.2f} MB ({w['slope_mb_per_1k_steps']:.3f} MB/1k steps)"
            for w in soak["workers"]
        )
        rows.append(
            (
                f"RSS growth per worker, step {soak['warm_step']:,} to {soak['steps'][-1]:,}",
                per_worker,
                f"< {WORKER_TARGET_MB:g} MB",
                "yes" if result["targets"][1]["met"] else "NO",
            )
        )
    return rows
