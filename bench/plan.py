"""The planned pipeline: resume cost and planning cost per host.

Its throughput against grain, the read ceiling and the old pipeline is
`plan_throughput`'s.

- **Resume cost.** From the cursor at step s to the first assembled batch, at
  steps 10 and 10^7. The cursor at 10^7 is synthetic but consistent (a block
  start in proportion to the rows before that step): planning from a cursor
  costs the same whatever its values.
- **Planning cost per host.** Milliseconds of planning per step for data host
  0 as the simulated host count grows from 1 to 512 at a fixed 8 rows per host
  (the global batch grows with the hosts). Every host plans which source fills
  each row of the global batch, so this grows with the world's rows per step.
- **Planning's share of the pipeline's CPU** (target < 5 %). The host
  pipeline (`PlannedBatchDataset`: plan, read, assemble) on the lognormal
  ArrayRecord corpus, rows of 1024, host batch 8, in this process; the CPU
  spent in the host planner (`pieces_at`, `cursor_list_at`: block planning,
  windows, cursors) over the CPU of the whole element. Stride 1 is the
  pipeline without workers, where the target applies as measured. Stride W
  is one of W worker processes, which gets every W-th step but plans every
  block: its share of its own CPU is reported without a
  target, since with workers the pipeline's CPU also counts the main
  process (transfers, unpickling); see bench/README.md.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from bench import common
from xlstm_data.plan import global_plan
from xlstm_data.plan.global_plan import Cursor, GlobalPlan, HostPlanner
from xlstm_data.reading.planned_batches import PlannedBatchDataset
from xlstm_data.sources import ArrayRecordSource

NAME = "plan"
SEQ_LEN = 1024  # as throughput.FULL
HOST_COUNTS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
PLANNING_SHARE_TARGET = 0.05


def _synthetic_lengths(documents: int) -> np.ndarray:
    rng = np.random.default_rng(0)
    return np.minimum(rng.lognormal(np.log(512.0), 1.0, documents), 1 << 16).astype(np.int32)


def _resume_secs(plan: GlobalPlan, step: int, repeats: int) -> dict[str, Any]:
    rows = plan.spec.batch.examples_seen(step)
    documents = rows * SEQ_LEN * 0.98 / float(plan.mean_tokens[0])
    cursor = Cursor(step, 0, (int(documents // 2048) * 2048,), (0,), (0,), (0,))
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        planner = HostPlanner(plan, 0, 1, cursor)
        planner.pieces_at(step)
        times.append(time.perf_counter() - started)
    return common.summarize(times)


def _planning_ms_per_step(lengths: np.ndarray, hosts: int, steps: int) -> float:
    spec = common.plan_spec(("web",), {"web": 1.0}, 8 * hosts, SEQ_LEN)
    planner = HostPlanner(GlobalPlan(spec, [lengths]), 0, hosts)
    started = time.process_time()
    for step in range(steps):
        planner.pieces_at(step)
    return (time.process_time() - started) / steps * 1e3


@contextlib.contextmanager
def _planner_cpu() -> Iterator[list[float]]:
    """CPU seconds spent in `HostPlanner`'s per-step calls while the context is open."""
    spent = [0.0]
    # cursor_at goes through cursor_list_at, the one the pipeline calls.
    originals = {name: getattr(HostPlanner, name) for name in ("pieces_at", "cursor_list_at")}

    def timed(original):
        def call(self, step):
            started = time.process_time()
            try:
                return original(self, step)
            finally:
                spent[0] += time.process_time() - started

        return call

    try:
        for name, original in originals.items():
            setattr(global_plan.HostPlanner, name, timed(original))
        yield spent
    finally:
        for name, original in originals.items():
            setattr(global_plan.HostPlanner, name, original)


def _planning_share(steps: int, stride: int, repeats: int, tiny: bool) -> dict[str, Any]:
    """Planning's share of the host pipeline's CPU: every `stride`-th of `steps` steps."""
    from bench.plan_throughput import document_lengths

    spec = common.lognormal_corpus(tiny)["web"]
    source = ArrayRecordSource(common.prepare_corpus(spec))
    plan = GlobalPlan(
        common.plan_spec(("web",), {"web": 1.0}, 8, SEQ_LEN), [document_lengths(source)]
    )
    shares, per_step = [], []
    for _ in range(repeats):
        dataset = PlannedBatchDataset(plan, [source], 0, 1, 0)
        with _planner_cpu() as spent:
            started = time.process_time()
            for index in range(0, steps, stride):
                dataset[index]
            total = time.process_time() - started
        shares.append(spent[0] / total)
        per_step.append(total / len(range(0, steps, stride)) * 1e3)
    return {"share": common.summarize(shares), "cpu_ms_per_step": common.summarize(per_step)}


def run(config: common.BenchConfig) -> dict[str, Any]:
    started = time.perf_counter()
    tiny = config.tiny
    lengths = _synthetic_lengths(10_000 if tiny else 1_000_000)
    plan = GlobalPlan(common.plan_spec(("web",), {"web": 1.0}, 64, SEQ_LEN), [lengths])
    repeats = 2 if tiny else 5
    resume = {str(step): _resume_secs(plan, step, repeats) for step in (10, 10**7)}
    ratio = resume[str(10**7)]["median"] / resume["10"]["median"]
    steps = 5 if tiny else 60
    planning = {
        str(h): _planning_ms_per_step(lengths, h, steps)
        for h in (HOST_COUNTS[:4] if tiny else HOST_COUNTS)
    }
    share_steps = 256 if tiny else 6000
    repeats_share = 1 if tiny else 3
    shares = {str(k): _planning_share(share_steps, k, repeats_share, tiny) for k in (1, 2)}
    targets = [
        common.target(
            "planning_share_stride_1",
            shares["1"]["share"]["median"],
            "<",
            PLANNING_SHARE_TARGET,
            "planning < 5 % of the pipeline's CPU (no workers)",
        ),
        common.target(
            "resume_10M_over_10", ratio, "<=", 1.5, "resume at step 10^7 <= 1.5x at step 10"
        ),
        common.target(
            "resume_secs_at_10M",
            resume[str(10**7)]["median"],
            "<",
            1.0,
            "resume at step 10^7 < 1 s",
        ),
    ]
    payload = {
        "resume_secs": resume,
        "resume_10M_over_10": ratio,
        "planning_ms_per_step_by_hosts": planning,
        "planning_share_by_stride": shares,
        "rows_per_host": 8,
        "targets": targets,
    }
    return common.write_result(config, NAME, payload, started)


def summary(result: Mapping[str, Any]) -> list[tuple[str, str, str, str]]:
    """Rows (figure, value, target, met) for the summary table."""
    met = {t["metric"]: t["met"] for t in result["targets"]}
    rows = []
    for step, stats in result["resume_secs"].items():
        rows.append((f"plan resume at step {int(step):,}", f"{stats['median']:.4f} s", "-", "-"))
    rows.append(
        (
            "plan resume 10^7 / 10",
            f"{result['resume_10M_over_10']:.2f}x",
            "<= 1.5x",
            "yes" if met["resume_10M_over_10"] else "NO",
        )
    )
    for stride, figures in result.get("planning_share_by_stride", {}).items():
        rows.append(
            (
                f"planning share of pipeline CPU, stride {stride}",
                f"{figures['share']['median']:.1%}",
                "< 5%" if stride == "1" else "-",
                ("yes" if met["planning_share_stride_1"] else "NO") if stride == "1" else "-",
            )
        )
    for hosts, ms in result["planning_ms_per_step_by_hosts"].items():
        rows.append((f"planning per host, {hosts} hosts", f"{ms:.2f} ms/step", "-", "-"))
    return rows
