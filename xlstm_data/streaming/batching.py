"""Stacks rows into host batches whose size may change with the step.

The batch size is asked of a schedule at every step (constant, or a ramp-up),
and the step is part of the iterator's state, so a restore continues with the
right size. The last partial batch is either dropped (`drop_remainder`) or
filled up with padding rows whose segmentation is 0, so every batch has the
same shape within a stage and a masked loss ignores the filler exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import grain
import numpy as np

from xlstm_data.batch import padding_value

BatchSizeFn = Callable[[int], int]


class ConstantBatchSize:
    """A schedule that always returns the same batch size (picklable)."""

    def __init__(self, batch_size: int):
        self.batch_size = int(batch_size)

    def __call__(self, step: int) -> int:
        del step
        return self.batch_size

    def __repr__(self) -> str:
        return f"ConstantBatchSize({self.batch_size})"


def stack_rows(
    rows: Sequence[dict[str, np.ndarray]], batch_size: int, pad_value: int = 0
) -> dict[str, np.ndarray]:
    """Stacks rows into `[batch_size, length]` arrays, padding with zeros.

    Rows shorter than the longest are padded at the end; missing rows (a
    partial last batch) are all padding, filled by `batch.padding_value`.
    """
    out = {}
    for key in rows[0]:
        values = [np.asarray(row[key]) for row in rows]
        if len(values) == batch_size and all(v.shape == values[0].shape for v in values):
            out[key] = np.stack(values)  # the common case: full batch of equal rows
            continue
        length = max(v.shape[0] for v in values) if values[0].ndim else 0
        fill = padding_value(key, pad_value)
        shape = (batch_size, length) + values[0].shape[1:] if values[0].ndim else (batch_size,)
        batch = np.full(shape, fill, dtype=values[0].dtype)
        for i, v in enumerate(values):
            if v.ndim:
                batch[i, : v.shape[0]] = v
            else:
                batch[i] = v
        out[key] = batch
    return out


class ScheduledBatchIterDataset(grain.IterDataset):
    """Batches the parent's rows with a step-dependent batch size."""

    def __init__(
        self,
        parent: grain.IterDataset,
        batch_size: int | BatchSizeFn,
        *,
        drop_remainder: bool = False,
        pad_value: int = 0,
    ):
        super().__init__(parent)
        self._batch_size_at = (
            ConstantBatchSize(batch_size) if isinstance(batch_size, int) else batch_size
        )
        self._drop_remainder = drop_remainder
        self._pad_value = pad_value

    def __iter__(self) -> _ScheduledBatchIterator:
        return _ScheduledBatchIterator(
            self._parent.__iter__(), self._batch_size_at, self._drop_remainder, self._pad_value
        )

    def __str__(self) -> str:
        return (
            f"ScheduledBatchIterDataset(batch_size={self._batch_size_at}, "
            f"drop_remainder={self._drop_remainder})"
        )


class _ScheduledBatchIterator(grain.DatasetIterator):
    def __init__(
        self,
        parent: grain.DatasetIterator,
        batch_size_at: BatchSizeFn,
        drop_remainder: bool,
        pad_value: int,
    ):
        super().__init__(parent)
        self._batch_size_at = batch_size_at
        self._drop_remainder = drop_remainder
        self._pad_value = pad_value
        self._step = 0
        self._exhausted = False

    def __next__(self) -> dict[str, np.ndarray]:
        if self._exhausted:
            raise StopIteration
        batch_size = self._batch_size_at(self._step)
        items = []
        for _ in range(self._items_per_batch(batch_size)):
            try:
                items.append(next(self._parent))
            except StopIteration:
                self._exhausted = True
                break
        if not items or (self._rows_in(items) < batch_size and self._drop_remainder):
            raise StopIteration
        self._step += 1
        return self._combine(items, batch_size)

    # What an item of the parent is (a row here; a micro-batch in worker batching).

    def _items_per_batch(self, batch_size: int) -> int:
        return batch_size

    def _rows_in(self, items: list[Any]) -> int:
        return len(items)

    def _combine(self, items: list[Any], batch_size: int) -> dict[str, np.ndarray]:
        return stack_rows(items, batch_size, self._pad_value)

    def get_state(self) -> dict[str, Any]:
        return {"parent": self._parent.get_state(), "step": self._step}

    def set_state(self, state: dict[str, Any]) -> None:
        self._parent.set_state(state["parent"])
        self._step = int(state["step"])
        self._exhausted = False

    def __str__(self) -> str:
        return f"ScheduledBatchIterator(step={self._step})"
