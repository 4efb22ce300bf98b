"""Throughput of the planned pipeline against grain and the read ceiling.

Issue 14's table: non-padding tokens/s on the lognormal ArrayRecord corpus
(rows of 1024, host batch 8, packed), with 0 and 2 worker processes, one
source (`web`) and the 3-source mixture (tokens 0.80/0.15/0.05), of

- `planned`: the host pipeline of the config path's iterator
  (`PlannedDataIterator`'s grain dataset: `PlannedBatchDataset`, in worker
  processes when there are workers), before any device transfer;
- `grain`: the hand-written grain pipeline of `throughput.grain_pipeline`
  (first-fit packing into 8 bins, `IterDataset.mix` of rows);
- `ceiling`: reading and decoding shuffled records one at a time with grain's
  `ArrayRecordDataSource`, nothing else, in this process (as `throughput`);
  for the mixture the records are mixed in proportion to the plan's token
  weights divided by each source's mean document length, so it reads the
  same token mix as the planned pipeline;
- `ceiling_batched`: the same records in the same order, read as the planned
  pipeline reads them: `ArrayRecordSource.read_many`, one call per source for
  each group of as many records as a batch holds on average (decoded and
  checked); the ceiling of a batched reader, reported beside the target's;
- `planned_global`: the whole `PlannedDataIterator` (global `jax.Array`s on
  one CPU device, background prefetch), tokens from its counters.

`grain` and `planned` take turns `throughput.TURN_BATCHES` at a
time within a round; ratios are taken per round and reported as median with
min and max. Each paired subject also records its CPU seconds per million
tokens (this process plus its workers) and its non-padding share.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator, Mapping
from typing import Any

import grain
import numpy as np

from bench import common, throughput
from xlstm_data.multihost.iterator import PlannedDataIterator
from xlstm_data.multihost.shared_slots import owned
from xlstm_data.plan.global_plan import GlobalPlan
from xlstm_data.reading.row_assembly import fields_of
from xlstm_data.sources import ArrayRecordSource

NAME = "plan_throughput"
EOD = throughput.EOD
SUBJECTS = ("ceiling", "ceiling_batched", "grain", "planned", "planned_global")
PAIRED = ("grain", "planned")
TARGET_OVER_GRAIN = 2.5
TARGET_OVER_CEILING = 0.6
#: Rounds of every variant (each round: every subject once, rotating order).
ROUNDS, ROUNDS_TINY = 5, 1


@dataclasses.dataclass(frozen=True)
class Variant:
    mixture: bool
    workers: int

    @property
    def name(self) -> str:
        return f"w{self.workers}-{'3src' if self.mixture else '1src'}"


def variants(tiny: bool) -> list[Variant]:
    if tiny:  # worker processes take seconds to start; `throughput`'s tiny run has them
        return [Variant(False, 0), Variant(True, 0)]
    return [Variant(mixture, workers) for mixture in (False, True) for workers in (0, 2)]


def document_lengths(source: ArrayRecordSource, chunk: int = 4096) -> np.ndarray:
    """Every document's length, read once (the bench corpus has no prepare index)."""
    return np.concatenate(
        [
            np.fromiter(
                (len(t) for t in source.read_many(np.arange(i, min(i + chunk, len(source))))),
                dtype=np.int64,
            )
            for i in range(0, len(source), chunk)
        ]
    )


class _Batches:
    """The batches of a planned host pipeline's elements (which also carry cursors)."""

    def __init__(self, elements: Iterator[Mapping[str, Any]]):
        self._elements = elements

    def __next__(self) -> Mapping[str, np.ndarray]:
        # A worker's chunk arrives lent from its slot (`SlotRing.lease`): copied out and freed.
        return fields_of(owned(next(self._elements))["fields"])

    def close(self) -> None:
        common.close_iterator(self._elements)


def _turns(
    iterators: Mapping[str, Any],
    fields: Mapping[str, str],
    slots: dict[str, dict[str, int]],
    sizes: throughput.Sizes,
) -> dict[str, tuple[float, float]]:
    """Tokens/s and CPU s per million tokens of pipelines taking turns, as `throughput`'s.

    The pipelines take turns `throughput.TURN_BATCHES` batches at a time until
    each has produced `sizes.timed_batches`; an idle one's readers and workers
    stop once their buffers are full. Also counts each one's slots and
    non-padding slots into `slots`.
    """
    elapsed = dict.fromkeys(iterators, 0.0)
    cpu = dict.fromkeys(iterators, 0.0)
    tokens = dict.fromkeys(iterators, 0)
    done = 0
    while done < sizes.timed_batches:
        turn = min(throughput.TURN_BATCHES, sizes.timed_batches - done)
        for name, iterator in iterators.items():
            field = fields[name]
            started, cpu_started = time.perf_counter(), common.cpu_secs()
            for _ in range(turn):
                batch = next(iterator)[field]
                tokens[name] += int(np.count_nonzero(batch))
                slots[name]["slots"] += batch.size
            elapsed[name] += time.perf_counter() - started
            cpu[name] += common.cpu_secs() - cpu_started
        done += turn
    for name in iterators:
        slots[name]["tokens"] += tokens[name]
    return {
        name: (tokens[name] / elapsed[name], cpu[name] / tokens[name] * 1e6) for name in iterators
    }


def _ceiling_order(
    files: Mapping[str, list[str]],
    weights: Mapping[str, float] | None,
    seeds: Mapping[str, int],
    count: int,
) -> list[tuple[int, int]]:
    """`(source, record)` of the ceiling's first `count` reads, in its order.

    The same grain shuffles (and mix) as `throughput._ceiling_tokens_per_sec`,
    over record indices instead of records.
    """
    datasets = []
    for k, (name, paths) in enumerate(files.items()):
        size = len(grain.sources.ArrayRecordDataSource(paths))
        datasets.append(
            grain.MapDataset.range(size).shuffle(seed=seeds[name]).map(lambda i, k=k: (k, i))
        )
    if len(datasets) == 1:
        order = datasets[0]
    else:
        order = grain.MapDataset.mix(datasets, weights=[weights[name] for name in files])
    return [order[i % len(order)] for i in range(count)]


def _batched_ceiling_tokens_per_sec(
    sources: list[ArrayRecordSource],
    order: list[tuple[int, int]],
    group: int,
    sizes: throughput.Sizes,
) -> float:
    """Reads the records of `order` `group` at a time, one `read_many` per source."""

    def read(records: list[tuple[int, int]]) -> int:
        tokens = 0
        for k, source in enumerate(sources):
            wanted = [i for s, i in records if s == k]
            if wanted:
                tokens += sum(t.size for t in source.read_many(wanted))
        return tokens

    warmup, timed = order[: sizes.ceiling_warmup], order[sizes.ceiling_warmup :]
    read(warmup)
    groups = [timed[i : i + group] for i in range(0, len(timed), group)]
    started = time.perf_counter()
    tokens = sum(read(records) for records in groups)
    return tokens / (time.perf_counter() - started)


def _global_tokens_per_sec(iterator: PlannedDataIterator, sizes: throughput.Sizes) -> float:
    """Tokens/s of the whole iterator (global arrays), from its own counters."""
    return common.counted_tokens_per_sec(iterator, sizes.timed_batches)


def measure_variant(
    variant: Variant, specs: Mapping[str, common.CorpusSpec], sizes: throughput.Sizes, rounds: int
) -> dict[str, Any]:
    """Every subject of one variant, `rounds` rounds in rotating order."""
    names = tuple(specs) if variant.mixture else ("web",)
    weights = {n: common.MIXTURE_WEIGHTS[n] for n in names} if variant.mixture else {"web": 1.0}
    files = {n: common.prepare_corpus(specs[n]) for n in names}
    seeds = {n: specs[n].seed for n in names}
    max_lengths = {n: specs[n].max_length for n in names}
    sources = [ArrayRecordSource(files[n]) for n in names]
    spec = common.plan_spec(names, weights, sizes.batch_size, sizes.seq_len)
    plan = GlobalPlan(spec, [document_lengths(s) for s in sources])
    mesh = common.single_device_mesh()
    grain_variant = throughput.Variant(variant.mixture, packed=True, workers=variant.workers)
    mixture = weights if variant.mixture else None
    # Records mixed so that the ceiling reads the plan's token shares.
    record_weights = {n: weights[n] / specs[n].mean_length for n in names}

    # Batched ceiling: the ceiling's records, as many per read as a batch holds.
    order = _ceiling_order(
        files,
        record_weights if variant.mixture else None,
        seeds,
        sizes.ceiling_warmup + sizes.ceiling_records,
    )
    record_tokens = sum(record_weights[n] * specs[n].mean_length for n in names) / sum(
        record_weights.values()
    )
    group = max(1, round(sizes.batch_size * sizes.seq_len / record_tokens))

    def planned_global() -> PlannedDataIterator:
        return PlannedDataIterator(
            plan, sources, mesh, eod_token_id=EOD, worker_count=variant.workers
        )

    # The host pipeline is the one the iterator itself iterates (a new one per call).
    first = planned_global()
    first.close()

    def host_pipeline() -> Any:
        return first._pipeline(0, None)  # noqa: SLF001

    baseline = throughput.grain_pipeline(files, mixture, seeds, max_lengths, grain_variant, sizes)
    fields = {"grain": "targets_segment_ids", "planned": "targets_segmentation"}
    slots = {name: {"slots": 0, "tokens": 0} for name in PAIRED}
    values: dict[str, list[float]] = {s: [] for s in SUBJECTS}
    cpu: dict[str, list[float]] = {s: [] for s in PAIRED}
    # Built once and timed over every round: closing a grain pipeline with
    # workers can wait up to 25 s for each worker process to stop.
    iterators: dict[str, Any] = {}
    try:
        iterators["grain"] = iter(baseline)
        iterators["planned"] = _Batches(host_pipeline())
        iterators["planned_global"] = planned_global()
        for iterator in iterators.values():
            for _ in range(sizes.warmup_batches):
                next(iterator)
        measure = {
            "ceiling": lambda _: {
                "ceiling": throughput._ceiling_tokens_per_sec(  # noqa: SLF001
                    files, record_weights if variant.mixture else None, seeds, sizes
                )
            },
            "ceiling_batched": lambda _: {
                "ceiling_batched": _batched_ceiling_tokens_per_sec(sources, order, group, sizes)
            },
            "paired": lambda round_index: _turns(
                {name: iterators[name] for name in common.rotated(PAIRED, round_index)},
                fields,
                slots,
                sizes,
            ),
            "planned_global": lambda _: {
                "planned_global": _global_tokens_per_sec(iterators["planned_global"], sizes)
            },
        }
        common.measure_rounds(measure, rounds, values, cpu, f"plan_throughput {variant.name}")
    finally:
        for iterator in iterators.values():
            common.close_iterator(iterator)

    def ratio(numerator: str, denominator: str) -> dict[str, Any]:
        return throughput._ratios(values[numerator], values[denominator])  # noqa: SLF001

    return {
        "sources": list(names),
        "token_weights": weights,
        "worker_count": variant.workers,
        "tokens_per_sec": {s: common.summarize(v) for s, v in values.items()},
        "planned_over_grain": ratio("planned", "grain"),
        "planned_over_ceiling": ratio("planned", "ceiling"),
        "planned_over_ceiling_batched": ratio("planned", "ceiling_batched"),
        "ceiling_batched_over_ceiling": ratio("ceiling_batched", "ceiling"),
        "records_per_batched_read": group,
        "grain_over_ceiling": ratio("grain", "ceiling"),
        "planned_global_over_grain": ratio("planned_global", "grain"),
        "planned_global_over_planned": ratio("planned_global", "planned"),
        "cpu_secs_per_million_tokens": {s: common.summarize(v) for s, v in cpu.items()},
        "non_padding_share": {
            name: c["tokens"] / c["slots"] for name, c in slots.items() if c["slots"]
        },
    }


def run(config: common.BenchConfig) -> dict[str, Any]:
    started = time.perf_counter()
    common.ensure_flags_parsed()
    sizes = throughput.TINY if config.tiny else throughput.FULL
    rounds = ROUNDS_TINY if config.tiny else ROUNDS
    specs = common.lognormal_corpus(config.tiny)
    results, targets = {}, []
    for variant in variants(config.tiny):
        result = measure_variant(variant, specs, sizes, rounds)
        results[variant.name] = result
        targets.append(
            common.target(
                f"{variant.name}.planned_over_grain",
                result["planned_over_grain"]["median"],
                ">=",
                TARGET_OVER_GRAIN,
                f"planned host pipeline >= {TARGET_OVER_GRAIN}x grain's tokens/s ({variant.name})",
            )
        )
        targets.append(
            common.target(
                f"{variant.name}.planned_over_ceiling",
                result["planned_over_ceiling"]["median"],
                ">=",
                TARGET_OVER_CEILING,
                f"planned host pipeline >= {TARGET_OVER_CEILING} of the read+decode ceiling "
                f"({variant.name})",
            )
        )
    payload = {
        "settings": {
            **dataclasses.asdict(sizes),
            "rounds": rounds,
            "eod_token_id": EOD,
            "planned_packing": "best_fit",
            "grain_packing": f"first fit, {sizes.batch_size} bins",
            "corpus": {name: dataclasses.asdict(spec) for name, spec in specs.items()},
            "token": "non-padding target tokens (= document tokens)",
        },
        "variants": results,
        "targets": targets,
    }
    return common.write_result(config, NAME, payload, started)


def summary(result: Mapping[str, Any]) -> list[tuple[str, str, str, str]]:
    """Rows (figure, value, target, met) for the summary table."""
    met = {t["metric"]: t["met"] for t in result["targets"]}
    rows = []
    for name, variant in result["variants"].items():
        rates = variant["tokens_per_sec"]
        for key, goal in (
            ("planned_over_grain", f">= {TARGET_OVER_GRAIN}"),
            ("planned_over_ceiling", f">= {TARGET_OVER_CEILING}"),
        ):
            stats = variant[key]
            rows.append(
                (
                    f"{key} {name}",
                    f"{stats['median']:.2f} ({stats['min']:.2f}-{stats['max']:.2f}); planned "
                    f"{rates['planned']['median'] / 1e6:.2f}M tok/s",
                    goal,
                    "yes" if met[f"{name}.{key}"] else "NO",
                )
            )
        for key in (
            "planned_over_ceiling_batched",
            "planned_global_over_grain",
        ):
            stats = variant[key]
            rows.append(
                (
                    f"{key} {name}",
                    f"{stats['median']:.2f} ({stats['min']:.2f}-{stats['max']:.2f})",
                    "-",
                    "-",
                )
            )
    return rows
