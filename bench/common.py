"""Helpers shared by the benchmarks: repeats, statistics, targets, JSON, corpora.

Every benchmark times its subject and its baseline in the same process,
repeats both, and reports a median with min and max. The lognormal corpus is
written once as ArrayRecord files (from `SyntheticSource` documents, with
`write_array_record`) into a cache directory keyed by its parameters, so
later runs and the tests reuse it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import hashlib
import json
import math
import os
import platform
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from absl import flags, logging

#: Where prepared corpora are cached (override with this environment variable).
CACHE_ENV = "XLSTM_DATA_BENCH_CACHE"


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    """How a benchmark runs.

    Attributes:
      out_dir: Directory for the JSON and PNG results.
      tiny: Smoke-test sizes (seconds, not minutes); figures are meaningless.
      command: The command line that produced the results (stored in the JSON).
    """

    out_dir: Path
    tiny: bool = False
    command: str = ""

    @property
    def mode(self) -> str:
        return "tiny" if self.tiny else "full"


# ----------------------------------------------------------------------------
# Statistics and timing.
# ----------------------------------------------------------------------------


def summarize(values: Sequence[float]) -> dict[str, Any]:
    """Median, min, max and the raw values of repeated measurements."""
    values = [float(v) for v in values]
    if not values:
        raise ValueError("no measurements to summarize")
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "values": values,
    }


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    """Calls `fn()` and returns its result and the wall time in seconds."""
    started = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - started


def rotated(items: Sequence[Any], round_index: int) -> list[Any]:
    """`items` rotated by `round_index`, so no subject always runs first."""
    if not items:
        return []
    k = round_index % len(items)
    return list(items[k:]) + list(items[:k])


def measure_rounds(
    measure: Mapping[str, Callable[[int], Mapping[str, Any]]],
    rounds: int,
    values: dict[str, list[float]],
    cpu: dict[str, list[float]],
    label: str,
) -> None:
    """Runs every unit of `measure` once per round, in rotated order, collecting results.

    A unit returns `{subject: tokens/s}`, or `{subject: (tokens/s, CPU s per M
    tokens)}` for the subjects in `cpu`. Units get the round index.
    """
    for round_index in range(rounds):
        for unit in rotated(list(measure), round_index):
            for subject, result in measure[unit](round_index).items():
                if subject in cpu:
                    result, cpu_per_mtoken = result
                    cpu[subject].append(cpu_per_mtoken)
                values[subject].append(result)
        logging.info(
            "bench %s round %d: %s",
            label,
            round_index,
            {s: f"{v[-1] / 1e6:.3f}M" for s, v in values.items() if v},
        )


def target(
    metric: str, value: float, comparison: str, threshold: float, description: str
) -> dict[str, Any]:
    """A target and whether `value` meets it.

    Args:
      metric: Name of the figure the target applies to.
      value: The measured figure (a median).
      comparison: `">="`, `">"`, `"<="` or `"<"`.
      threshold: The bound.
      description: The target in words, as in the README table.

    Returns:
      A JSON-able dict with a boolean `met`.
    """
    checks = {
        ">=": value >= threshold,
        ">": value > threshold,
        "<=": value <= threshold,
        "<": value < threshold,
    }
    if comparison not in checks:
        raise ValueError(f"comparison={comparison!r} must be one of {sorted(checks)}")
    return {
        "metric": metric,
        "value": float(value),
        "comparison": comparison,
        "threshold": float(threshold),
        "description": description,
        "met": bool(checks[comparison]),
    }


def rss_mb() -> float:
    """Resident set size of this process in MiB."""
    try:
        import psutil

        return psutil.Process().memory_info().rss / 2**20
    except ImportError:  # Linux fallback.
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def cpu_secs() -> float:
    """CPU seconds used so far by this process (all threads) and its live children.

    Children count while they run, so grain worker processes are included when
    they are alive at both readings of a measurement.
    """
    try:
        import psutil
    except ImportError:
        times = os.times()
        return times.user + times.system
    me = psutil.Process()
    total = sum(me.cpu_times()[:2])
    for child in me.children(recursive=True):
        with contextlib.suppress(psutil.Error):  # ended between listing and reading
            total += sum(child.cpu_times()[:2])
    return total


# ----------------------------------------------------------------------------
# Results.
# ----------------------------------------------------------------------------


def environment() -> dict[str, Any]:
    """Versions and machine facts stored next to every result."""
    import grain
    import jax

    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "load_average_1m": float(load[0]),
        "jax": jax.__version__,
        "grain": getattr(grain, "__version__", "unknown"),
        "numpy": np.__version__,
        "jax_devices": len(jax.devices()),
    }


def _check_finite(value: Any, where: str = "result") -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{where} is {value}; benchmark results must be finite")
    if isinstance(value, dict):
        for k, v in value.items():
            _check_finite(v, f"{where}.{k}")
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            _check_finite(v, f"{where}[{i}]")


def write_result(
    config: BenchConfig, name: str, payload: dict[str, Any], started: float
) -> dict[str, Any]:
    """Adds metadata and the overall `met` to `payload` and writes `<out>/<name>.json`.

    `met` is None when there are no targets (a measurement of a user's own
    pipeline), so no reader takes it for a pass.

    Args:
      config: The run's configuration.
      name: Benchmark name (the file name).
      payload: The measurements, with a `targets` list from `target()`.
      started: `time.perf_counter()` at the start of the benchmark.

    Returns:
      The payload as written.
    """
    targets = payload.get("targets", [])
    result = {
        "benchmark": name,
        "mode": config.mode,
        "command": config.command,
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "duration_secs": time.perf_counter() - started,
        "met": all(t["met"] for t in targets) if targets else None,
        **payload,
        "environment": environment(),
    }
    _check_finite(result)
    config.out_dir.mkdir(parents=True, exist_ok=True)
    path = config.out_dir / f"{name}.json"
    path.write_text(json.dumps(result, indent=1, allow_nan=False) + "\n")
    logging.info("bench %s: wrote %s", name, path)
    return result


def new_figure(*args: Any, **kwargs: Any):
    """A matplotlib figure drawn off-screen (Agg), without touching pyplot state."""
    from matplotlib.figure import Figure

    return Figure(*args, **kwargs)


def save_figure(config: BenchConfig, name: str, figure: Any) -> str:
    """Writes `figure` to `<out>/<name>.png`; returns the file name (next to the JSON)."""
    config.out_dir.mkdir(parents=True, exist_ok=True)
    path = config.out_dir / f"{name}.png"
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    return path.name


# ----------------------------------------------------------------------------
# Environment of the pipelines.
# ----------------------------------------------------------------------------


def ensure_flags_parsed() -> None:
    """grain's mp_prefetch and the training loop read absl flags: mark them parsed."""
    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()


def single_device_mesh():
    """A mesh over the first device only (one data-loading host, any batch size)."""
    import jax

    import xlstm_data as xd

    return xd.create_mesh("dp:1,fsdp:-1,tp:1,sp:1", devices=jax.devices()[:1])


def load_config(name: str) -> Any:
    """`get_config()` of `configs/<name>.py` next to this package."""
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "configs" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"_bench_config_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


def close_iterator(iterator: Any) -> None:
    """Closes a grain iterator or our iterator (stops worker processes, threads)."""
    close = getattr(iterator, "close", None)
    if close is not None:
        close()


# ----------------------------------------------------------------------------
# The lognormal corpus.
# ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CorpusSpec:
    """One ArrayRecord source of lognormal-length documents (`SyntheticSource`).

    Attributes:
      name: Source name (mixture component name).
      num_documents: Documents in the source.
      mean_length: Mean document length in tokens.
      sigma: Standard deviation of log-length.
      seed: Seed of lengths and tokens.
      max_length: Longest document (lognormal tail clipped here).
      num_files: ArrayRecord shards the documents are split into.
      vocab_size: Token ids are below this.
    """

    name: str
    num_documents: int
    mean_length: float
    sigma: float = 1.0
    seed: int = 0
    max_length: int = 16384
    num_files: int = 2
    vocab_size: int = 32000

    def key(self) -> str:
        blob = json.dumps(dataclasses.asdict(self), sort_keys=True).encode()
        return f"{self.name}-{hashlib.sha1(blob).hexdigest()[:12]}"


def cache_dir() -> Path:
    """Root of the corpus cache (`$XLSTM_DATA_BENCH_CACHE` or the temp dir)."""
    root = os.environ.get(CACHE_ENV) or os.path.join(tempfile.gettempdir(), "xlstm_data_bench")
    return Path(root)


def counted_tokens_per_sec(iterator: Any, batches: int) -> float:
    """Tokens/s of `batches` batches of an iterator, from its own `data_counters`."""
    tokens_before = iterator.data_counters.tokens
    started = time.perf_counter()
    for _ in range(batches):
        next(iterator)
    elapsed = time.perf_counter() - started
    return (iterator.data_counters.tokens - tokens_before) / elapsed


def synthetic_source(spec: CorpusSpec) -> Any:
    """The `SyntheticSource` of a corpus spec (its documents, or just their lengths)."""
    from xlstm_data.sources import SyntheticSource

    return SyntheticSource(
        num_documents=spec.num_documents,
        mean_length=spec.mean_length,
        sigma=spec.sigma,
        vocab_size=spec.vocab_size,
        seed=spec.seed,
        max_length=spec.max_length,
    )


def plan_spec(
    names: Sequence[str],
    weights: Mapping[str, float],
    batch_size: int,
    row_length: int,
    packing: str = "best_fit",
    *,
    schedule: Any = None,
    rampup: Any = None,
) -> Any:
    """The config path's `PlanSpec` for these sources: token weights, targets shifted left.

    `schedule` (a `data.mixture_schedule`) replaces the static `weights`;
    `rampup` is a `data.rampup`.
    """
    from xlstm_data.config.rampup import BatchSizeSchedule
    from xlstm_data.plan.mixture import parse_mixture_schedule
    from xlstm_data.plan.spec import PlanSpec

    names = tuple(names)
    return PlanSpec(
        names=names,
        mixture=parse_mixture_schedule(schedule, names, dict(weights)),
        mixture_unit="tokens",
        row_length=row_length,
        packing=packing,
        shift=True,
        shift_target=True,
        seed=0,
        shuffle=True,
        batch=BatchSizeSchedule(batch_size, rampup),
    )


def prepare_corpus(spec: CorpusSpec) -> list[str]:
    """Writes the corpus once (cached by its parameters) and returns its files.

    The files are written to a temporary directory that is renamed into place
    when complete, so an interrupted or concurrent run never sees half a corpus.
    """
    from xlstm_data.sources import write_array_record

    final = cache_dir() / spec.key()
    marker = final / "spec.json"
    if not marker.exists():
        final.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{spec.key()}-", dir=final.parent))
        source = synthetic_source(spec)
        bounds = np.linspace(0, spec.num_documents, spec.num_files + 1).astype(int)
        for i in range(spec.num_files):
            write_array_record(
                staging / _shard_name(i, spec.num_files),
                (source[j]["tokens"] for j in range(bounds[i], bounds[i + 1])),
            )
        (staging / "spec.json").write_text(json.dumps(dataclasses.asdict(spec)))
        try:
            os.rename(staging, final)
            logging.info("bench: wrote corpus %s", final)
        except OSError:  # Another process finished first.
            shutil.rmtree(staging, ignore_errors=True)
    return [str(final / _shard_name(i, spec.num_files)) for i in range(spec.num_files)]


def _shard_name(index: int, count: int) -> str:
    return f"part-{index:05d}-of-{count:05d}.array_record"


#: Mixture weights of the 3-source lognormal corpus (as configs/mixture_rampup.py).
MIXTURE_WEIGHTS = {"web": 0.80, "books": 0.15, "code": 0.05}


def lognormal_corpus(tiny: bool) -> dict[str, CorpusSpec]:
    """The three lognormal sources: web (the single-source corpus), books, code."""
    if tiny:
        return {
            "web": CorpusSpec("web", 800, 128.0, sigma=1.0, seed=1, max_length=2048),
            "books": CorpusSpec("books", 100, 512.0, sigma=0.8, seed=2, max_length=4096),
            "code": CorpusSpec("code", 800, 64.0, sigma=1.2, seed=3, max_length=1024),
        }
    return {
        "web": CorpusSpec("web", 20_000, 512.0, sigma=1.0, seed=1),
        "books": CorpusSpec("books", 2_000, 4096.0, sigma=0.8, seed=2, max_length=65536),
        "code": CorpusSpec("code", 20_000, 192.0, sigma=1.2, seed=3),
    }


def our_iterator(
    files: Mapping[str, list[str]],
    weights: Mapping[str, float] | None,
    seeds: Mapping[str, int],
    *,
    seq_len: int,
    batch_size: int,
    packed: bool,
    workers: int,
    mesh: Any,
    eod_token_id: int = 1,
):
    """Our train iterator over ArrayRecord sources, built with the public factories.

    Args:
      files: ArrayRecord files of each named source.
      weights: Mixture weights by name (None for a single source).
      seeds: Shuffle (and packing) seed of each source.
      seq_len: `max_target_length`.
      batch_size: Global (= host) batch size.
      packed: First-fit packing, or padded rows.
      workers: grain worker processes.
      mesh: The mesh (see `single_device_mesh`).
      eod_token_id: End-of-document id.

    Returns:
      A `PlannedDataIterator` (see `OurHostSteps` for its host pipeline).
    """
    import xlstm_data as xd
    from xlstm_data.sources import ArrayRecordSource

    components, lengths = {}, []
    for name, paths in files.items():
        source = ArrayRecordSource(paths)
        lengths.append(len(source))
        components[name] = xd.make_grain_llm_dataset(
            0,
            1,
            source,
            batch_size,
            seq_len,
            shuffle=True,
            data_shuffle_seed=seeds[name],
            grain_packing=packed,
            eod_token_id=eod_token_id,
        )
    return xd.make_grain_multihost_iterator(
        components,
        lengths,
        mesh,
        batch_size,
        dataset_weights=dict(weights) if weights else None,
        worker_count=workers,
    )


#: Longest wait for a pipeline's worker processes to start (spawn, imports, first chunk).
WORKER_START_SECS = 120.0


def wait_for_workers(pipeline: Any) -> None:
    """Waits until a host pipeline's workers have made their first chunk (at once without workers).

    `pipeline` is a `WorkerHandover` (`PlannedDataIterator._pipeline`). A
    failure of the workers is left for its `next()` to raise.
    """
    started = pipeline._first  # noqa: SLF001 - the workers' start, None without them
    if started is not None:
        started.exception(timeout=WORKER_START_SECS)


class OurHostSteps:
    """The iterator's host pipeline from step 0, one step's fields at a time, before any device.

    What the iterator itself iterates (`PlannedDataIterator._pipeline`): its
    chunks of steps, from its own workers through their shared-memory slots
    when it has workers, each step's fields read in place (views) and the
    chunk's slot given back once its last step has been read. Each `iter()`
    starts afresh (new worker processes); closing the generator closes them.

    Until 2026-11-28 this was the per-step host dataset (`host_batches()`)
    sent through grain's workers, one new shared-memory segment per step:
    at 2 workers it made 10.7 M tok/s where the iterator's own pipeline
    makes 23-32, a path the iterator had not taken since its chunks and slots.
    The first step waits until the workers are up: until then the steps are
    computed here while the workers start (`WorkerHandover`), seconds that
    fell inside the timed batches in the rounds that warmed this pipeline up
    after grain's (8-11 M tok/s in those, 24-36 in the others, 2 workers).
    Their start is timed by `plan_mixture`, not here.
    """

    def __init__(self, iterator: Any):
        self._iterator = iterator

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        from xlstm_data.multihost.shared_slots import give_back
        from xlstm_data.reading.row_assembly import fields_of

        pipeline = self._iterator._pipeline(0, None)  # noqa: SLF001 - the iterator's own
        try:
            wait_for_workers(pipeline)
            for chunk in pipeline:
                block, start = chunk["fields"], 0
                for rows in chunk["rows"].tolist():
                    yield fields_of(block[:, start : start + rows])
                    start += rows
                give_back(chunk)  # every step of it read
        finally:
            pipeline.close()


def error_bars(stats: Sequence[Mapping[str, float]], scale: float = 1.0):
    """`(medians, [below, above])` of summaries, for matplotlib's `yerr`."""
    medians = np.array([s["median"] for s in stats]) / scale
    below = medians - np.array([s["min"] for s in stats]) / scale
    above = np.array([s["max"] for s in stats]) / scale - medians
    return medians, [below, above]


def format_table(rows: Sequence[Sequence[str]], header: Sequence[str]) -> str:
    """A plain-text table with aligned columns."""
    table = [list(header)] + [list(r) for r in rows]
    widths = [max(len(str(r[i])) for r in table) for i in range(len(header))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)) for r in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def python_command(argv: Sequence[str]) -> str:
    """How the results were produced, for the JSON (`python -m bench.run ...`)."""
    return " ".join(["python -m bench.run", *argv])
