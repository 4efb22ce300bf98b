"""Batching inside grain worker processes while the ramp-up step stays exact.

Sending rows one by one from worker processes costs an inter-process transfer
per row and field, which made two workers slower than none (`bench/README.md`).
Workers therefore batch, but the batch size depends on the global step, which
only the main process knows in order. The workers batch in micro-batches of
the greatest common divisor of all stage host batch sizes, and the main
process joins `host_batch_size(step) / micro` of them per step. Its state is
the workers' position after the last micro-batch joined plus the step, as
with in-process batching.

Only streams that repeat forever are batched this way: grain interleaves the
workers' outputs, and in a finite stream one worker can end inside a
micro-batch while the others go on, which would leave padding rows in the
middle of the stream. Finite streams keep sending rows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import grain
import numpy as np

from xlstm_data.batch import padding_value
from xlstm_data.batching import BatchSizeFn, ScheduledBatchIterDataset, _ScheduledBatchIterator
from xlstm_data.errors import DataConfigError
from xlstm_data.multihost_iterator import is_infinite_stream


def micro_batch_size(host_batch_sizes: Sequence[int]) -> int:
    """The largest micro-batch that every stage's host batch is a whole number of."""
    return math.gcd(*host_batch_sizes)


def batch_in_workers(
    rows: grain.IterDataset,
    batch_size_at: BatchSizeFn,
    host_batch_sizes: Sequence[int],
    options: grain.MultiprocessingOptions,
    *,
    drop_remainder: bool,
    pad_value: int = 0,
) -> grain.IterDataset:
    """Batches an endless row stream in worker processes, one step's batch at a time.

    Args:
      rows: The host's rows; must repeat forever.
      batch_size_at: Host batch size by step (e.g. a `BatchSizeSchedule`).
      host_batch_sizes: Every host batch size `batch_size_at` can return.
      options: grain worker options; `per_worker_buffer_size` counts
        micro-batches.
      drop_remainder: As for `ScheduledBatchIterDataset` (only matters if a
        stream ends after all).
      pad_value: Padding of ragged rows' token fields.
    """
    if not is_infinite_stream(rows):
        raise DataConfigError(
            "batch_in_workers needs a row stream that repeats forever (num_epochs=None); "
            "batch a finite stream in the main process"
        )
    micro = micro_batch_size(host_batch_sizes)
    parts = ScheduledBatchIterDataset(rows, micro, drop_remainder=True, pad_value=pad_value)
    return JoinedBatchIterDataset(
        parts.mp_prefetch(options),
        batch_size_at,
        micro,
        drop_remainder=drop_remainder,
        pad_value=pad_value,
    )


def join_batches(parts: Sequence[dict[str, np.ndarray]], pad_value: int = 0) -> dict[str, Any]:
    """Concatenates batches along the rows, padding ragged ones to the longest."""
    out = {}
    for key in parts[0]:
        arrays = [np.asarray(part[key]) for part in parts]
        if arrays[0].ndim > 1 and any(a.shape[1:] != arrays[0].shape[1:] for a in arrays):
            length = max(a.shape[1] for a in arrays)
            fill = padding_value(key, pad_value)
            arrays = [
                np.pad(a, [(0, 0), (0, length - a.shape[1])] + [(0, 0)] * (a.ndim - 2),
                       constant_values=fill)
                for a in arrays
            ]  # fmt: skip
        out[key] = np.concatenate(arrays)
    return out


class JoinedBatchIterDataset(grain.IterDataset):
    """Joins fixed-size micro-batches into batches whose size follows the step."""

    def __init__(
        self,
        parent: grain.IterDataset,
        batch_size_at: BatchSizeFn,
        micro_batch_size: int,
        *,
        drop_remainder: bool = False,
        pad_value: int = 0,
    ):
        super().__init__(parent)
        self._batch_size_at = batch_size_at
        self._micro = micro_batch_size
        self._drop_remainder = drop_remainder
        self._pad_value = pad_value

    def __iter__(self) -> _JoinedBatchIterator:
        return _JoinedBatchIterator(
            self._parent.__iter__(),
            self._batch_size_at,
            self._micro,
            self._drop_remainder,
            self._pad_value,
        )

    def __str__(self) -> str:
        return f"JoinedBatchIterDataset(micro_batch_size={self._micro})"


class _JoinedBatchIterator(_ScheduledBatchIterator):
    """Batches as `ScheduledBatchIterDataset` does, from micro-batches instead of rows."""

    def __init__(
        self,
        parent: grain.DatasetIterator,
        batch_size_at: BatchSizeFn,
        micro: int,
        drop_remainder: bool,
        pad_value: int,
    ):
        super().__init__(parent, batch_size_at, drop_remainder, pad_value)
        self._micro = micro

    def _items_per_batch(self, batch_size: int) -> int:
        if batch_size % self._micro:
            raise AssertionError(f"batch size {batch_size} is not a multiple of {self._micro}")
        return batch_size // self._micro

    def _rows_in(self, items: list[Any]) -> int:
        return len(items) * self._micro

    def _combine(self, items: list[Any], batch_size: int) -> dict[str, Any]:
        batch = items[0] if len(items) == 1 else join_batches(items, self._pad_value)
        missing = batch_size - len(items) * self._micro
        if missing:  # the stream ended: fill up with padding rows, as in-process batching does
            filler = {
                k: np.full((missing,) + v.shape[1:], padding_value(k, self._pad_value), v.dtype)
                for k, v in batch.items()
            }
            batch = join_batches([batch, filler], self._pad_value)
        return batch

    def __str__(self) -> str:
        return f"JoinedBatchIterator(step={self._step}, micro_batch_size={self._micro})"
