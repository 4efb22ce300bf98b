"""Logical streams: the plan's unit of parallel planning and of resumable state.

The global batch of every step is split into V equal slices; slice v of every
step comes from stream v, which plans its rows block by block. A stream's
cursor (block index, rows before the block, documents taken from each source)
is all it needs to continue, so the saved position is V small cursors, and a
restore at any step costs one block of planning, not a replay.

Stream v takes positions v, v + V, v + 2V, ... of each source's sequence, so
the streams together cover every document exactly once per epoch.
"""

from __future__ import annotations

import collections
import dataclasses
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from xlstm_data.errors import DataCheckpointError, DataConfigError
from xlstm_data.plan.mixture import block_counts, document_shares
from xlstm_data.plan.order import SourceOrder
from xlstm_data.plan.packing import pack_block
from xlstm_data.plan.permutation import derive_seed
from xlstm_data.plan.pieces import Pieces, example_tokens
from xlstm_data.plan.spec import PlanSpec

#: `Cursor.carry` document of a source with nothing carried.
NO_CARRY = -1
#: Host rows a `HostPlanner` takes from its streams at once (whole steps). Per
#: step a batch is then one slice of them: slicing and joining each stream's
#: rows every step was 15 % of the pipeline's CPU (cProfile, 8 streams, rows
#: of 1024, host batch 8), the cost of planning itself under 3 %.
WINDOW_ROWS = 1024


@dataclasses.dataclass(frozen=True)
class Cursor:
    """Where a stream's block starts.

    Attributes:
      block: Index of the block in the stream.
      row: Stream rows planned before the block.
      taken: Per source, documents the stream took before the block.
      credit: Per source, tokens the stream still owes (<= 0: the last
        document taken overshot the token budget by that much).
      carry: Per source, `(document, first position)` of a document whose
        first rows ended a mixture stage (-1: none); its remaining positions
        open the next block in which the source is read.
    """

    block: int
    row: int
    taken: tuple[int, ...]
    credit: tuple[int, ...]
    carry: tuple[tuple[int, int], ...]

    def to_list(self) -> list[int]:
        documents = [d for d, _ in self.carry]
        starts = [s for _, s in self.carry]
        return [self.block, self.row, *self.taken, *self.credit, *documents, *starts]

    @classmethod
    def from_list(cls, values: Sequence[int]) -> Cursor:
        n = (len(values) - 2) // len(PER_SOURCE_FIELDS)
        values = [int(v) for v in values]
        field = [values[2 + i * n : 2 + (i + 1) * n] for i in range(len(PER_SOURCE_FIELDS))]
        taken, credit, documents, starts = field
        carry = tuple(zip(documents, starts, strict=True))
        return cls(values[0], values[1], tuple(taken), tuple(credit), carry)


#: The per-source fields of a cursor's list form, in order, with their value
#: for a source the cursor does not know (a dataset added on resume).
PER_SOURCE_FIELDS = (("taken", 0), ("credit", 0), ("carry_document", NO_CARRY), ("carry_start", 0))


class GlobalPlan:
    """The plan of one run: a pure function of the spec and the document lengths.

    Args:
      spec: The validated spec.
      lengths: Per source (in `spec.names` order), every document's token count.
    """

    def __init__(self, spec: PlanSpec, lengths: Sequence[np.ndarray]):
        if len(lengths) != len(spec.names):
            raise ValueError(f"{len(lengths)} length arrays for {len(spec.names)} sources")
        self.spec = spec
        self.lengths = [x if isinstance(x, np.ndarray) else np.asarray(x) for x in lengths]
        means = []
        for name, array in zip(spec.names, self.lengths, strict=True):
            if len(array) == 0:
                raise DataConfigError(f"data.train.{name} has no documents")
            mean = float(example_tokens(np.asarray(array.mean()), spec.shift, spec.shift_target))
            if mean <= 0:
                raise DataConfigError(f"data.train.{name} has only empty documents")
            means.append(mean)
        self.mean_tokens = np.asarray(means)
        self.orders = [
            SourceOrder(len(array), spec.seed, name, spec.shuffle)
            for name, array in zip(spec.names, self.lengths, strict=True)
        ]
        self._shares = [
            document_shares(weights, self.mean_tokens, spec.mixture_unit)
            for weights in spec.mixture.weights
        ]
        self._total_rows: list[int] | None = None
        #: Sources are drawn by token budgets (else by document counts).
        self._token_budgets = spec.mixture_unit == "tokens" and spec.num_epochs is None

    def __getstate__(self) -> dict[str, Any]:
        """Worker processes get memory-mapped lengths as their file, not a copy."""
        state = dict(self.__dict__)
        state["lengths"] = [_MappedLengths.wrap(array) for array in self.lengths]
        state["orders"] = [order.without_cache() for order in self.orders]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state["lengths"] = [
            array.open() if isinstance(array, _MappedLengths) else array
            for array in state["lengths"]
        ]
        self.__dict__.update(state)

    def token_shares(self, stage: int) -> np.ndarray:
        """Each source's planned share of the tokens in a mixture stage."""
        tokens = self._shares[stage] * self.mean_tokens
        return tokens / tokens.sum()

    # Geometry ---------------------------------------------------------------

    @property
    def streams(self) -> int:
        return self.spec.streams

    def stream_rows(self, step: int) -> tuple[int, int]:
        """`(first stream row of step, rows per stream at step)`."""
        first = self.spec.batch.examples_seen(step) // self.streams
        return first, self.spec.batch.global_batch_size_at(step) // self.streams

    def step_of_stream_row(self, row: int) -> int:
        """The step whose slice of a stream holds stream row `row`."""
        return self.spec.batch.step_for_examples(row * self.streams + 1) - 1

    def host_streams(self, host_index: int, host_count: int) -> range:
        """Streams a data host's rows come from (the same at every step)."""
        first = host_index * self.streams // host_count
        last = -(-(host_index + 1) * self.streams // host_count)
        return range(first, last)

    def start_cursor(self) -> Cursor:
        n = len(self.spec.names)
        return Cursor(0, 0, (0,) * n, (0,) * n, ((NO_CARRY, 0),) * n)

    # Blocks -----------------------------------------------------------------

    def _available(self, source: int, stream: int) -> int | None:
        """Documents the stream may take from a source in a finite run."""
        if self.spec.num_epochs is None:
            return None
        total = len(self.lengths[source]) * self.spec.num_epochs
        return max(0, -(-(total - stream) // self.streams))

    def _rows_to_next_stage(self, row: int) -> int | None:
        """Stream rows from `row` to the next mixture stage's first row (None: last stage)."""
        starts = self.spec.mixture.starts
        stage = self.spec.mixture.stage_at(self.step_of_stream_row(row))
        if stage + 1 >= len(starts):
            return None
        return self.spec.batch.examples_seen(starts[stage + 1]) // self.streams - row

    def plan_block(self, stream: int, cursor: Cursor) -> tuple[Pieces, Cursor, int]:
        """Plans the block at `cursor`.

        A block lies within one mixture stage: near a stage boundary it takes
        fewer documents, so that its rows end at the boundary. When even one
        document needs more rows than are left, its first positions fill the
        rows up to the boundary and the rest is carried (in the cursor) to the
        next block that reads its source, so the new stage's weights hold from
        its first step: a source turned off is not read on.

        Returns:
          `(rows, cursor of the next block, documents taken)`; 0 documents
          (and no carried rest) means the stream has ended (finite runs only).
        """
        rows_left = self._rows_to_next_stage(cursor.row)
        documents = self.spec.block_documents
        while True:
            planned = self._plan_documents(stream, cursor, documents)
            rows = planned[0].rows
            if rows_left is None or rows <= rows_left:
                return planned
            if documents == 1:
                return self._plan_to_boundary(stream, cursor, rows_left)
            documents = max(1, min(documents - 1, documents * rows_left // rows))

    def _documents_at(self, source: int, stream: int, first: int, count: int) -> np.ndarray:
        """Documents at the stream's `count` positions of a source from its `first`."""
        positions = stream + (first + np.arange(count, dtype=np.int64)) * self.streams
        return self.orders[source].documents(positions)

    def _sizes(self, source: int, documents: np.ndarray) -> np.ndarray:
        spec = self.spec
        return example_tokens(self.lengths[source][documents], spec.shift, spec.shift_target)

    def _take_tokens(
        self, source: int, stream: int, first: int, budget: int
    ) -> tuple[np.ndarray, int]:
        """The stream's next documents of a source until `budget` tokens are reached.

        The document that crosses the budget is taken too; the overshoot
        (at most one document) is owed back by the next block (its credit).
        """
        documents = np.zeros(0, dtype=np.int64)
        total = 0
        while total < budget:
            guess = max(8, int(1.25 * (budget - total) / self.mean_tokens[source]) + 1)
            more = self._documents_at(source, stream, first + len(documents), guess)
            sizes = np.cumsum(self._sizes(source, more)) + total
            enough = int(np.searchsorted(sizes, budget, side="left"))
            if enough < guess:
                documents = np.concatenate([documents, more[: enough + 1]])
                total = int(sizes[enough])
                break
            documents = np.concatenate([documents, more])
            total = int(sizes[-1])
        return documents, total

    def _block_items(
        self, stream: int, cursor: Cursor, block_documents: int
    ) -> tuple[_Items, list[int], list[int], list[tuple[int, int]]]:
        """The block's items in block order: carried rests of sources this stage reads
        first, then the documents drawn for the block. Returns the items with the taken,
        credit and carry lists that follow them."""
        spec = self.spec
        stage = spec.mixture.stage_at(self.step_of_stream_row(cursor.row))
        weights = spec.mixture.weights[stage]
        taken, credit, carry = list(cursor.taken), list(cursor.credit), list(cursor.carry)
        carried: list[tuple[int, int, int]] = []
        carried_tokens = [0] * len(weights)
        for index, (document, start) in enumerate(carry):
            if document != NO_CARRY and weights[index] > 0:
                carried.append((index, document, start))
                size = int(self._sizes(index, np.asarray([document]))[0])
                carried_tokens[index] = size - start
                carry[index] = (NO_CARRY, 0)
        drawn: list[np.ndarray] = []
        sources: list[int] = []  # the source of each of `drawn`
        if self._token_budgets:
            block_tokens = block_documents * float(self._shares[stage] @ self.mean_tokens)
            budgets = {}
            for index, weight in enumerate(weights):
                if weight == 0:
                    continue
                budget = int(round(block_tokens * weight)) + credit[index]
                budget -= carried_tokens[index]
                budgets[index] = budget
                if budget <= 0:
                    credit[index] = budget
                    continue
                docs, tokens = self._take_tokens(index, stream, taken[index], budget)
                credit[index] = budget - tokens
                taken[index] += len(docs)
                drawn.append(docs)
                sources.append(index)
            if not drawn and not carried:
                # A small block near a stage boundary whose every budget is owed
                # already: it still takes one document (an empty block ends a stream).
                index = max(budgets, key=lambda i: (budgets[i], -i))
                docs = self._documents_at(index, stream, taken[index], 1)
                credit[index] = budgets[index] - int(self._sizes(index, docs)[0])
                taken[index] += 1
                drawn.append(docs)
                sources.append(index)
        else:
            offset = float(self._block_rng(stream, cursor).random())
            counts = block_counts(self._shares[stage], block_documents, offset)
            for index, count in enumerate(counts.tolist()):
                available = self._available(index, stream)
                if available is not None:
                    count = min(count, available - taken[index])
                if count <= 0:
                    continue
                drawn.append(self._documents_at(index, stream, taken[index], count))
                sources.append(index)
                taken[index] += count
        counts = [len(docs) for docs in drawn]
        front = np.asarray(carried, dtype=np.int64).reshape(-1, 3)
        items = _Items(
            source=np.concatenate(
                [front[:, 0], np.repeat(np.asarray(sources, np.int64), counts)]
            ).astype(np.int32),
            document=np.concatenate([front[:, 1], *drawn]).astype(np.int64, copy=False),
            first=np.concatenate([front[:, 2], np.zeros(sum(counts), np.int64)]),
            carried=len(carried),
        )
        return items, taken, credit, carry

    def _plan_documents(
        self, stream: int, cursor: Cursor, block_documents: int
    ) -> tuple[Pieces, Cursor, int]:
        spec = self.spec
        items, taken, credit, carry = self._block_items(stream, cursor, block_documents)
        if not len(items.source):
            return Pieces.empty_rows(0), cursor, 0
        source, document, first = items.source, items.document, items.first
        rng = self._block_rng(stream, cursor)
        rng.random()  # the draw the document counts use
        if spec.shuffle:
            order = rng.permutation(len(source))
            source, document, first = source[order], document[order], first[order]
        pieces = pack_block(
            source,
            document,
            self._item_sizes(source, document),
            spec.row_length,
            spec.packing,
            rng if spec.shuffle else None,
            first=first,
        )
        following = Cursor(
            cursor.block + 1, cursor.row + pieces.rows, tuple(taken), tuple(credit), tuple(carry)
        )
        return pieces, following, len(source)

    def _block_rng(self, stream: int, cursor: Cursor) -> np.random.Generator:
        """The block's random stream: document counts, then order and row shuffles."""
        return np.random.default_rng(derive_seed(self.spec.seed, "block", stream, cursor.block))

    def _item_sizes(self, source: np.ndarray, document: np.ndarray) -> np.ndarray:
        sizes = np.empty(len(source), dtype=np.int64)
        for index in np.unique(source):
            chosen = source == index
            sizes[chosen] = self._sizes(int(index), document[chosen])
        return sizes

    def _plan_to_boundary(self, stream: int, cursor: Cursor, rows_left: int):
        """The last block of a stage when a single document overflows it.

        The block's items (carried rests, then one drawn document) are laid
        end to end, as `concat` does, and cut after `rows_left` rows (with
        `packing="none"`, one chunk per row). The item cut in two leaves its
        rest in the carry; items wholly after the cut are not in this block
        (a drawn one is not taken, a carried one stays carried).
        """
        spec = self.spec
        items, taken, credit, carry = self._block_items(stream, cursor, 1)
        source, document, first = items.source, items.document, items.first
        sizes = self._item_sizes(source, document)
        length = spec.row_length
        used = sizes - first
        if spec.packing == "none":
            used = -(-used // length) * length  # whole rows per item
        begins = np.cumsum(used) - used
        room = rows_left * length
        placed = []
        listed = zip(source.tolist(), document.tolist(), first.tolist(), strict=True)
        for i, (index, doc, start) in enumerate(listed):
            carried = i < items.carried
            stop = int(min(sizes[i], start + room - begins[i]))
            if stop <= start:  # wholly after the cut: not in this block
                if carried:
                    carry[index] = (doc, start)
                else:
                    taken[index] -= 1  # drawn last, so the source's last one taken
                stop = start
            else:
                placed.append((i, stop))
                if stop < sizes[i]:
                    carry[index] = (doc, stop)
            if self._token_budgets:
                credit[index] += int(sizes[i] - stop)  # not placed: still owed
        keep = [i for i, _ in placed]
        stops = np.asarray([s for _, s in placed], dtype=np.int64)
        mode = "none" if spec.packing == "none" else "concat"
        pieces = pack_block(
            source[keep], document[keep], stops, length, mode, None, first=first[keep]
        )
        following = Cursor(
            cursor.block + 1, cursor.row + pieces.rows, tuple(taken), tuple(credit), tuple(carry)
        )
        return pieces, following, len(keep)

    # Finite runs ------------------------------------------------------------

    def total_stream_rows(self) -> list[int]:
        """Rows each stream holds in a finite run (plans every block once)."""
        if self.spec.num_epochs is None:
            raise ValueError("an endless run has no total")
        if self._total_rows is None:
            totals = []
            for stream in range(self.streams):
                cursor = self.start_cursor()
                while True:
                    _, cursor, taken = self.plan_block(stream, cursor)
                    if taken == 0:
                        break
                totals.append(cursor.row)
            self._total_rows = totals
        return self._total_rows

    def num_steps(self) -> int | None:
        """Global steps of a finite run (exact, packing included); None if endless."""
        if self.spec.num_epochs is None:
            return None
        totals = self.total_stream_rows()
        batch = self.spec.batch
        if self.spec.drop_remainder:
            return batch.step_for_examples(min(totals) * self.streams + 1) - 1
        return batch.step_for_examples(max(totals) * self.streams)


@dataclasses.dataclass(frozen=True)
class _Items:
    """A block's items: documents (or the rests of carried ones) to place.

    Attributes:
      source: int32, each item's source.
      document: int64, its document.
      first: int64, its first position to place (> 0 only for a carried rest).
      carried: How many items, at the front, are carried rests.
    """

    source: np.ndarray
    document: np.ndarray
    first: np.ndarray
    carried: int


@dataclasses.dataclass(frozen=True)
class _MappedLengths:
    """A memory-mapped lengths array, pickled as its file (re-mapped on load)."""

    filename: str
    dtype: str
    offset: int
    shape: tuple[int, ...]

    @classmethod
    def wrap(cls, array: np.ndarray) -> np.ndarray | _MappedLengths:
        if not isinstance(array, np.memmap) or array.filename is None:
            return array
        return cls(array.filename, array.dtype.str, array.offset, array.shape)

    def open(self) -> np.ndarray:
        return np.memmap(
            self.filename, dtype=self.dtype, mode="r", offset=self.offset, shape=self.shape
        )


class StreamPlanner:
    """Plans one stream forward from a cursor and hands out its rows.

    Rows are requested in increasing order (a restore starts a new planner at
    the saved cursor); blocks before the lowest row asked for are dropped.
    """

    def __init__(self, plan: GlobalPlan, stream: int, cursor: Cursor):
        self.plan = plan
        self.stream = stream
        self._blocks: collections.deque[tuple[Cursor, Pieces]] = collections.deque()
        self._next = cursor
        self.ended = False

    def _plan_next(self) -> None:
        pieces, following, taken = self.plan.plan_block(self.stream, self._next)
        if taken == 0:
            self.ended = True
            return
        self._blocks.append((self._next, pieces))
        self._next = following

    def _plan_through(self, row: int) -> None:
        while not self.ended and self._next.row <= row:
            self._plan_next()

    def _first_row(self) -> int:
        return self._blocks[0][0].row if self._blocks else self._next.row

    def _check_not_before(self, row: int) -> None:
        if row < self._first_row():
            raise DataCheckpointError(
                f"stream {self.stream} was asked for row {row}, before its cursor at row "
                f"{self._first_row()}; a planner only moves forward"
            )

    def rows(self, first: int, count: int) -> Pieces:
        """Stream rows `[first, first + count)`; rows past a finite end are empty."""
        self._check_not_before(first)
        while self._blocks and self._blocks[0][0].row + self._blocks[0][1].rows <= first:
            self._blocks.popleft()
        self._plan_through(first + count - 1)
        parts = []
        stop = first + count
        for cursor, pieces in self._blocks:
            lo, hi = max(first, cursor.row), min(stop, cursor.row + pieces.rows)
            if lo < hi:
                parts.append(pieces.row_slice(lo - cursor.row, hi - cursor.row))
        planned = sum(p.rows for p in parts)
        if planned < count:
            parts.append(Pieces.empty_rows(count - planned))
        return Pieces.concat(parts)

    def cursor_at(self, row: int) -> Cursor:
        """The cursor of the block holding stream row `row` (or the end cursor)."""
        return self.block_at(row)[0]

    def block_at(self, row: int) -> tuple[Cursor, int, int]:
        """`(cursor, first row, end row)` of the block holding stream row `row`; past a
        finite end, the end cursor, valid from the last row on."""
        self._check_not_before(row)
        self._plan_through(row)
        for cursor, pieces in self._blocks:
            if cursor.row <= row < cursor.row + pieces.rows:
                return cursor, cursor.row, cursor.row + pieces.rows
        return self._next, self._next.row, sys.maxsize


@dataclasses.dataclass(frozen=True)
class _Window:
    """A host's rows of steps `[first_step, end_step)`, step after step."""

    first_step: int
    end_step: int
    rows_per_step: int
    pieces: Pieces


@dataclasses.dataclass(frozen=True)
class _CursorSpan:
    """The host's cursors while the first stream row of a step is in `[first, end)`."""

    first: int
    end: int
    cursors: dict[int, Cursor]
    table: np.ndarray


class HostPlanner:
    """A data host's rows of each step, from the streams its rows lie in.

    Args:
      plan: The global plan.
      host_index: This data host.
      host_count: Data hosts; must divide every stage's global batch.
      cursors: Cursors of (at least) this host's streams at a restored step,
        or None to start at step 0.
    """

    def __init__(
        self,
        plan: GlobalPlan,
        host_index: int,
        host_count: int,
        cursors: Mapping[int, Cursor] | None = None,
    ):
        self.plan = plan
        self.host_index = host_index
        self.host_count = host_count
        self.streams = plan.host_streams(host_index, host_count)
        planners = {}
        for stream in self.streams:
            if cursors is None:
                cursor = plan.start_cursor()
            elif stream in cursors:
                cursor = cursors[stream]
            else:
                raise DataCheckpointError(
                    f"the saved data position has no cursor for stream {stream}"
                )
            planners[stream] = StreamPlanner(plan, stream, cursor)
        self._planners = planners
        self._window: _Window | None = None
        self._cursors: _CursorSpan | None = None

    def host_rows(self, step: int) -> tuple[int, int]:
        """`(first global row, rows)` of this host at `step`."""
        batch = self.plan.spec.batch.global_batch_size_at(step)
        per_host = batch // self.host_count
        return self.host_index * per_host, per_host

    def pieces_at(self, step: int) -> Pieces:
        """This host's rows of the global batch at `step`, in row order."""
        window = self._window
        if window is None or not window.first_step <= step < window.end_step:
            window = self._window = self._plan_window(step)
        first = (step - window.first_step) * window.rows_per_step
        return window.pieces.row_slice(first, first + window.rows_per_step)

    def _plan_window(self, step: int) -> _Window:
        """The host's rows of the steps from `step` on, up to `WINDOW_ROWS` rows and within
        one batch size: each stream's rows of all of them in one request, then put in step
        order with one gather."""
        first_row, per_stream = self.plan.stream_rows(step)
        lo, count = self.host_rows(step)
        steps = max(1, WINDOW_ROWS // max(1, count))
        boundary = self.plan.spec.batch.next_boundary(step)
        if boundary is not None:
            steps = min(steps, boundary - step)
        parts, order, base = [], [], 0
        for stream in self.streams:
            a, b = max(lo, stream * per_stream), min(lo + count, (stream + 1) * per_stream)
            if a >= b:
                continue
            # Step k's rows of this stream: [first_row + k * per_stream + offset, ... + b - a).
            offset = a - stream * per_stream
            span = (steps - 1) * per_stream + (b - a)
            parts.append(self._planners[stream].rows(first_row + offset, span))
            order.append(base + np.arange(steps)[:, None] * per_stream + np.arange(b - a))
            base += span
        if not parts:
            pieces = Pieces.empty_rows(0)
        elif len(parts) == 1 and steps * count == base:
            pieces = parts[0]  # one stream, its rows already in step order
        else:
            pieces = Pieces.concat(parts).take_rows(np.concatenate(order, axis=1).reshape(-1))
        return _Window(step, step + steps, count, pieces)

    def cursors_at(self, step: int) -> dict[int, Cursor]:
        """Cursors that resume this host's streams at `step`."""
        return dict(self._cursor_span(step).cursors)

    def cursor_table_at(self, step: int) -> np.ndarray:
        """`cursors_at(step)` as int64 rows `[stream, *cursor.to_list()]`."""
        return self._cursor_span(step).table.copy()

    def _cursor_span(self, step: int) -> _CursorSpan:
        """The cursors at `step`, reused for every step until a stream enters a new block."""
        row, _ = self.plan.stream_rows(step)
        span = self._cursors
        if span is None or not span.first <= row < span.end:
            blocks = {s: self._planners[s].block_at(row) for s in self.streams}
            cursors = {s: cursor for s, (cursor, _, _) in blocks.items()}
            table = np.array(
                [[s, *cursor.to_list()] for s, cursor in cursors.items()], dtype=np.int64
            )
            first = max(first for _, first, _ in blocks.values())
            end = min(end for _, _, end in blocks.values())
            span = self._cursors = _CursorSpan(first, end, cursors, table)
        return span
