"""Memory: resident set size (RSS) of the process over 100,000 train-iterator steps.

The demo's train iterator (configs/demo.py data: the 2-component standard
library mixture, packed rows of 128, the 3-stage batch-size ramp-up to 16
rows) is advanced 100,000 steps (issue 14, target 6: growth < 20 MB), the
batches dropped as a training loop would, and the process's RSS sampled every
500 steps. Growth is the RSS at
the last step minus the RSS after the first batch (so one-time start-up is
not counted, everything after it is); the growth after the first 10% of the
steps is reported too, to tell warm-up from a steady leak. Repeats build a
fresh iterator in the same process. Tiny mode runs 400 steps.
"""

from __future__ import annotations

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


@dataclasses.dataclass(frozen=True)
class Sizes:
    steps: int
    sample_every: int
    repeats: int


FULL = Sizes(100_000, 500, 1)
TINY = Sizes(400, 20, 1)


def _one_run(sizes: Sizes, mesh: Any) -> dict[str, Any]:
    data = common.load_config("demo").data.to_dict()
    data["eval"] = {}
    iterator, _ = xd.iterators_from_config(data, mesh)
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
    }


def run(config: common.BenchConfig) -> dict[str, Any]:
    """Samples RSS over the steps; writes memory.json and memory.png."""
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
    growth = common.summarize([r["growth_mb"] for r in runs])
    payload = {
        "settings": {
            **dataclasses.asdict(sizes),
            "iterator": "configs/demo.py data, train iterator (ramp-up 4/8/16 rows of 128)",
            "growth": "RSS at the last step minus RSS after the first batch",
        },
        "growth_mb": growth,
        "growth_after_warmup_mb": common.summarize([r["growth_after_warmup_mb"] for r in runs]),
        "second_half_slope_mb_per_10k_steps": common.summarize(
            [r["second_half_slope_mb_per_10k_steps"] for r in runs]
        ),
        "runs": runs,
        "targets": [
            common.target(
                "growth_mb",
                growth["median"],
                "<",
                TARGET_MB,
                f"RSS growth < {TARGET_MB:g} MB over {sizes.steps:,} steps",
            )
        ],
        "png": _plot(config, runs),
    }
    return common.write_result(config, NAME, payload, started)


def _plot(config: common.BenchConfig, runs: list[Mapping[str, Any]]) -> str:
    figure = common.new_figure(figsize=(6, 3.8))
    ax = figure.add_subplot()
    for i, run_ in enumerate(runs):
        ax.plot(run_["steps"], run_["rss_mb"], label=f"run {i + 1}")
    ax.set_xlabel("step")
    ax.set_ylabel("RSS (MiB)")
    ax.set_title(f"Resident memory of the train iterator ({config.mode} mode)")
    ax.legend(fontsize=8)
    return common.save_figure(config, NAME, figure)


def summary(result: Mapping[str, Any]) -> list[tuple[str, str, str, str]]:
    """Rows (figure, value, target, met) for the summary table."""
    growth = result["growth_mb"]
    warm = result["growth_after_warmup_mb"]
    steps = result["settings"]["steps"]
    return [
        (
            f"RSS growth over {steps:,} steps",
            f"{growth['median']:.1f} MB ({growth['min']:.1f}-{growth['max']:.1f}); "
            f"after warm-up {warm['median']:.1f} MB",
            f"< {TARGET_MB:g} MB",
            "yes" if result["targets"][0]["met"] else "NO",
        )
    ]
