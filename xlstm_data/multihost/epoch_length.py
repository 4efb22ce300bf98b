"""How many global batches a finite (epoch-based) run yields, before reading data.

On the config path (`iterators_from_config`) the count comes from the data
plan (`GlobalPlan.num_steps`), which packs on document lengths alone: it is
exact with every `data.packing` mode, for train and eval, and recorded as an
`EpochLength(steps, exact=True)`.

`epoch_length` below counts for the streaming pipeline's layout (contiguous
host shards). Without packing the count is exact: it follows from the
document lengths (chunking is deterministic), the host shards, the ramp-up
schedule and `drop_remainder`. With streaming first-fit packing, how many
rows are filled depends on the order of documents, so the count is an
estimate (total tokens / row length, a lower bound) and is marked as such.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from xlstm_data.config.rampup import BatchSizeSchedule
from xlstm_data.streaming.host_sharding import shard_bounds


@dataclasses.dataclass(frozen=True)
class EpochLength:
    """Global steps of a finite run.

    Attributes:
      steps: Number of global batches the run yields.
      exact: False when `steps` is an estimate (streaming packing); the plan's
        counts are always exact.
    """

    steps: int
    exact: bool


def rows_per_document(
    lengths: np.ndarray, max_target_length: int, shift: bool, shift_target: bool
) -> np.ndarray:
    """Rows (chunks) each document becomes, matching `chunking.document_to_examples`."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if not shift:
        return -(-(lengths + 1) // max_target_length)
    predicted = lengths + (1 if shift_target else 2) - 1  # stream length minus one
    return -(-predicted // max_target_length)


def _tokens_per_document(lengths: np.ndarray, shift: bool, shift_target: bool) -> np.ndarray:
    return np.asarray(lengths, dtype=np.int64) + (0 if shift and shift_target else 1)


def _host_steps(rows: int, schedule: BatchSizeSchedule, drop_remainder: bool) -> int:
    examples = rows * schedule.host_count  # in global-example units
    if drop_remainder:
        return schedule.step_for_examples(examples + 1) - 1
    return schedule.step_for_examples(examples)


def epoch_length(
    document_lengths: Sequence[int] | np.ndarray,
    num_epochs: int,
    max_target_length: int,
    schedule: BatchSizeSchedule,
    *,
    packing: bool,
    shift: bool = True,
    shift_target: bool = True,
    drop_remainder: bool = True,
) -> EpochLength:
    """Counts the global batches of `num_epochs` passes over the documents.

    Args:
      document_lengths: Token count of every document (all hosts).
      num_epochs: Passes over the data.
      max_target_length: Row length.
      schedule: The batch-size schedule (with the mesh's host count).
      packing: Whether rows are packed (the count is then an estimate).
      shift: As in `make_grain_llm_dataset`.
      shift_target: As in `make_grain_llm_dataset`.
      drop_remainder: Whether partial last batches are dropped (the run then
        stops at the first host's end) or padded (it stops at the last one's).

    Returns:
      The number of global steps, and whether it is exact.
    """
    lengths = np.asarray(document_lengths, dtype=np.int64)
    per_host = []
    for host in range(schedule.host_count):
        start, stop = shard_bounds(len(lengths), host, schedule.host_count)
        shard = lengths[start:stop]
        if packing:
            tokens = int(_tokens_per_document(shard, shift, shift_target).sum()) * num_epochs
            rows = -(-tokens // max_target_length)
        else:
            rows = int(rows_per_document(shard, max_target_length, shift, shift_target).sum())
            rows *= num_epochs
        per_host.append(_host_steps(rows, schedule, drop_remainder))
    steps = min(per_host) if drop_remainder else max(per_host)
    return EpochLength(steps=steps, exact=not packing)
