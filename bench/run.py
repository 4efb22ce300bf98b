"""Runs the benchmarks and prints a summary table; or measures your own config's pipeline.

    python -m bench.run [NAME ...] [--tiny] [--out=DIR]
    python -m bench.run --config=run.py [--config.KEY=VALUE ...] [--steps=N] [--out=DIR]

`xlstm-data bench ...` is the same command (same flags, same files). Names are
any of throughput, resume, loop_wait, memory, plan, plan_throughput,
cold_start, plan_packing, plan_mixture, device_overlap (default: all, unless
`--config` is given). `--tiny` runs smoke-test sizes in seconds (the figures
mean nothing); results go to `--out` (default `bench/results/`, or
`bench/results/tiny/` with `--tiny`, so a smoke run never overwrites the full
figures).

`--config` measures the train iterator that config builds (as
`trainer_hooks.train` would build it, `--config.*` overrides included) for a
short run: tokens/s, batches/s, examples/s, padding and the share of the
loop's wall time spent waiting for data, optionally with a simulated train
step (`--step_secs`). It writes `pipeline_<config name>.json` to `--out`
(default: the current directory).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import logging as std_logging
import os
import sys
import time
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from absl import flags, logging

from bench import BENCHMARKS, common
from xlstm_data.cli.main import Command, UsageError, define_config_flag, run_command, run_config

#: Default results directory of the named benchmarks (next to this file).
RESULTS_DIR = Path(__file__).resolve().parent / "results"
PROG = "xlstm-data bench"
#: Measured steps of a `--config` run (after the first batch), full and tiny.
PIPELINE_STEPS, PIPELINE_STEPS_TINY = 200, 20
#: The measured steps are split into this many rounds (median, min, max).
PIPELINE_ROUNDS = 5


def _define(fv: flags.FlagValues, argv: Sequence[str]) -> None:
    flags.DEFINE_bool(
        "tiny", False, "smoke-test sizes (seconds; figures mean nothing)", flag_values=fv
    )
    flags.DEFINE_string(
        "out",
        None,
        "results directory (default: bench/results, bench/results/tiny with --tiny, "
        "or . with --config)",
        flag_values=fv,
    )
    flags.DEFINE_bool("verbose", False, "keep INFO logs", flag_values=fv)
    define_config_flag(
        fv,
        argv,
        "measure the train pipeline of this run config (a .py file with get_config()); "
        "override keys with --config.KEY=VALUE",
    )
    flags.DEFINE_integer(
        "steps",
        None,
        f"--config: batches to measure after the first (default {PIPELINE_STEPS}, "
        f"{PIPELINE_STEPS_TINY} with --tiny)",
        flag_values=fv,
    )
    flags.DEFINE_float(
        "step_secs",
        0.0,
        "--config: simulated train step per batch, so the wait share is the one a "
        "model of this speed would see",
        flag_values=fv,
    )


def _run(fv: flags.FlagValues, names: list[str], argv: Sequence[str] = ()) -> int:
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        raise UsageError(f"unknown benchmark(s) {unknown}; choose from {list(BENCHMARKS)}")
    if fv.steps is not None and fv.steps < PIPELINE_ROUNDS:
        raise UsageError(f"--steps={fv.steps} is too few; give at least {PIPELINE_ROUNDS}")
    if fv.step_secs < 0:
        raise UsageError(f"--step_secs={fv.step_secs} is negative; give 0 or more seconds")
    with_config = fv.config is not None
    names = list(dict.fromkeys(names)) or ([] if with_config else list(BENCHMARKS))
    common.ensure_flags_parsed()
    if not fv.verbose:
        logging.set_verbosity(logging.WARNING)
        std_logging.getLogger("trainer_hooks.progress").setLevel(std_logging.WARNING)
    command = common.python_command(argv)  # stored in each JSON
    rows, failed = [], []
    if names:
        out = fv.out or (RESULTS_DIR / "tiny" if fv.tiny else RESULTS_DIR)
        config = common.BenchConfig(out_dir=Path(out).resolve(), tiny=fv.tiny, command=command)
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
    if with_config:
        config = common.BenchConfig(
            out_dir=Path(fv.out or ".").resolve(), tiny=fv.tiny, command=command
        )
        steps = fv.steps or (PIPELINE_STEPS_TINY if fv.tiny else PIPELINE_STEPS)
        path = fv["config"].config_filename
        name = "pipeline_" + os.path.splitext(os.path.basename(path.split(":", 1)[0]))[0]
        print(f"running {name} ({steps} steps) ...", flush=True)
        result = measure_pipeline(
            run_config(fv),
            config,
            name,
            config_path=path,
            overrides=dict(fv["config"].override_values),
            steps=steps,
            step_secs=fv.step_secs,
        )
        rows += [(name, *row) for row in pipeline_summary(result)]
        print(f"  {name}: {result['duration_secs']:.0f} s -> {config.out_dir / name}.json")
    print()
    print(common.format_table(rows, ("benchmark", "figure", "value", "target", "met")))
    if failed:
        print(f"\nfailed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


BENCH = Command(
    name="bench",
    summary="run the benchmarks, or measure your config's pipeline",
    usage="bench [NAME ...] [--tiny] [--out=DIR] | bench --config=FILE [--config.KEY=VALUE ...]",
    description=(
        f"Runs the benchmarks in bench/ ({', '.join(BENCHMARKS)};\n"
        "default all) and writes <out>/<name>.json (+ .png), or, with --config, measures\n"
        "the train iterator that config builds and writes <out>/pipeline_<config name>.json."
    ),
    define=_define,
    run=_run,
)


def main(argv: list[str] | None = None) -> int:
    """Runs the named benchmarks (default all) and/or a config's pipeline.

    Returns:
      0; 1 if a benchmark failed; 2 for a bad command line (the message
      names the argument). Missed targets do not fail the run: they are
      figures, recorded in each JSON with `met: false` and shown in the table.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    command = dataclasses.replace(BENCH, run=functools.partial(_run, argv=argv))
    return run_command(command, argv, PROG)


# ----------------------------------------------------------------------------
# Your own pipeline (`--config`).
# ----------------------------------------------------------------------------


def measure_pipeline(
    run_config: Any,
    config: common.BenchConfig,
    name: str,
    *,
    config_path: str,
    overrides: Mapping[str, Any],
    steps: int,
    step_secs: float = 0.0,
) -> dict[str, Any]:
    """Times the train iterator of `run_config` and writes `<out>/<name>.json`.

    The first batch (which fills the packing bins and starts the readers)
    is timed on its own; the next `steps` batches are timed in
    `PIPELINE_ROUNDS` rounds, each batch waited for on the devices, with
    `step_secs` of simulated training after each. Only this process's
    iterator is measured (one data-loading host).

    Args:
      run_config: The run config (with a `data` section, and `mesh` if not the default).
      config: Where and how to write the result.
      name: Result name (the JSON file name).
      config_path: The config file, stored in the result.
      overrides: The `--config.*` overrides, stored in the result.
      steps: Batches to time after the first.
      step_secs: Simulated train step per batch.

    Returns:
      The result as written.
    """
    import jax

    import xlstm_data as xd
    from xlstm_data.cli.inspect_config import smallest_device_count
    from xlstm_data.multihost.mesh import DEFAULT_AXIS_DIMS

    started = time.perf_counter()
    with contextlib.suppress(RuntimeError):  # JAX already started: keep its devices
        jax.config.update("jax_num_cpu_devices", smallest_device_count(run_config))
    axis_dims = run_config.get("mesh", {}).get("axis_dims", DEFAULT_AXIS_DIMS)
    batch_axes = run_config.get("mesh", {}).get("batch_axis_names")
    train, evals = xd.iterators_from_config(
        run_config, xd.create_mesh(axis_dims), batch_axis_names=batch_axes
    )
    for iterator in evals.values():
        iterator.close()
    try:
        began = time.perf_counter()
        jax.block_until_ready(next(train))
        first_batch_secs = time.perf_counter() - began
        rounds = _timed_rounds(train, steps, step_secs)
    finally:
        train.close()
    if not rounds:
        raise UsageError(
            f"--config={config_path!r}: the train data ended before one round of "
            f"{steps // PIPELINE_ROUNDS} batches; give fewer --steps or more data"
        )
    names = list(train.component_names or ("all",))
    component_tokens = sum(r.pop("component_tokens") for r in rounds)
    tokens = sum(r["tokens"] for r in rounds)
    slots = sum(r["slots"] for r in rounds)
    payload = {
        "settings": {
            "config": config_path,
            "overrides": {k: _plain(v) for k, v in overrides.items()},
            "steps": sum(r["batches"] for r in rounds),
            "rounds": len(rounds),
            "step_secs": step_secs,
            "mesh": {k: int(v) for k, v in train.global_mesh.shape.items()},
            "measured": "this process's train iterator; batches waited for on the devices",
        },
        "first_batch_secs": first_batch_secs,
        "tokens_per_sec": common.summarize([r["tokens"] / r["secs"] for r in rounds]),
        "batches_per_sec": common.summarize([r["batches"] / r["secs"] for r in rounds]),
        "examples_per_sec": common.summarize([r["rows"] / r["secs"] for r in rounds]),
        "wait_share": common.summarize([min(r["wait_secs"] / r["secs"], 1.0) for r in rounds]),
        "padding_fraction": 1.0 - tokens / slots if slots else 0.0,
        "component_share": {
            n: float(c) / tokens if tokens else 0.0
            for n, c in zip(names, component_tokens, strict=False)
        },
        "rounds": rounds,
        "targets": [],
    }
    return common.write_result(config, name, payload, started)


def _timed_rounds(train: Any, steps: int, step_secs: float) -> list[dict[str, Any]]:
    """Per round: seconds, and batches, tokens, slots, rows and data wait from the counters."""
    import jax

    per_round = max(steps // PIPELINE_ROUNDS, 1)
    rounds = []
    for _ in range(PIPELINE_ROUNDS):
        before = train.data_counters
        counts = (before.batches, before.tokens, before.slots, before.rows, before.wait_secs)
        shares = before.component_tokens.copy()
        began = time.perf_counter()
        done = 0
        try:
            for _ in range(per_round):
                jax.block_until_ready(next(train))
                done += 1
                if step_secs:
                    time.sleep(step_secs)
        except StopIteration:
            pass
        secs = time.perf_counter() - began
        if done < per_round:  # a partial round at the data's end is not a rate
            break
        after = train.data_counters
        rounds.append(
            {
                "secs": secs,
                "batches": after.batches - counts[0],
                "tokens": after.tokens - counts[1],
                "slots": after.slots - counts[2],
                "rows": after.rows - counts[3],
                "wait_secs": after.wait_secs - counts[4],
                "component_tokens": after.component_tokens - shares,
            }
        )
    return rounds


def pipeline_summary(result: Mapping[str, Any]) -> list[tuple[str, str, str, str]]:
    """Rows (figure, value, target, met) of a `--config` run for the summary table."""

    def spread(stats: Mapping[str, float], scale: float = 1.0, fmt: str = ".3g") -> str:
        low, mid, high = (stats[k] / scale for k in ("min", "median", "max"))
        return f"{mid:{fmt}} ({low:{fmt}}-{high:{fmt}})"

    rows = [
        ("tokens/s (non-padding)", spread(result["tokens_per_sec"])),
        ("batches/s", spread(result["batches_per_sec"])),
        ("examples/s", spread(result["examples_per_sec"])),
        ("loop wait (share of wall time)", spread(result["wait_share"], fmt=".1%")),
        ("padding", f"{result['padding_fraction']:.2%}"),
        ("first batch", f"{result['first_batch_secs']:.2f} s"),
    ]
    return [(figure, value, "-", "-") for figure, value in rows]


def _plain(value: Any) -> Any:
    return value.to_dict() if hasattr(value, "to_dict") else value


if __name__ == "__main__":
    sys.exit(main())
