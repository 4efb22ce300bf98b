"""Our system's runner (the project's venv): throughput, cold start and prepare.

Measured on the user's path: the train iterator that
`xlstm_data.iterators_from_config` builds from a data config naming the
prepared directories (`path="iterator"`: global `jax.Array` batches on one
CPU device, as a training loop gets them; tokens from the iterator's own
`data_counters`). `path="host"` times the host pipeline inside that iterator
instead (numpy batches before the device copy; tokens from each
element's `source_tokens`, the count the iterator's counters add up), to
show what the copy and the prefetch thread cost; `path="one_thread"` the
iterator's chunks and device arrays made in the calling thread. `paired`
alternates the host pipeline and the whole iterator in one process (target 6).

    python -m bench.peers.run_ours TASK_JSON
"""

from __future__ import annotations

import time

_STARTED = time.perf_counter()

import os  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
from typing import Any  # noqa: E402

from bench.peers import runner_util  # noqa: E402
from bench.peers.corpus import our_source  # noqa: E402 - not imported inside a timed span
from xlstm_data.multihost.shared_slots import give_back  # noqa: E402


def data_config(task: dict[str, Any]) -> dict[str, Any]:
    """The data section: our prepared sources (or Megatron's files), rows of 1024, host batch 8."""
    sources = task["sources"]
    train = {}
    for name, source in sources.items():
        if "megatron" in source:  # Megatron's own .bin/.idx, read in place
            train[name] = {
                "kind": "megatron",
                "path": source["megatron"],
                "end_of_document": source["end_of_document"],
            }
        else:
            train[name] = our_source(source["dir"])
        if len(sources) > 1:
            train[name]["weight"] = source["weight"]
    return {
        "train": train,
        "global_batch_size": task.get("batch_size", 8),
        "max_target_length": task.get("seq_len", 1024),
        "packing": task.get("packing", "best_fit"),
        "worker_count": task.get("workers", 0),
        "data_shuffle_seed": task.get("seed", 0),
    }


def build(task: dict[str, Any]) -> Any:
    """The train iterator of the task's data config, on a mesh of the first CPU device."""
    import jax
    from absl import flags

    import xlstm_data as xd

    if not flags.FLAGS.is_parsed():  # grain's worker processes read absl flags
        flags.FLAGS.mark_as_parsed()
    mesh = xd.create_mesh("dp:1,fsdp:-1,tp:1,sp:1", devices=jax.devices()[:1])
    train, evals = xd.iterators_from_config(data_config(task), mesh)
    for iterator in evals.values():
        iterator.close()
    return train


def _iterator_batches(train: Any):
    import jax

    while True:
        before = train.data_counters.tokens
        jax.block_until_ready(next(train))
        yield train.data_counters.tokens - before


def _one_thread_batches(train: Any):
    """The iterator's chunks of steps and their device arrays, made in this thread.

    No prefetch thread: what the whole iterator could reach if its two
    threads cost nothing (the bound on target 6 on this machine).
    """
    import jax

    while True:
        for step in train._produce():
            jax.block_until_ready(step.arrays.get())
            yield step.counts.tokens


def _host_batches(train: Any):
    for element in train.host_batches():  # the host pipeline itself, in this process
        yield int(element["source_tokens"].sum())


def _pipeline_batches(pipeline: Any):
    """The steps of the chunks `train._pipeline` gives, as a loop reading numpy would take them.

    That pipeline is the one the whole iterator runs, workers included: a
    worker's chunk is lent from its slot, read in place and given back.
    """
    for chunk in pipeline:
        tokens = chunk["source_tokens"].sum(axis=1).tolist()
        give_back(chunk)
        yield from tokens


def throughput(task: dict[str, Any]) -> dict[str, Any]:
    train = build(task)
    try:
        paths = {"host": _host_batches, "one_thread": _one_thread_batches}
        batches = paths.get(task.get("path"), _iterator_batches)(train)
        profile = task.get("profile")
        if profile:
            import cProfile

            profiler = cProfile.Profile()
            profiler.enable()
        result = runner_util.time_batches(
            batches, int, task["warmup"], task["timed"], task.get("warmup_secs", 0.0)
        )
        if profile:
            profiler.disable()
            profiler.dump_stats(profile)
    finally:
        train.close()
    return result


def paired(task: dict[str, Any]) -> dict[str, Any]:
    """Target 6 in one process: the host pipeline and the whole iterator, window after window.

    Runs timed minutes apart in separate processes met this VM in different
    phases, so their ratios spread from 0.3 to 0.9 over the rounds of one run
    and hid changes of 10 %. Here each window of the whole iterator is paired
    with a window of the host pipeline next to it (the order alternating), so
    both see the same phase; the ratio of a pair is the whole iterator's
    tokens/s over the host pipeline's.

    With workers, a third subject reads the chunks of the whole iterator's
    own pipeline (its workers, with their slots) as numpy (`host_workers`):
    `same_pipeline_ratio` is then what the global arrays cost on that
    pipeline, and `workers_ratio` what moving the host pipeline into workers
    costs on this machine.
    """
    trains: dict[str, Any] = {}
    pipeline = None
    try:
        trains["host"] = build(dict(task, workers=0))
        trains["whole"] = build(task)
        subjects = {
            "host": _host_batches(trains["host"]),
            "whole": _iterator_batches(trains["whole"]),
        }
        if task.get("workers"):
            # Closed at once (its own pipeline's workers would share the cores);
            # the pipeline it makes afterwards is the one its `next` would read.
            trains["host_workers"] = build(task)
            trains["host_workers"].close()
            pipeline = trains["host_workers"]._pipeline(0, None)  # noqa: SLF001
            subjects["host_workers"] = _pipeline_batches(pipeline)
        for batches in subjects.values():
            next(batches)  # the first batch (workers start) and the pick's compile
        if task.get("workers"):
            time.sleep(task.get("warmup_secs", 0.0))
        for batches in subjects.values():
            for _ in range(task["warmup"]):
                next(batches)
        rates: dict[str, list[float]] = {name: [] for name in subjects}
        for window in range(task["windows"]):
            order = list(subjects) if window % 2 == 0 else list(subjects)[::-1]
            for name in order:
                batches = subjects[name]
                began = time.perf_counter()
                tokens = sum(next(batches) for _ in range(task["window"]))
                rates[name].append(tokens / (time.perf_counter() - began))
    finally:
        if pipeline is not None:
            pipeline.close()
        for train in trains.values():
            train.close()

    def ratios(subject: str, baseline: str) -> list[float]:
        return [s / b for s, b in zip(rates[subject], rates[baseline], strict=True)]

    whole_over_host = ratios("whole", "host")
    result = {
        "ratios": whole_over_host,
        "ratio": statistics.median(whole_over_host),
        "tokens_per_sec": statistics.median(rates["whole"]),
        "host_tokens_per_sec": statistics.median(rates["host"]),
    }
    if pipeline is not None:
        result["same_pipeline_ratio"] = statistics.median(ratios("whole", "host_workers"))
        result["workers_ratio"] = statistics.median(ratios("host_workers", "host"))
        result["host_workers_tokens_per_sec"] = statistics.median(rates["host_workers"])
    return result


def cold_start(task: dict[str, Any]) -> dict[str, Any]:
    """From nothing built to the first batch, in this fresh process.

    Imports and JAX's backend start (plugin discovery and the CPU client,
    13-19 ms in bench/peers) are timed apart: a training process starts the
    backend for its model whatever loader it uses (Megatron's runner starts
    its gloo group apart likewise).
    """
    import jax  # imports are not part of the timed span

    import xlstm_data.from_config  # noqa: F401 - `xlstm_data` imports its modules lazily

    imported = time.perf_counter()
    # The source's own modules too, timed apart: `from_config` imports each kind's
    # module when it builds one. This machine compiles every module from source
    # (no bytecode written), 2.2 ms for megatron_indexed, which a user's second
    # start does not pay.
    import xlstm_data.sources.flat_tokens  # noqa: F401
    import xlstm_data.sources.megatron_indexed  # noqa: F401
    import xlstm_data.sources.prepared_shards  # noqa: F401

    source_imported = time.perf_counter()
    jax.devices()
    began = time.perf_counter()
    train = build(task)
    built = time.perf_counter()
    next(train)
    first = time.perf_counter()
    memory = runner_util.memory_mb()  # at the first batch, as the peers' runners
    train.close()
    return {
        "import_secs": imported - _STARTED,
        "source_import_secs": source_imported - imported,
        "runtime_secs": began - source_imported,
        "build_secs": built - began,
        "first_batch_secs": first - began,
        **memory,
    }


def prepare(task: dict[str, Any]) -> dict[str, Any]:
    from pathlib import Path

    from bench.peers.corpus import prepare_ours

    return _token_rate(
        prepare_ours(Path(task["docs"]), Path(task["output"]), task.get("input", "parquet"))
    )


def index(task: dict[str, Any]) -> dict[str, Any]:
    """`xlstm-data index` over ArrayRecord shards of the documents written elsewhere."""
    from pathlib import Path

    from bench.peers.corpus import index_ours

    return _token_rate(index_ours(Path(task["docs"])))


def _token_rate(result: dict[str, Any]) -> dict[str, Any]:
    """Seconds, tokens and tokens/s of a timed `prepare` or `index` (its index and secs)."""
    tokens = int(result["index"]["tokens"])
    return {"secs": result["secs"], "tokens": tokens, "tokens_per_sec": tokens / result["secs"]}


TASKS = {
    "throughput": throughput,
    "paired": paired,
    "cold_start": cold_start,
    "prepare": prepare,
    "index": index,
}


def main() -> None:
    task = runner_util.task_from_argv()
    # Nothing cached between runs: a fresh lengths cache per process.
    if task.get("cache_dir"):
        os.environ["XLSTM_DATA_CACHE_DIR"] = task["cache_dir"]
    from absl import logging

    logging.set_verbosity(logging.WARNING)
    result = TASKS[task["task"]](task)
    runner_util.emit(result)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
