"""Applies a function to every row, without a grain map stage's bookkeeping.

A grain `.map` stage records statistics and output specs for every element,
about 5 us per row (`bench/README.md`), several times the cost of the small
per-row steps it would run here: renaming packed fields, padding one example,
tagging a mixture component. Those steps use this dataset instead. Its state
is the parent's, exactly as a grain map's is, so checkpoints do not change.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grain


class RowMapIterDataset(grain.IterDataset):
    """`fn(row)` for every row of the parent (`fn` must pickle, for workers)."""

    def __init__(self, parent: grain.IterDataset, fn: Callable[[Any], Any]):
        super().__init__(parent)
        self._fn = fn

    def __iter__(self) -> _RowMapIterator:
        return _RowMapIterator(self._parent.__iter__(), self._fn)

    def __str__(self) -> str:
        return f"RowMapIterDataset({self._fn!r})"


class _RowMapIterator(grain.DatasetIterator):
    def __init__(self, parent: grain.DatasetIterator, fn: Callable[[Any], Any]):
        super().__init__(parent)
        self._fn = fn

    def __next__(self) -> Any:
        return self._fn(next(self._parent))

    def get_state(self) -> Any:
        return self._parent.get_state()

    def set_state(self, state: Any) -> None:
        self._parent.set_state(state)
