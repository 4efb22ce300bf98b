"""One source's packed rows: the sequence its documents fill, mixture or not.

Each source is packed on its own, block by block: a block is the documents
at positions `[p, p + K)` of the source's sequence of epoch permutations
(`order`), cut at the end of the epoch, packed into rows (`packing`). The
rows of a source's blocks, one after the other, are its *row sequence*; the
mixture (`mixing`) only decides how many of the next rows of each source
fill a step. So:

- a block never mixes two epochs: every piece of epoch e of a source is
  served before any piece of epoch e + 1 (blocks larger than an epoch used to
  wrap into the next one and repeat documents inside an epoch); with
  `concat` only the block's last row reaches on into the following documents,
  whatever their epoch, so that every row is full (below);
- which rows a source's documents make never depends on the weights, so a
  mixture stage (or an online update) changes only which rows come when.

With `concat`, a block's last row is completed from the documents after the
block, the last of them cut where the row ends; the next block starts at that
document, `offset` example positions in. Rows are then full everywhere but
at the end of a finite run, as in Megatron's concatenated stream, where a
block-sized cut used to leave one part-filled row per block.

A position in the sequence is `(block start, offset into its first document,
rows taken of that block)`.
"""

from __future__ import annotations

import collections
import dataclasses
import threading

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
      offset: Example positions of the document at `start` an earlier block took.
      end: The next block's start.
      end_offset: The next block's `offset` (`concat`: its last row took them).
      pieces: Its rows.
      units: Per row, what the mixture counts: example tokens, or documents
        begun in the row (`mixture_unit="documents"`).
    """

    start: int
    offset: int
    end: int
    end_offset: int
    pieces: Pieces
    units: np.ndarray


#: Blocks a source keeps planned (`BlockCache`): the few a restart goes back to.
BLOCKS_KEPT = 4


class BlockCache:
    """The blocks a source planned last, by `(start, offset)`.

    A block is a pure function of the spec without its mixture stages, the
    source and `(start, offset)`, so the plans that differ only in their
    mixture (`GlobalPlan.with_mixture`) share one cache per source. A restart
    plans again the blocks its cursor is in: after a `set_mixture`, the first
    batch of `configs/mixture_rampup.py` waited 10-30 ms for its 3 sources'
    blocks, 8-9 ms of it packing them again (the same rows). An eval pass, a
    rewind and a restore in the same process start at blocks planned before
    too. Thread-safe: the pipeline plans in its own thread.
    """

    def __init__(self, capacity: int = BLOCKS_KEPT):
        self._capacity = capacity
        self._blocks: collections.OrderedDict[tuple[int, int], Block] = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, start: int, offset: int) -> Block | None:
        with self._lock:
            block = self._blocks.get((start, offset))
            if block is not None:
                self._blocks.move_to_end((start, offset))
            return block

    def put(self, block: Block) -> None:
        with self._lock:
            self._blocks[(block.start, block.offset)] = block
            self._blocks.move_to_end((block.start, block.offset))
            while len(self._blocks) > self._capacity:
                self._blocks.popitem(last=False)


class SourceRows:
    """Plans the blocks of one source (a pure function of the spec and lengths).

    Args:
      spec: The plan's spec.
      index: The source's index in the plan (the pieces' `source`).
      lengths: Every document's token count.
      order: The source's document order.
      blocks: Its planned blocks, shared with the plans that differ from this
        one only in their mixture stages (a new cache if None).
    """

    def __init__(
        self,
        spec: PlanSpec,
        index: int,
        lengths: np.ndarray,
        order: SourceOrder,
        blocks: BlockCache | None = None,
    ):
        self.spec = spec
        self.index = index
        self.lengths = lengths
        self.order = order
        self.blocks = BlockCache() if blocks is None else blocks
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

    def _sizes(self, first: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """Documents at positions `[first, stop)` and their example positions."""
        documents = self.order.documents(np.arange(first, stop, dtype=np.int64))
        spec = self.spec
        return documents, example_tokens(self.lengths[documents], spec.shift, spec.shift_target)

    def _row_completion(self, end: int, need: int) -> tuple[np.ndarray, np.ndarray, int, int]:
        """The documents after position `end` that complete a row missing `need` positions.

        Returns:
          Their documents and the positions each gives (the last one cut
          where the row is full), and the next block's start and offset.
          Short of `need` only where a finite run ends.
        """
        parts: list[tuple[np.ndarray, np.ndarray]] = []
        position = end
        while need > 0 and not self.ended(position):
            # Every document gives at least one position, except empty ones
            # with targets shifted left: then look further.
            stop = position + max(need, 64)
            if self.end is not None:
                stop = min(stop, self.end)
            documents, sizes = self._sizes(position, stop)
            reached = np.cumsum(sizes)
            k = int(np.searchsorted(reached, need))
            if k == len(sizes):
                parts.append((documents, sizes))
                need -= int(reached[-1])
                position = stop
                continue
            taken = need - (int(reached[k - 1]) if k else 0)
            cut = sizes[: k + 1].copy()
            cut[k] = taken
            parts.append((documents[: k + 1], cut))
            position += k
            if taken == int(sizes[k]):
                return *_joined(parts), position + 1, 0
            return *_joined(parts), position, taken
        return *_joined(parts), position, 0

    def block(self, start: int, offset: int = 0) -> Block:
        """The block at position `start`, `offset` positions into its first document."""
        block = self.blocks.get(start, offset)
        if block is None:
            block = self._plan_block(start, offset)
            self.blocks.put(block)
        return block

    def _plan_block(self, start: int, offset: int) -> Block:
        spec = self.spec
        end = self.block_end(start)
        documents, sizes = self._sizes(start, end)
        first = np.zeros_like(sizes)
        first[:1] = offset
        next_start, next_offset = end, 0
        if spec.packing == "concat":
            missing = -int((sizes - first).sum()) % spec.row_length
            more, more_sizes, next_start, next_offset = self._row_completion(end, missing)
            documents = np.concatenate([documents, more])
            sizes = np.concatenate([sizes, more_sizes])
            first = np.concatenate([first, np.zeros_like(more_sizes)])
        rng = None
        if spec.shuffle:
            name = spec.names[self.index]
            rng = np.random.default_rng(derive_seed(spec.seed, "block", name, start))
        sources = np.full(len(documents), self.index, dtype=np.int32)
        pieces = pack_block(sources, documents, sizes, spec.row_length, spec.packing, rng, first)
        if not spec.shuffle and spec.packing in ("best_fit", "first_fit") and pieces.rows > 1:
            # Unshuffled (eval): rows in the order of their first document, so a
            # pass starts with the corpus's first documents.
            first = np.minimum.reduceat(pieces.document, pieces.row_offsets[:-1])
            pieces = pieces.take_rows(np.argsort(first, kind="stable"))
        units = row_units(pieces, spec.mixture_unit)
        return Block(start, offset, next_start, next_offset, pieces, units)


def _joined(parts: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    if not parts:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate([d for d, _ in parts]), np.concatenate([s for _, s in parts])


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
      offset: Positions of that block's first document taken before it.
      skip: Rows of that block already taken.
    """

    def __init__(self, rows: SourceRows, start: int, offset: int, skip: int):
        self.source = rows
        #: Planned blocks with the walker-relative row of their first row.
        self._blocks: collections.deque[tuple[int, Block]] = collections.deque()
        self._next_start = start
        self._next_offset = offset
        self._next_row = -skip  # walker row of the next block's first row
        self.ended = False

    def _plan_next(self) -> None:
        if self.source.ended(self._next_start):
            self.ended = True
            return
        block = self.source.block(self._next_start, self._next_offset)
        self._blocks.append((self._next_row, block))
        self._next_start, self._next_offset = block.end, block.end_offset
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

    def positions(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Where the walker is with each of `rows` next: `(block starts, offsets, rows taken)`.

        For each row, the start of the block it is in, that block's offset
        and the rows of the block before it; past the planned blocks, the
        next block's start and offset.
        """
        rows = np.asarray(rows, dtype=np.int64)
        if len(rows):
            self.planned_rows(int(rows.max()) + 1)
        start = np.full(len(rows), self._next_start, dtype=np.int64)
        offset = np.full(len(rows), self._next_offset, dtype=np.int64)
        taken = rows - self._next_row
        for first, block in self._blocks:
            inside = (rows >= first) & (rows < first + block.pieces.rows)
            start[inside] = block.start
            offset[inside] = block.offset
            taken[inside] = rows[inside] - first
        return start, offset, taken

    def release(self, row: int) -> None:
        """Forgets blocks wholly before walker row `row`."""
        while self._blocks and self._blocks[0][0] + self._blocks[0][1].pieces.rows <= row:
            self._blocks.popleft()
