"""Rows of a plan as pieces of documents, in compressed-row form.

A row is a list of pieces; a piece is `(source, document, start, stop)`: the
example positions `[start, stop)` of one document (see `example_tokens`). All
rows of a block, a step or a host batch share one set of flat arrays with row
offsets, so slicing and joining rows are a few numpy calls.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np


def example_tokens(lengths: np.ndarray, shift: bool, shift_target: bool) -> np.ndarray:
    """Input positions each document fills, matching `chunking.document_to_examples`.

    A document of n tokens becomes `tokens + [EOD]` (n inputs when targets
    are shifted left), `[EOD] + tokens + [EOD]` (n + 1 inputs when inputs are
    shifted right), or `tokens + [EOD]` unshifted (n + 1).
    """
    return np.asarray(lengths, dtype=np.int64) + eod_positions(shift, shift_target)


def eod_positions(shift: bool, shift_target: bool) -> int:
    """Input positions a document fills beyond its tokens (see `example_tokens`)."""
    return 0 if (shift and shift_target) else 1


@dataclasses.dataclass(frozen=True)
class Pieces:
    """Rows of document pieces.

    Attributes:
      row_offsets: int64[rows + 1]; row r holds pieces `row_offsets[r]:row_offsets[r+1]`.
      source: int32[pieces], index of the source in the plan.
      document: int64[pieces], document index within its source.
      start: int64[pieces], first example position of the piece.
      stop: int64[pieces], end (exclusive) of the piece.
    """

    row_offsets: np.ndarray
    source: np.ndarray
    document: np.ndarray
    start: np.ndarray
    stop: np.ndarray

    @property
    def rows(self) -> int:
        return len(self.row_offsets) - 1

    @property
    def tokens(self) -> int:
        return int((self.stop - self.start).sum())

    @classmethod
    def empty_rows(cls, rows: int) -> Pieces:
        """`rows` rows holding nothing (padding)."""
        empty = np.zeros(0, dtype=np.int64)
        return cls(np.zeros(rows + 1, np.int64), empty.astype(np.int32), empty, empty, empty)

    def row_slice(self, first: int, stop: int) -> Pieces:
        """Rows `[first, stop)`."""
        lo, hi = int(self.row_offsets[first]), int(self.row_offsets[stop])
        return Pieces(
            self.row_offsets[first : stop + 1] - lo,
            self.source[lo:hi],
            self.document[lo:hi],
            self.start[lo:hi],
            self.stop[lo:hi],
        )

    def take_rows(self, order: np.ndarray) -> Pieces:
        """Rows in the given order."""
        counts = np.diff(self.row_offsets)[order]
        starts = self.row_offsets[:-1][order]
        index = _ranges(starts, counts)
        return Pieces(
            np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
            self.source[index],
            self.document[index],
            self.start[index],
            self.stop[index],
        )

    def row_tokens(self) -> np.ndarray:
        """Each row's example positions filled (int64[rows]); the rest of a row is padding."""
        ends = np.zeros(len(self.start) + 1, dtype=np.int64)
        np.cumsum(self.stop - self.start, out=ends[1:])
        return ends[self.row_offsets[1:]] - ends[self.row_offsets[:-1]]

    def row_of_piece(self) -> np.ndarray:
        """The row each piece is in."""
        return np.repeat(np.arange(self.rows), np.diff(self.row_offsets))

    @staticmethod
    def concat(parts: Sequence[Pieces]) -> Pieces:
        """Rows of `parts`, one after the other."""
        if not parts:
            return Pieces.empty_rows(0)
        if len(parts) == 1:  # a stream's rows within one block, each step (pieces are immutable)
            return parts[0]
        offsets = [parts[0].row_offsets]
        base = int(parts[0].row_offsets[-1])
        for part in parts[1:]:
            offsets.append(part.row_offsets[1:] + base)
            base += int(part.row_offsets[-1])
        return Pieces(
            np.concatenate(offsets),
            np.concatenate([p.source for p in parts]),
            np.concatenate([p.document for p in parts]),
            np.concatenate([p.start for p in parts]),
            np.concatenate([p.stop for p in parts]),
        )

    def equals(self, other: Pieces) -> bool:
        """Whether two sets of rows hold the same pieces in the same places."""
        return all(
            np.array_equal(getattr(self, f.name), getattr(other, f.name))
            for f in dataclasses.fields(self)
        )

    def row_list(self, row: int) -> list[tuple[int, int, int, int]]:
        """One row as `(source, document, start, stop)` tuples (for tests and tools)."""
        lo, hi = int(self.row_offsets[row]), int(self.row_offsets[row + 1])
        return [
            (int(s), int(d), int(a), int(b))
            for s, d, a, b in zip(
                self.source[lo:hi],
                self.document[lo:hi],
                self.start[lo:hi],
                self.stop[lo:hi],
                strict=True,
            )
        ]


def _ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Concatenation of `arange(s, s + c)` for each (s, c), without a Python loop."""
    counts = np.asarray(counts, dtype=np.int64)
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    ends = np.cumsum(counts)
    index = np.arange(total, dtype=np.int64) - np.repeat(ends - counts, counts)
    return index + np.repeat(np.asarray(starts, dtype=np.int64), counts)
