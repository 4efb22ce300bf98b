"""Tokens per second of our host pipeline against plain grain and a read-only ceiling.

Over the prepared lognormal ArrayRecord corpus, for every variant (packed or
padded rows, 0 or 2 grain worker processes, one source or the 3-source
mixture), four subjects run in the same process, in rotating order, for
several rounds:

- `ceiling`: read and decode the same records (shuffled, mixed), nothing else;
  in this process, without workers.
- `grain`: a hand-written pipeline of the same steps with grain's public API:
  read, decode, shuffle, repeat, split long documents and shift
  (`FlatMapIterDataset`), first-fit pack (`FirstFitPackIterDataset`) or pad,
  mix (`IterDataset.mix`), batch, and `mp_prefetch` with workers.
- `ours_host`: our host pipeline, the plan's host steps that the iterator of
  `make_grain_multihost_iterator` iterates (host numpy batches, before any
  device transfer; `common.OurHostSteps`: its chunks, from its workers' slots
  when it has workers).
- `ours_global`: the full `PlannedDataIterator` (global jax.Arrays on a
  one-device mesh, background prefetch).

`grain` and `ours_host` take turns, `TURN_BATCHES` at a time, so both see the
same moments of the shared machine. Tokens are non-padding target tokens, which
equal the documents' tokens for every pipeline, so all figures are comparable.
Ratios are taken per round (paired) and reported as median with min and max.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping
from typing import Any

import grain
import numpy as np

import xlstm_data as xd
from bench import common

NAME = "throughput"
EOD = 1
TARGET_RATIO = 0.95
SUBJECTS = ("ceiling", "grain", "ours_host", "ours_global")
#: Subjects measured taking turns (see `_paired_host_rates`), with CPU time too.
CPU_SUBJECTS = ("grain", "ours_host")
#: The grain baseline reads ahead in 2 threads, 64 documents (grain's own
#: default, 16 threads and 500 documents, cost most of its CPU on local files).
BASELINE_READ_OPTIONS = grain.ReadOptions(num_threads=2, prefetch_buffer_size=64)


@dataclasses.dataclass(frozen=True)
class Sizes:
    seq_len: int
    batch_size: int
    warmup_batches: int
    timed_batches: int
    repeats: int
    ceiling_warmup: int
    ceiling_records: int


FULL = Sizes(1024, 8, 10, 300, 11, 200, 10_000)
#: Two rounds: the second iterates the host pipeline's dataset again, as a full run does.
TINY = Sizes(128, 4, 2, 6, 2, 20, 200)


@dataclasses.dataclass(frozen=True)
class Variant:
    mixture: bool
    packed: bool
    workers: int

    @property
    def name(self) -> str:
        rows = "packed" if self.packed else "padded"
        sources = "3src" if self.mixture else "1src"
        return f"{rows}-w{self.workers}-{sources}"


def variants(tiny: bool) -> list[Variant]:
    if tiny:  # packed, padded, 1 and 3 sources, workers: each at least once, in 3 runs
        return [
            Variant(False, True, 0),
            Variant(True, False, 0),
            Variant(True, True, 2),
        ]
    return [
        Variant(mixture, packed, workers)
        for mixture in (False, True)
        for packed in (True, False)
        for workers in (0, 2)
    ]


# ----------------------------------------------------------------------------
# The hand-written grain baseline (public grain API only).
# ----------------------------------------------------------------------------


class DecodeTokens(grain.transforms.Map):
    """ArrayRecord bytes to `{"tokens": int32[n]}`."""

    def map(self, element: bytes) -> dict[str, np.ndarray]:
        return {"tokens": np.frombuffer(element, dtype="<i4")}


class SplitAndShift(grain.experimental.FlatMapTransform):
    """Document + EOD, cut into windows of `length`; targets are inputs shifted left."""

    def __init__(self, length: int, eod: int, max_fan_out: int):
        self.length = length
        self.eod = eod
        self.max_fan_out = max_fan_out

    def flat_map(self, element: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
        stream = np.concatenate([element["tokens"], np.array([self.eod], dtype=np.int32)])
        last = len(stream) - 1
        return [
            {
                "inputs": stream[start : min(start + self.length, last)],
                "targets": stream[start + 1 : min(start + self.length, last) + 1],
            }
            for start in range(0, last, self.length)
        ]


class PadRow(grain.transforms.Map):
    """One example per row, padded, with grain-style segment ids and positions."""

    def __init__(self, length: int):
        self.length = length

    def map(self, element: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = {}
        for feature in ("inputs", "targets"):
            values = element[feature]
            n = len(values)
            padded = np.zeros(self.length, dtype=np.int32)
            padded[:n] = values
            segment_ids = np.zeros(self.length, dtype=np.int32)
            segment_ids[:n] = 1
            positions = np.zeros(self.length, dtype=np.int32)
            positions[:n] = np.arange(n, dtype=np.int32)
            out[feature] = padded
            out[f"{feature}_segment_ids"] = segment_ids
            out[f"{feature}_positions"] = positions
        return out


def grain_pipeline(
    files: Mapping[str, list[str]],
    weights: Mapping[str, float] | None,
    seeds: Mapping[str, int],
    max_lengths: Mapping[str, int],
    variant: Variant,
    sizes: Sizes,
) -> grain.IterDataset:
    """The same steps as ours, written directly against grain's public API."""
    components = {}
    for name, paths in files.items():
        docs = (
            grain.MapDataset.source(grain.sources.ArrayRecordDataSource(paths))
            .map(DecodeTokens())
            .shuffle(seed=seeds[name])
            .repeat(None)
            .to_iter_dataset(BASELINE_READ_OPTIONS)
        )
        fan_out = math.ceil((max_lengths[name] + 1) / sizes.seq_len) + 1
        examples = grain.experimental.FlatMapIterDataset(
            docs, SplitAndShift(sizes.seq_len, EOD, fan_out)
        )
        if variant.packed:
            rows = grain.experimental.FirstFitPackIterDataset(
                examples,
                length_struct={"inputs": sizes.seq_len, "targets": sizes.seq_len},
                num_packing_bins=sizes.batch_size,
                seed=seeds[name],
            )
        else:
            rows = examples.map(PadRow(sizes.seq_len))
        components[name] = rows
    if len(components) == 1:
        mixed = next(iter(components.values()))
    else:
        mixed = grain.IterDataset.mix(components, weights=dict(weights))
    batches = mixed.batch(sizes.batch_size, drop_remainder=True)
    if variant.workers:
        batches = batches.mp_prefetch(
            grain.MultiprocessingOptions(num_workers=variant.workers, per_worker_buffer_size=1)
        )
    return batches


# ----------------------------------------------------------------------------
# Measuring.
# ----------------------------------------------------------------------------


#: Batches timed per turn when the grain baseline and our host pipeline take
#: turns: both see the same moments of a shared machine, so their ratio is
#: steadier than that of two runs one after the other.
TURN_BATCHES = 20


def _paired_host_rates(
    make_iterators: Mapping[str, Callable[[], Any]],
    token_fields: Mapping[str, str],
    sizes: Sizes,
) -> dict[str, tuple[float, float]]:
    """Tokens/s and CPU seconds per million tokens of pipelines taking turns.

    Each pipeline is warmed up, then they alternate `TURN_BATCHES` at a time
    until each has produced `sizes.timed_batches`. A pipeline that is not
    taking its turn is idle: its readers and workers stop once their buffers
    are full. CPU time counts this process and its live worker processes.
    """
    iterators = {}
    try:
        for name, make in make_iterators.items():
            iterators[name] = make()
            for _ in range(sizes.warmup_batches):
                next(iterators[name])
        elapsed = dict.fromkeys(iterators, 0.0)
        cpu = dict.fromkeys(iterators, 0.0)
        tokens = dict.fromkeys(iterators, 0)
        done = 0
        while done < sizes.timed_batches:
            turn = min(TURN_BATCHES, sizes.timed_batches - done)
            for name, iterator in iterators.items():
                field = token_fields[name]
                started, cpu_started = time.perf_counter(), common.cpu_secs()
                for _ in range(turn):
                    tokens[name] += int(np.count_nonzero(next(iterator)[field]))
                elapsed[name] += time.perf_counter() - started
                cpu[name] += common.cpu_secs() - cpu_started
            done += turn
        return {
            name: (tokens[name] / elapsed[name], cpu[name] / tokens[name] * 1e6)
            for name in iterators
        }
    finally:
        for iterator in iterators.values():
            common.close_iterator(iterator)


def _global_tokens_per_sec(make_iterator: Callable[[], Any], sizes: Sizes) -> float:
    iterator = make_iterator()
    try:
        for _ in range(sizes.warmup_batches):
            next(iterator)
        # Its workers' start is timed by plan_mixture; here, the steady state.
        common.wait_for_workers(iterator._resources.pipeline)  # noqa: SLF001
        return common.counted_tokens_per_sec(iterator, sizes.timed_batches)
    finally:
        iterator.close()


def _ceiling_tokens_per_sec(
    files: Mapping[str, list[str]],
    weights: Mapping[str, float] | None,
    seeds: Mapping[str, int],
    sizes: Sizes,
) -> float:
    """Reads and decodes the records in the pipelines' order; nothing else."""
    datasets = [
        grain.MapDataset.source(grain.sources.ArrayRecordDataSource(paths)).shuffle(
            seed=seeds[name]
        )
        for name, paths in files.items()
    ]
    if len(datasets) == 1:
        records = datasets[0]
    else:
        records = grain.MapDataset.mix(datasets, weights=[weights[name] for name in files])
    n = len(records)
    for i in range(sizes.ceiling_warmup):
        np.frombuffer(records[i % n], dtype="<i4")
    started = time.perf_counter()
    tokens = 0
    for i in range(sizes.ceiling_warmup, sizes.ceiling_warmup + sizes.ceiling_records):
        tokens += np.frombuffer(records[i % n], dtype="<i4").size
    return tokens / (time.perf_counter() - started)


def _ratios(numerator: list[float], denominator: list[float]) -> dict[str, Any]:
    return common.summarize([a / b for a, b in zip(numerator, denominator, strict=True)])


def _cpu_ratios(grain_cpu: list[float], ours_cpu: list[float]) -> dict[str, Any] | None:
    """grain/ours CPU per token over the rounds where both used measurable CPU.

    psutil's CPU clock ticks every 10 ms, so a tiny run can read 0; None then.
    """
    rounds = [(g, o) for g, o in zip(grain_cpu, ours_cpu, strict=True) if g > 0 and o > 0]
    return _ratios(*map(list, zip(*rounds, strict=True))) if rounds else None


def measure_variant(
    variant: Variant,
    files: Mapping[str, list[str]],
    weights: Mapping[str, float] | None,
    seeds: Mapping[str, int],
    max_lengths: Mapping[str, int],
    sizes: Sizes,
    mesh: Any,
) -> dict[str, Any]:
    """All subjects of one variant, `sizes.repeats` rounds in rotating order."""

    def ours() -> xd.PlannedDataIterator:
        return common.our_iterator(
            files,
            weights,
            seeds,
            seq_len=sizes.seq_len,
            batch_size=sizes.batch_size,
            packed=variant.packed,
            workers=variant.workers,
            mesh=mesh,
            eod_token_id=EOD,
        )

    # The host pipeline is the plan's host steps of our iterator, iterated
    # afresh (new worker processes) in every round. The first iterator built
    # is also the first round's `ours_global` (it is idle until then: it
    # prefetches only once asked), so no workers are spawned in vain.
    first_global = [ours()]
    host_dataset = common.OurHostSteps(first_global[0])

    def ours_global() -> xd.PlannedDataIterator:
        return first_global.pop() if first_global else ours()

    baseline = grain_pipeline(files, weights, seeds, max_lengths, variant, sizes)

    paired = {"grain": lambda: iter(baseline), "ours_host": lambda: iter(host_dataset)}
    paired_fields = {"grain": "targets_segment_ids", "ours_host": "targets_segmentation"}
    measure = {
        "ceiling": lambda _: {"ceiling": _ceiling_tokens_per_sec(files, weights, seeds, sizes)},
        "grain+ours_host": lambda round_index: _paired_host_rates(
            dict(common.rotated(list(paired.items()), round_index)), paired_fields, sizes
        ),
        "ours_global": lambda _: {"ours_global": _global_tokens_per_sec(ours_global, sizes)},
    }
    values: dict[str, list[float]] = {s: [] for s in SUBJECTS}
    cpu: dict[str, list[float]] = {s: [] for s in CPU_SUBJECTS}
    try:
        common.measure_rounds(measure, sizes.repeats, values, cpu, f"throughput {variant.name}")
    finally:
        for iterator in first_global:  # not measured (an error happened first)
            iterator.close()
    return {
        "sources": list(files),
        "weights": dict(weights) if weights else None,
        "packed": variant.packed,
        "worker_count": variant.workers,
        "tokens_per_sec": {s: common.summarize(v) for s, v in values.items()},
        "ours_over_grain": _ratios(values["ours_host"], values["grain"]),
        "ours_over_ceiling": _ratios(values["ours_host"], values["ceiling"]),
        "grain_over_ceiling": _ratios(values["grain"], values["ceiling"]),
        "ours_global_over_grain": _ratios(values["ours_global"], values["grain"]),
        "cpu_secs_per_million_tokens": {s: common.summarize(v) for s, v in cpu.items()},
        "grain_cpu_over_ours_cpu": _cpu_ratios(cpu["grain"], cpu["ours_host"]),
    }


def run(config: common.BenchConfig) -> dict[str, Any]:
    """Measures every variant and writes throughput.json and throughput.png."""
    started = time.perf_counter()
    common.ensure_flags_parsed()
    sizes = TINY if config.tiny else FULL
    specs = common.lognormal_corpus(config.tiny)
    files = {name: common.prepare_corpus(spec) for name, spec in specs.items()}
    seeds = {name: spec.seed for name, spec in specs.items()}
    max_lengths = {name: spec.max_length for name, spec in specs.items()}
    mesh = common.single_device_mesh()
    results, targets = {}, []
    for variant in variants(config.tiny):
        names = list(specs) if variant.mixture else ["web"]
        weights = {n: common.MIXTURE_WEIGHTS[n] for n in names} if variant.mixture else None
        result = measure_variant(
            variant,
            {n: files[n] for n in names},
            weights,
            seeds,
            max_lengths,
            sizes,
            mesh,
        )
        results[variant.name] = result
        targets.append(
            common.target(
                f"{variant.name}.ours_over_grain",
                result["ours_over_grain"]["median"],
                ">=",
                TARGET_RATIO,
                f"ours/grain tokens/s >= {TARGET_RATIO} ({variant.name})",
            )
        )
    payload = {
        "settings": {
            **dataclasses.asdict(sizes),
            "eod_token_id": EOD,
            "packing_bins": sizes.batch_size,
            "read_options": {
                "num_threads": BASELINE_READ_OPTIONS.num_threads,
                "prefetch_buffer_size": BASELINE_READ_OPTIONS.prefetch_buffer_size,
                "applies_to": "grain baseline and ours (library default)",
            },
            "corpus": {name: dataclasses.asdict(spec) for name, spec in specs.items()},
            "token": "non-padding target tokens (= document tokens)",
            "ceiling": "in-process read+decode of the same shuffled (mixed) records",
        },
        "variants": results,
        "targets": targets,
        "png": _plot(config, results),
    }
    return common.write_result(config, NAME, payload, started)


def _plot(config: common.BenchConfig, results: Mapping[str, Any]) -> str:
    figure = common.new_figure(figsize=(10, 4.5))
    ax = figure.add_subplot()
    names = list(results)
    width = 0.8 / len(SUBJECTS)
    for k, subject in enumerate(SUBJECTS):
        stats = [results[n]["tokens_per_sec"][subject] for n in names]
        medians, errors = common.error_bars(stats, scale=1e6)
        x = np.arange(len(names)) + (k - (len(SUBJECTS) - 1) / 2) * width
        ax.bar(x, medians, width, yerr=errors, capsize=2, label=subject)
    ax.set_xticks(np.arange(len(names)), names, rotation=20, ha="right")
    ax.set_ylabel("million tokens / s (median, min-max)")
    ax.set_yscale("log")
    ax.set_title(f"Host pipeline throughput ({config.mode} mode)")
    ax.legend(fontsize=8)
    return common.save_figure(config, NAME, figure)


def summary(result: Mapping[str, Any]) -> list[tuple[str, str, str, str]]:
    """Rows (figure, value, target, met) for the summary table."""
    rows = []
    met = {t["metric"]: t["met"] for t in result["targets"]}
    for name, variant in result["variants"].items():
        ratio = variant["ours_over_grain"]
        ceiling = variant["ours_over_ceiling"]["median"]
        tokens = variant["tokens_per_sec"]["ours_host"]["median"] / 1e6
        cpu_ratio = variant["grain_cpu_over_ours_cpu"]
        cpu = "n/a" if cpu_ratio is None else f"{cpu_ratio['median']:.2f}"
        rows.append(
            (
                f"ours/grain {name}",
                f"{ratio['median']:.2f} ({ratio['min']:.2f}-{ratio['max']:.2f}); "
                f"{tokens:.2f}M tok/s; ours/ceiling {ceiling:.2f}; grain/ours CPU {cpu}",
                f">= {TARGET_RATIO}",
                "yes" if met[f"{name}.ours_over_grain"] else "NO",
            )
        )
    return rows
