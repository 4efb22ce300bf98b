"""Loop wait: the share of the demo training loop's wall time spent waiting for data.

Runs the reference training loop (`trainer_hooks.train.train`) on
configs/demo.py in this process, in a fresh work directory each time, and
divides the time `next(train_iterator)` blocked (the iterator's
`data_counters.wait_secs`, reported as `data_wait_secs`) by the wall time of
the loop (`train_secs`: all steps, including jit compilation at each ramp-up
stage, hooks, checkpoints and the batch log, but not the final evaluation).
Tiny mode runs 12 steps of a one-layer model without eval.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Mapping
from typing import Any

from absl import logging

from bench import common

NAME = "loop_wait"
TARGET_SHARE = 0.01  # issue 14, target 6


def run(config: common.BenchConfig) -> dict[str, Any]:
    """Trains the demo `repeats` times and writes loop_wait.json."""
    started = time.perf_counter()
    from trainer_hooks import train as train_module  # defines the loop's absl flags

    common.ensure_flags_parsed()
    run_config = common.load_config("demo")
    repeats = 3
    if config.tiny:
        repeats = 1
        run_config.num_train_steps = 12
        run_config.log_every_steps = 6
        run_config.checkpoint.every_steps = 6
        # Smoke sizes: one layer and no eval set, so compiling is not most of the run.
        run_config.model.update({"d_model": 32, "num_layers": 1, "num_heads": 2, "mlp_dim": 64})
        run_config.data.eval = {}
    runs = []
    for round_index in range(repeats):
        with tempfile.TemporaryDirectory(prefix="xlstm_data_bench_loop_") as workdir:
            summary_ = train_module.train(run_config, workdir)
        steps = summary_["final_step"] - summary_["resumed_from_step"]
        runs.append(
            {
                "steps": steps,
                "train_secs": summary_["train_secs"],
                "data_wait_secs": summary_["data_wait_secs"],
                "wait_share": summary_["data_wait_secs"] / summary_["train_secs"],
                "steps_per_sec": steps / summary_["train_secs"],
                "tokens_seen": summary_["tokens_seen"],
            }
        )
        logging.info("bench loop_wait round %d: %s", round_index, runs[-1])
    share = common.summarize([r["wait_share"] for r in runs])
    payload = {
        "settings": {
            "config": "configs/demo.py",
            "num_train_steps": int(run_config.num_train_steps),
            "repeats": repeats,
            "measured": "data_counters.wait_secs / wall time of the training loop",
        },
        "wait_share": share,
        "train_secs": common.summarize([r["train_secs"] for r in runs]),
        "data_wait_secs": common.summarize([r["data_wait_secs"] for r in runs]),
        "steps_per_sec": common.summarize([r["steps_per_sec"] for r in runs]),
        "runs": runs,
        "targets": [
            common.target(
                "wait_share",
                share["median"],
                "<",
                TARGET_SHARE,
                f"loop waits for data < {TARGET_SHARE:.0%} of wall time",
            )
        ],
    }
    return common.write_result(config, NAME, payload, started)


def summary(result: Mapping[str, Any]) -> list[tuple[str, str, str, str]]:
    """Rows (figure, value, target, met) for the summary table."""
    share = result["wait_share"]
    wall = result["train_secs"]["median"]
    wait = result["data_wait_secs"]["median"]
    return [
        (
            "data wait / loop wall time",
            f"{share['median']:.3%} ({share['min']:.3%}-{share['max']:.3%}); "
            f"{wait:.3f} s of {wall:.1f} s",
            f"< {TARGET_SHARE:.0%}",
            "yes" if result["targets"][0]["met"] else "NO",
        )
    ]
