"""Megatron-core's runner (the peers' venv): write, throughput and cold start.

- `write`: the documents into `<prefix>.bin/.idx` with `IndexedDatasetBuilder`
  (uint16, the end-of-document id appended to each document, as
  `preprocess_data.py --append-eod`), timed from the first document to the
  finalized index: the figure `prepare` is compared with.
- `throughput`: `GPTDataset` (one prefix) or `BlendedDataset` (several, with
  weights) through `BlendedMegatronDatasetBuilder`, batched by a torch
  `DataLoader` (batch 8, its sequential sampler, as Megatron's pretraining
  sampler: the dataset shuffles itself), `num_workers` 0 or 2. `same_work`
  sets `reset_position_ids` and `eod_mask_loss`, so each sample gets
  per-document positions and a loss mask, the work our segment ids and
  positions do. No dense attention mask (`create_attention_mask=False`, as
  with fused attention): ours produces segment ids instead. Every token of a
  sample counts (Megatron does not pad).
- `cold_start`: an empty index cache, then build to the first batch.

    python -m bench.peers.run_megatron TASK_JSON
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
    import torch
    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder,
    )
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
except ImportError as error:  # reported as a missing peer, not a failure
    runner_util.emit_missing(f"megatron-core cannot be imported: {error}")

_IMPORTED = time.perf_counter()
#: Distributions whose versions `check` reports.
PACKAGES = ("megatron-core", "torch", "numpy")


class BenchTokenizer:
    """What GPTDataset asks of a tokenizer: ids of end-of-document and padding, and a name."""

    def __init__(self, vocab_size: int, eod: int, pad: int):
        self.vocab_size = vocab_size
        self.eod = eod
        self.pad = pad
        self.unique_identifiers = {"class": "BenchTokenizer", "vocab_size": vocab_size}


def _init_process_group() -> None:
    """`BlendedDataset` asks torch.distributed for the rank: a 1-process gloo group."""
    if not torch.distributed.is_initialized():
        store = tempfile.mktemp(prefix="megatron-bench-store-")
        torch.distributed.init_process_group(
            "gloo", init_method=f"file://{store}", rank=0, world_size=1
        )


def write(task: dict[str, Any]) -> dict[str, Any]:
    tokens = np.load(os.path.join(task["docs"], "tokens.npy"), mmap_mode="r")
    offsets = np.load(os.path.join(task["docs"], "offsets.npy"))
    eod = np.array([task["eod"]], dtype=np.uint16)
    prefix = task["prefix"]
    runner_util.settle_writeback()  # as ours: no earlier write lands in the timed span
    started = time.perf_counter()
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    for i in range(len(offsets) - 1):
        document = np.concatenate([tokens[offsets[i] : offsets[i + 1]], eod])
        builder.add_document(document, [document.size])  # the builder copies to uint16
    builder.finalize(prefix + ".idx")
    secs = time.perf_counter() - started
    count = int(offsets[-1])  # the same token arrays as ours (without the appended EOD ids)
    return {"secs": secs, "tokens": count, "tokens_per_sec": count / secs}


def build(task: dict[str, Any]) -> Any:
    """The GPTDataset or BlendedDataset of the task, with an index cache of its own."""
    _init_process_group()
    same_work = bool(task.get("same_work"))
    prefixes = task["prefixes"]
    weights = task.get("weights")
    config = GPTDatasetConfig(
        random_seed=task.get("seed", 1234),
        sequence_length=task.get("seq_len", 1024),
        blend=(prefixes, weights if len(prefixes) > 1 else None),
        split="100,0,0",
        path_to_cache=task["cache"],
        tokenizer=BenchTokenizer(task["vocab_size"], task["eod"], task["pad"]),
        reset_position_ids=same_work,
        reset_attention_mask=False,
        eod_mask_loss=same_work,
        create_attention_mask=False,
        mmap_bin_files=True,
    )
    samples = task["samples"]
    train, _, _ = BlendedMegatronDatasetBuilder(
        GPTDataset, [samples, 0, 0], lambda: True, config
    ).build()
    return train


def loader(dataset: Any, task: dict[str, Any]) -> Any:
    workers = task.get("workers", 0)
    return torch.utils.data.DataLoader(
        dataset,
        batch_size=task.get("batch_size", 8),
        shuffle=False,
        num_workers=workers,
        persistent_workers=False,
    )


def _count(batch: dict[str, Any]) -> int:
    return int(batch["tokens"].numel())


def throughput(task: dict[str, Any]) -> dict[str, Any]:
    return runner_util.time_batches(
        iter(loader(build(task), task)),
        _count,
        task["warmup"],
        task["timed"],
        task.get("warmup_secs", 0.0),
    )


def cold_start(task: dict[str, Any]) -> dict[str, Any]:
    """Index build (document, sample and shuffle indexes) and the first batch.

    The 1-process gloo group is started first and timed apart (`runtime_secs`),
    as ours starts JAX's backend apart: a training process starts its
    framework's runtime whatever loader it uses.
    """
    runtime = time.perf_counter()
    _init_process_group()
    began = time.perf_counter()
    dataset = build(task)
    built = time.perf_counter()
    next(iter(loader(dataset, task)))
    first = time.perf_counter()
    return {
        "import_secs": _IMPORTED - _STARTED,
        "runtime_secs": began - runtime,
        "build_secs": built - began,
        "first_batch_secs": first - began,
        **runner_util.memory_mb(),  # at the first batch
    }


def check(task: dict[str, Any]) -> dict[str, Any]:
    """The versions of the peer and of torch (the imports above worked)."""
    from importlib.metadata import version

    del task
    return {"versions": {p: version(p) for p in PACKAGES}}


TASKS = {"check": check, "write": write, "throughput": throughput, "cold_start": cold_start}


def main() -> None:
    task = runner_util.task_from_argv()
    result = TASKS[task["task"]](task)
    runner_util.emit(result)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
