"""One source's packed rows: the sequence its documents fill, mixture or not.

Each source is packed on its own, block by block: a block is the documents
at positions `[p, p + K)` of the source's sequence of epoch permutations
(`order`), cut at the end of the epoch, packed into rows (`packing`). The
rows of a source's blocks, one after the other, are its *row sequence*; the
mixture (`mixing`) only decides how many of the next rows of each source
fill a step. So:

- a block never mixes two epochs: every piece of epoch e of a source is
  served before any piece of epoch e + 1 (blocks larger than an epoch used to
  wrap into the next one and repeat documents inside an epoch);
- which rows a source's documents make never depends on the weights, so a
  mixture stage (or an online update) changes only which rows come when.

A position in the sequence is `(block start, rows taken of that block)`.
"""

from __future__ import annotations

import collections
import dataclasses

import numpy as np

from xlstm_data.plan.order import SourceOrder
from xlstm_data.plan.packing import pack_block
from xlstm_data.plan.permutation import derive_seed
from xlstm_data.plan.pieces import Pieces, example_tokens
from xlstm_data.plan.spec import PlanSpec


@dataclasses.dataclass(frozen=True)
class Block:
    """A planned block of one source.

    Attributes:
      start: Its first position in the source's sequence.
      end: One past its last position (the next block's start).
      pieces: Its rows.
      units: Per row, what the mixture counts: example tokens, or documents
        begun in the row (`mixture_unit="documents"`).
    """

    start: int
    end: int
    pieces: Pieces
    units: np.ndarray


class SourceRows:
    """Plans the blocks of one source (a pure function of the spec and lengths).

    Args:
      spec: The plan's spec.
      index: The source's index in the plan (the pieces' `source`).
      lengths: Every document's token count.
      order: The source's document order.
    """

    def __init__(self, spec: PlanSpec, index: int, lengths: np.ndarray, order: SourceOrder):
        self.spec = spec
        self.index = index
        self.lengths = lengths
        self.order = order
        #: Positions in the whole run (finite runs), or None (endless).
        self.end = None if spec.num_epochs is None else len(lengths) * spec.num_epochs

    @property
    def num_documents(self) -> int:
        return self.order.num_documents

    def block_end(self, start: int) -> int:
        """One past the last position of the block at `start` (never past its epoch)."""
        n = self.num_documents
        end = min(start + self.spec.block_documents, (start // n + 1) * n)
        return end if self.end is None else min(end, self.end)

    def ended(self, start: int) -> bool:
        return self.end is not None and start >= self.end

    def block(self, start: int) -> Block:
        """The block at position `start`."""
        spec = self.spec
        end = self.block_end(start)
        documents = self.order.documents(np.arange(start, end, dtype=np.int64))
        sizes = example_tokens(self.lengths[documents], spec.shift, spec.shift_target)
        rng = None
        if spec.shuffle:
            name = spec.names[self.index]
            rng = np.random.default_rng(derive_seed(spec.seed, "block", name, start))
        sources = np.full(len(documents), self.index, dtype=np.int32)
        pieces = pack_block(sources, documents, sizes, spec.row_length, spec.packing, rng)
        if not spec.shuffle and spec.packing in ("best_fit", "first_fit") and pieces.rows > 1:
            # Unshuffled (eval): rows in the order of their first document, so a
            # pass starts with the corpus's first documents.
            first = np.minimum.reduceat(pieces.document, pieces.row_offsets[:-1])
            pieces = pieces.take_rows(np.argsort(first, kind="stable"))
        return Block(start, end, pieces, row_units(pieces, spec.mixture_unit))


def row_units(pieces: Pieces, unit: str) -> np.ndarray:
    """Per row, example tokens (`unit="tokens"`) or documents begun in it."""
    if unit == "tokens":
        per_piece = pieces.stop - pieces.start
    else:
        per_piece = (pieces.start == 0).astype(np.int64)
    sums = np.concatenate([[0], np.cumsum(per_piece, dtype=np.int64)])
    return sums[pieces.row_offsets[1:]] - sums[pieces.row_offsets[:-1]]


class RowWalker:
    """Walks one source's row sequence forward from a position.

    Rows are numbered from the walker's origin (0 = the first row at the
    position it started at). Blocks before the lowest row still wanted are
    dropped (`release`).

    Args:
      rows: The source's planner.
      start: Start of the block the walker begins in.
      skip: Rows of that block already taken.
    """

    def __init__(self, rows: SourceRows, start: int, skip: int):
        self.source = rows
        #: Planned blocks with the walker-relative row of their first row.
        self._blocks: collections.deque[tuple[int, Block]] = collections.deque()
        self._next_start = start
        self._next_row = -skip  # walker row of the next block's first row
        self.ended = False

    def _plan_next(self) -> None:
        if self.source.ended(self._next_start):
            self.ended = True
            return
        block = self.source.block(self._next_start)
        self._blocks.append((self._next_row, block))
        self._next_start = block.end
        self._next_row += block.pieces.rows

    def planned_rows(self, count: int) -> int:
        """Plans through walker row `count - 1` where the sequence has it; returns rows planned."""
        while not self.ended and self._next_row < count:
            self._plan_next()
        return max(0, self._next_row)

    def units(self, first: int, count: int) -> np.ndarray:
        """Units of walker rows `[first, first + count)` (fewer at a finite end)."""
        stop = min(first + count, self.planned_rows(first + count))
        parts = []
        for row, block in self._blocks:
            lo, hi = max(first, row), min(stop, row + block.pieces.rows)
            if lo < hi:
                parts.append(block.units[lo - row : hi - row])
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    def pieces(self, rows: np.ndarray) -> Pieces:
        """The pieces of the given walker rows (increasing, all planned already)."""
        rows = np.asarray(rows, dtype=np.int64)
        parts = []
        for first, block in self._blocks:
            lo, hi = np.searchsorted(rows, [first, first + block.pieces.rows])
            if lo < hi:
                parts.append(block.pieces.take_rows(rows[lo:hi] - first))
        return Pieces.concat(parts)

    def position(self, row: int) -> tuple[int, int]:
        """`(block start, rows taken of it)` with walker row `row` next (planned through)."""
        self.planned_rows(row + 1)
        for first, block in self._blocks:
            if first <= row < first + block.pieces.rows:
                return block.start, row - first
        return self._next_start, row - self._next_row

    def release(self, row: int) -> None:
        """Forgets blocks wholly before walker row `row`."""
        while self._blocks and self._blocks[0][0] + self._blocks[0][1].pieces.rows <= row:
            self._blocks.popleft()
