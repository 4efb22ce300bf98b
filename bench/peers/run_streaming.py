"""mosaicml-streaming's runner (the peers' venv): write MDS shards, and throughput.

- `write`: the documents, each followed by the end-of-document id, as one
  stream cut into 1024-token samples (the llm-foundry `concat_tokens` layout;
  the last partial sample is dropped), one `ndarray:uint16` column, no
  compression, with `MDSWriter`.
- `throughput`: `StreamingDataset(local=..., shuffle=True)` batched by a
  torch `DataLoader` (batch 8, `num_workers` 0 or 2). Every token of a sample
  counts (no padding).

Needs the stand-in torchvision in `bench/peers/stubs` on PYTHONPATH (the
harness puts it there): see that directory's README.

    python -m bench.peers.run_streaming TASK_JSON
"""

from __future__ import annotations

import os
import time
from typing import Any

from bench.peers import runner_util

try:
    import numpy as np
    import torch
    from streaming import MDSWriter, StreamingDataset
    from streaming.base.util import clean_stale_shared_memory
except ImportError as error:  # reported as a missing peer, not a failure
    runner_util.emit_missing(f"mosaicml-streaming cannot be imported: {error}")

#: Distributions whose versions `check` reports.
PACKAGES = ("mosaicml-streaming", "torch", "numpy")


def concatenated(tokens: np.ndarray, offsets: np.ndarray, eod: int) -> np.ndarray:
    """The documents with `eod` after each, as one uint16 stream."""
    out = np.empty(tokens.size + offsets.size - 1, dtype=np.uint16)
    ends = offsets[1:] + np.arange(1, offsets.size)  # position after each document's EOD
    out[ends - 1] = eod
    mask = np.ones(out.size, dtype=bool)
    mask[ends - 1] = False
    out[mask] = tokens
    return out


def write(task: dict[str, Any]) -> dict[str, Any]:
    tokens = np.load(os.path.join(task["docs"], "tokens.npy"), mmap_mode="r")
    offsets = np.load(os.path.join(task["docs"], "offsets.npy"))
    seq_len = task.get("seq_len", 1024)
    started = time.perf_counter()
    stream = concatenated(np.asarray(tokens), offsets, task["eod"])
    samples = stream[: stream.size // seq_len * seq_len].reshape(-1, seq_len)
    with MDSWriter(
        out=task["out"], columns={"tokens": "ndarray:uint16"}, compression=None
    ) as writer:
        for sample in samples:
            writer.write({"tokens": sample})
    return {"secs": time.perf_counter() - started, "samples": int(samples.shape[0])}


def throughput(task: dict[str, Any]) -> dict[str, Any]:
    clean_stale_shared_memory()
    batch_size = task.get("batch_size", 8)
    dataset = StreamingDataset(
        local=task["dir"],
        shuffle=True,
        shuffle_seed=task.get("seed", 0),
        batch_size=batch_size,
    )
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=batch_size, num_workers=task.get("workers", 0)
    )
    return runner_util.time_batches(
        iter(loader),
        lambda b: int(b["tokens"].numel()),
        task["warmup"],
        task["timed"],
        task.get("warmup_secs", 0.0),
    )


def check(task: dict[str, Any]) -> dict[str, Any]:
    """The versions of the peer and of torch (the imports above worked)."""
    from importlib.metadata import version

    del task
    return {"versions": {p: version(p) for p in PACKAGES}}


TASKS = {"check": check, "write": write, "throughput": throughput}


def main() -> None:
    task = runner_util.task_from_argv()
    result = TASKS[task["task"]](task)
    runner_util.emit(result)
    os._exit(0)  # skip the dataset's shared-memory teardown at exit (its workers are gone)


if __name__ == "__main__":
    main()
