"""OLMo-core's runner (the peers' venv): throughput and cold start of `NumpyFSLDataset`.

OLMo-core reads Megatron's `.bin` as a raw uint16 token stream (documents
already end with the end-of-document id) cut into fixed 1024-token instances,
through its own data loader (`NumpyDataLoaderBase.wrap_numpy_dataset`: a
seeded global shuffle of instances, batches of 8 x 1024 tokens, `num_workers`
0 or 2, and with 0 workers its default of 4 reading threads), as a training
run uses it. Every token of an instance counts (FSL does not pad). Its work
directory (the instance indexes) is fresh in every process: nothing cached.

    python -m bench.peers.run_olmo TASK_JSON
"""

from __future__ import annotations

import time

_STARTED = time.perf_counter()

import os  # noqa: E402
import tempfile  # noqa: E402
from typing import Any  # noqa: E402

from bench.peers import runner_util  # noqa: E402

try:
    import numpy as np
    from olmo_core.data import DataCollator, NumpyDataLoaderBase, NumpyFSLDataset
except ImportError as error:  # reported as a missing peer, not a failure
    runner_util.emit_missing(f"ai2-olmo-core cannot be imported: {error}")

_IMPORTED = time.perf_counter()
#: Distributions whose versions `check` reports.
PACKAGES = ("ai2-olmo-core", "torch", "numpy")


def build(task: dict[str, Any]) -> Any:
    """The dataset and its data loader, reshuffled for epoch 1 (builds the global indices)."""
    work_dir = task.get("work_dir") or tempfile.mkdtemp(prefix="olmo-bench-")
    dataset = NumpyFSLDataset(
        *task["paths"],
        sequence_length=task.get("seq_len", 1024),
        pad_token_id=task["pad"],
        eos_token_id=task["eod"],
        vocab_size=task["vocab_size"],
        dtype=np.uint16,
    )
    dataset.work_dir = work_dir
    dataset.prepare()
    loader = NumpyDataLoaderBase.wrap_numpy_dataset(
        dataset,
        global_batch_size=task.get("batch_size", 8) * task.get("seq_len", 1024),
        collator=DataCollator(pad_token_id=task["pad"]),
        work_dir=work_dir,
        seed=task.get("seed", 0),
        dp_world_size=1,
        dp_rank=0,
        fs_local_rank=0,
        num_workers=task.get("workers", 0),
    )
    loader.reshuffle(epoch=1)
    return loader


def _count(batch: dict[str, Any]) -> int:
    return int(batch["input_ids"].numel())


def throughput(task: dict[str, Any]) -> dict[str, Any]:
    return runner_util.time_batches(
        iter(build(task)), _count, task["warmup"], task["timed"], task.get("warmup_secs", 0.0)
    )


def cold_start(task: dict[str, Any]) -> dict[str, Any]:
    began = time.perf_counter()
    loader = build(task)
    built = time.perf_counter()
    next(iter(loader))
    first = time.perf_counter()
    return {
        "import_secs": _IMPORTED - _STARTED,
        "build_secs": built - began,
        "first_batch_secs": first - began,
        **runner_util.memory_mb(),  # at the first batch
    }


def check(task: dict[str, Any]) -> dict[str, Any]:
    """The versions of the peer and of torch (the imports above worked)."""
    from importlib.metadata import version

    del task
    return {"versions": {p: version(p) for p in PACKAGES}}


TASKS = {"check": check, "throughput": throughput, "cold_start": cold_start}


def main() -> None:
    task = runner_util.task_from_argv()
    result = TASKS[task["task"]](task)
    runner_util.emit(result)
    # Loader threads and workers can hold up (or abort) interpreter exit.
    os._exit(0)


if __name__ == "__main__":
    main()
