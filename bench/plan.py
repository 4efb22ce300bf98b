"""The planned pipeline: throughput against grain, resume cost, planning cost per host.

- **Throughput.** Non-padding tokens/s of this host's planned batches (the
  `PlannedBatchDataset` the config path iterates, 0 workers), of the old
  streaming pipeline (`make_grain_llm_dataset`, first-fit packing) and of the
  hand-written grain pipeline (`throughput.grain_pipeline`), on the same
  ArrayRecord corpus, taking turns so they share the machine's moments.
- **Resume cost.** From cursors at step s to the first assembled batch, at
  steps 10 and 10^7. The cursors at 10^7 are synthetic but consistent (the
  row of that step, documents taken in proportion): planning from a cursor
  costs the same whatever its values.
- **Planning cost per host.** Milliseconds of planning per step for data host
  0 as the simulated host count grows from 1 to 512 at a fixed 8 rows per host
  (the global batch grows with the hosts), with the logical streams capped at
  64 as in the config path.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from bench import common, throughput
from xlstm_data.config.rampup import BatchSizeSchedule
from xlstm_data.plan.mixture import parse_mixture_schedule
from xlstm_data.plan.spec import PlanSpec, auto_streams
from xlstm_data.plan.streams import Cursor, GlobalPlan, HostPlanner
from xlstm_data.reading.planned_batches import PlannedBatchDataset
from xlstm_data.sources import ArrayRecordSource

NAME = "plan"
SEQ_LEN = 1024  # as throughput.FULL; the tiny mode uses throughput.TINY's
HOST_COUNTS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


def _spec(
    batch_size: int,
    names: tuple[str, ...],
    weights: Mapping[str, float],
    row_length: int = SEQ_LEN,
) -> PlanSpec:
    batch = BatchSizeSchedule(batch_size, None)
    return PlanSpec(
        names=names,
        mixture=parse_mixture_schedule(None, names, dict(weights)),
        mixture_unit="tokens",
        row_length=row_length,
        packing="best_fit",
        shift=True,
        shift_target=True,
        seed=0,
        shuffle=True,
        batch=batch,
        streams=auto_streams([batch_size]),
    )


class _PlannedBatches:
    """Iterates one host's planned batches (what a worker or the prefetch thread runs)."""

    def __init__(self, dataset: PlannedBatchDataset):
        self._dataset = dataset
        self._step = 0

    def __next__(self) -> dict[str, np.ndarray]:
        element = self._dataset[self._step]
        self._step += 1
        return element["batch"]


def _throughput(tiny: bool) -> dict[str, Any]:
    corpus = common.lognormal_corpus(tiny)
    web = corpus["web"]
    files = {"web": common.prepare_corpus(web)}
    sizes = throughput.TINY if tiny else throughput.FULL
    batch_size = sizes.batch_size
    source = ArrayRecordSource(files["web"])
    # The bench corpus has no prepare index; its lengths are read once here.
    lengths = np.array([len(source[i]["tokens"]) for i in range(len(source))])
    plan = GlobalPlan(_spec(batch_size, ("web",), {"web": 1.0}, sizes.seq_len), [lengths])
    variant = throughput.Variant(mixture=False, packed=True, workers=0)
    mesh = common.single_device_mesh()

    def planned() -> Any:
        return _PlannedBatches(PlannedBatchDataset(plan, [source], 0, 1, eod_token_id=1))

    def grain_baseline() -> Any:
        pipeline = throughput.grain_pipeline(
            files, None, {"web": 0}, {"web": web.max_length or 1 << 20}, variant, sizes
        )
        return iter(pipeline)

    def streaming() -> Any:
        iterator = common.our_iterator(
            files,
            None,
            {"web": 0},
            seq_len=sizes.seq_len,
            batch_size=batch_size,
            packed=True,
            workers=0,
            mesh=mesh,
        )
        return iter(iterator.dataloader)

    rates = throughput._paired_host_rates(  # noqa: SLF001 - the same turn-taking timer
        {"planned": planned, "streaming": streaming, "grain": grain_baseline},
        {
            "planned": "targets_segmentation",
            "streaming": "targets_segmentation",
            "grain": "targets_segment_ids",
        },
        sizes,
    )
    tokens_per_sec = {name: rate for name, (rate, _) in rates.items()}
    return {
        "tokens_per_sec": tokens_per_sec,
        "cpu_secs_per_million_tokens": {name: cpu for name, (_, cpu) in rates.items()},
        "planned_over_grain": tokens_per_sec["planned"] / tokens_per_sec["grain"],
        "streaming_over_grain": tokens_per_sec["streaming"] / tokens_per_sec["grain"],
    }


def _synthetic_lengths(documents: int) -> np.ndarray:
    rng = np.random.default_rng(0)
    return np.minimum(rng.lognormal(np.log(512.0), 1.0, documents), 1 << 16).astype(np.int32)


def _resume_secs(plan: GlobalPlan, step: int, repeats: int) -> dict[str, Any]:
    first_row, _ = plan.stream_rows(step)
    documents = first_row * SEQ_LEN * 0.98 / float(plan.mean_tokens[0])
    cursor = Cursor(int(documents // 2048), first_row, (int(documents),), (0,), ((-1, 0),))
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        planner = HostPlanner(plan, 0, 1, dict.fromkeys(range(plan.streams), cursor))
        planner.pieces_at(step)
        times.append(time.perf_counter() - started)
    return common.summarize(times)


def _planning_ms_per_step(lengths: np.ndarray, hosts: int, steps: int) -> float:
    spec = _spec(8 * hosts, ("web",), {"web": 1.0})
    spec = PlanSpec(**{**spec.__dict__, "streams": auto_streams([8 * hosts])})
    planner = HostPlanner(GlobalPlan(spec, [lengths]), 0, hosts)
    started = time.process_time()
    for step in range(steps):
        planner.pieces_at(step)
    return (time.process_time() - started) / steps * 1e3


def run(config: common.BenchConfig) -> dict[str, Any]:
    started = time.perf_counter()
    tiny = config.tiny
    lengths = _synthetic_lengths(10_000 if tiny else 1_000_000)
    plan = GlobalPlan(_spec(64, ("web",), {"web": 1.0}), [lengths])
    repeats = 2 if tiny else 5
    resume = {str(step): _resume_secs(plan, step, repeats) for step in (10, 10**7)}
    ratio = resume[str(10**7)]["median"] / resume["10"]["median"]
    steps = 5 if tiny else 60
    planning = {
        str(h): _planning_ms_per_step(lengths, h, steps)
        for h in (HOST_COUNTS[:4] if tiny else HOST_COUNTS)
    }
    rates = _throughput(tiny)
    targets = [
        common.target(
            "planned_over_grain",
            rates["planned_over_grain"],
            ">=",
            2.5,
            "planned host pipeline >= 2.5x the hand-written grain pipeline (tokens/s)",
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
        "throughput": rates,
        "resume_secs": resume,
        "resume_10M_over_10": ratio,
        "planning_ms_per_step_by_hosts": planning,
        "rows_per_host": 8,
        "targets": targets,
    }
    return common.write_result(config, NAME, payload, started)


def summary(result: Mapping[str, Any]) -> list[tuple[str, str, str, str]]:
    """Rows (figure, value, target, met) for the summary table."""
    met = {t["metric"]: t["met"] for t in result["targets"]}
    rates = result["throughput"]["tokens_per_sec"]
    rows = [
        (
            "planned host pipeline / grain",
            f"{result['throughput']['planned_over_grain']:.2f}x "
            f"({rates['planned'] / 1e6:.2f} vs {rates['grain'] / 1e6:.2f} M tok/s)",
            ">= 2.5x",
            "yes" if met["planned_over_grain"] else "NO",
        ),
        (
            "streaming pipeline / grain",
            f"{result['throughput']['streaming_over_grain']:.2f}x",
            "-",
            "-",
        ),
    ]
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
    for hosts, ms in result["planning_ms_per_step_by_hosts"].items():
        rows.append((f"planning per host, {hosts} hosts", f"{ms:.2f} ms/step", "-", "-"))
    return rows
