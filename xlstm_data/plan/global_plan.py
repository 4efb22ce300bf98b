"""The global plan: every step's rows, from a cursor, on any host.

The plan walks steps in order. At each step the mixture (`mixing`) chooses
how many of the next rows of each source's row sequence (`source_rows`) fill
the global batch, in the order the fair queue serves them; row j of the step
is the j-th chosen row. The position after any step is one small `Cursor`
(per source: block start, rows taken of it, units served in the stage), the
same for every host: it is what a checkpoint saves, and a restore on any
number of hosts continues from it with bitwise-identical global batches.

Every host computes the whole step (which source fills each row needs every
source's row sizes) but gathers only its own rows' pieces. Planning is on
lengths alone: a block of 2048 documents packs in under a millisecond, so
even a world of many hosts costs each one a small fraction of a core (see
bench/plan for the measured share). The plan no longer has logical streams:
they let hosts plan a slice each, but made shares exact only per stream and
epochs end at different steps on different streams.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
from absl import logging

from xlstm_data.errors import DataCheckpointError, DataConfigError
from xlstm_data.plan.mixing import merged_sources
from xlstm_data.plan.mixture import MixtureSchedule
from xlstm_data.plan.order import SourceOrder
from xlstm_data.plan.pieces import Pieces, eod_positions
from xlstm_data.plan.source_rows import RowWalker, SourceRows
from xlstm_data.plan.spec import PlanSpec

#: Global rows a `HostPlanner` plans at once (whole steps, one batch size and
#: one mixture stage): per step a host batch is then one slice. Slicing and
#: joining rows every step was 15 % of the pipeline's CPU (cProfile, rows of
#: 1024, host batch 8). Counted globally, so a first batch never waits for
#: many steps of a large world.
WINDOW_ROWS = 1024
#: The first window after a (re)start plans this many rows (at least a step),
#: and each next one twice as many up to `WINDOW_ROWS`: a first batch of 8
#: rows no longer waits for 1,024 rows of packing (8 blocks of 2,048
#: documents of 64 tokens, most of a cold start's first batch).
FIRST_WINDOW_ROWS = 16

#: The per-source fields of a cursor's list form, in order, with their value
#: for a source the cursor does not know (a dataset added on resume).
PER_SOURCE_FIELDS = (("position", 0), ("row", 0), ("served", 0), ("offset", 0))
#: Values before the per-source fields: step, stage start.
HEADER_FIELDS = 2


@dataclasses.dataclass(frozen=True)
class Cursor:
    """The plan's position before data step `step`.

    Attributes:
      step: The next data step.
      stage_start: First step of the mixture stage `served` counts belong to.
      position: Per source, the start of the block its next row is in.
      row: Per source, rows of that block already served.
      served: Per source, units (tokens or documents) served since `stage_start`.
      offset: Per source, example positions of the document at `position` that
        the block before took (`concat` completes its last row with them).
    """

    step: int
    stage_start: int
    position: tuple[int, ...]
    row: tuple[int, ...]
    served: tuple[int, ...]
    offset: tuple[int, ...]

    def to_list(self) -> list[int]:
        return [
            self.step,
            self.stage_start,
            *self.position,
            *self.row,
            *self.served,
            *self.offset,
        ]

    @classmethod
    def from_list(cls, values: Sequence[int]) -> Cursor:
        values = [int(v) for v in values]
        n = (len(values) - HEADER_FIELDS) // len(PER_SOURCE_FIELDS)
        if n < 1 or HEADER_FIELDS + n * len(PER_SOURCE_FIELDS) != len(values):
            raise DataCheckpointError(
                f"a saved data cursor holds {len(values)} values, which is not "
                f"{HEADER_FIELDS} + {len(PER_SOURCE_FIELDS)} per dataset; the data-state file "
                "is corrupted"
            )
        fields = [
            tuple(values[HEADER_FIELDS + f * n : HEADER_FIELDS + (f + 1) * n])
            for f in range(len(PER_SOURCE_FIELDS))
        ]
        return cls(values[0], values[1], *fields)


class GlobalPlan:
    """The plan of one run: a pure function of the spec and the document lengths.

    Args:
      spec: The validated spec.
      lengths: Per source (in `spec.names` order), every document's token count.
    """

    def __init__(self, spec: PlanSpec, lengths: Sequence[np.ndarray]):
        if len(lengths) != len(spec.names):
            raise ValueError(f"{len(lengths)} length arrays for {len(spec.names)} sources")
        lengths = [x if isinstance(x, np.ndarray) else np.asarray(x) for x in lengths]
        # The one pass over each source's lengths at start (70 ms at 10^8 documents).
        tokens = tuple(int(np.sum(array, dtype=np.int64)) for array in lengths)
        for name, array, total in zip(spec.names, lengths, tokens, strict=True):
            if len(array) == 0:
                raise DataConfigError(f"data.train.{name} has no documents")
            if _mean_positions(spec, total, len(array)) <= 0:
                raise DataConfigError(f"data.train.{name} has only empty documents")
        orders = [
            SourceOrder(len(array), spec.seed, name, spec.shuffle)
            for name, array in zip(spec.names, lengths, strict=True)
        ]
        self._build(spec, lengths, tokens, orders)

    def _build(self, spec, lengths, document_tokens, orders, block_caches=None) -> None:
        """Sets the plan's parts from checked inputs (no pass over the lengths).

        `block_caches`: per source, the planned blocks of a plan that differs
        from this one only in its mixture stages (new caches if None).
        """
        self.spec = spec
        self.lengths = lengths
        #: Per source, the tokens of all its documents (no EOD).
        self.document_tokens = document_tokens
        self.mean_tokens = np.asarray(
            [
                _mean_positions(spec, total, len(array))
                for total, array in zip(document_tokens, lengths, strict=True)
            ]
        )
        self.orders = orders
        blocks = [None] * len(orders) if block_caches is None else block_caches
        self.sources = [
            SourceRows(spec, i, lengths[i], orders[i], blocks[i]) for i in range(len(spec.names))
        ]
        self._total_rows: int | None = None

    def with_mixture(self, mixture: MixtureSchedule) -> GlobalPlan:
        """The same plan with other mixture stages (rows before they differ are equal)."""
        plan = GlobalPlan.__new__(GlobalPlan)
        spec = dataclasses.replace(self.spec, mixture=mixture)
        caches = [rows.blocks for rows in self.sources]
        plan._build(spec, self.lengths, self.document_tokens, self.orders, caches)
        return plan

    def __getstate__(self) -> dict[str, Any]:
        """Worker processes get memory-mapped lengths as their file, not a copy."""
        return {
            "spec": self.spec,
            "lengths": [_MappedLengths.wrap(array) for array in self.lengths],
            "document_tokens": self.document_tokens,
            "orders": [order.without_cache() for order in self.orders],
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        lengths = [
            array.open() if isinstance(array, _MappedLengths) else array
            for array in state["lengths"]
        ]
        self._build(state["spec"], lengths, state["document_tokens"], state["orders"])

    def token_shares(self, stage: int) -> np.ndarray:
        """Each source's planned share of the tokens in a mixture stage."""
        weights = np.asarray(self.spec.mixture.weights[stage], dtype=np.float64)
        if self.spec.mixture_unit == "documents":
            weights = weights * self.mean_tokens
        return weights / weights.sum()

    def start_cursor(self) -> Cursor:
        n = len(self.spec.names)
        return Cursor(0, 0, (0,) * n, (0,) * n, (0,) * n, (0,) * n)

    def stage_start_at(self, step: int) -> int:
        mixture = self.spec.mixture
        return mixture.starts[mixture.stage_at(step)]

    # Finite runs ------------------------------------------------------------

    def total_rows(self) -> int:
        """Rows of a finite run (plans every block once)."""
        if self.spec.num_epochs is None:
            raise ValueError("an endless run has no total")
        if self._total_rows is None:
            total = 0
            for rows in self.sources:
                start, offset = 0, 0
                while not rows.ended(start):
                    block = rows.block(start, offset)
                    total += block.pieces.rows
                    start, offset = block.end, block.end_offset
            self._total_rows = total
        return self._total_rows

    def num_steps(self) -> int | None:
        """Global steps of a finite run (exact, packing included); None if endless."""
        if self.spec.num_epochs is None:
            return None
        total = self.total_rows()
        batch = self.spec.batch
        if self.spec.drop_remainder:
            return batch.step_for_examples(total + 1) - 1
        return batch.step_for_examples(total)


@dataclasses.dataclass(frozen=True)
class _Window:
    """Steps `[first, first + steps)` of the global plan (one batch size, one stage).

    Attributes:
      source: int32[steps, batch], the source of each row (-1: past a finite end).
      rank: int64[steps, batch], its row in that source's walker.
      taken: int64[steps + 1, sources], walker rows taken before each step.
      served: int64[steps + 1, sources], units served in the stage before each step.
    """

    first: int
    steps: int
    stage_start: int
    source: np.ndarray
    rank: np.ndarray
    taken: np.ndarray
    served: np.ndarray


class StepWalker:
    """Walks the global plan step by step from a cursor (forward only)."""

    def __init__(self, plan: GlobalPlan, cursor: Cursor):
        self.plan = plan
        self.walkers = [
            RowWalker(rows, cursor.position[i], cursor.offset[i], cursor.row[i])
            for i, rows in enumerate(plan.sources)
        ]
        self.start = cursor
        #: Before the next window: its step, the stage of `served`, units served, rows taken.
        self.next_step = cursor.step
        self._stage_start = cursor.stage_start
        self._served = np.asarray(cursor.served, dtype=np.int64)
        self._taken = np.zeros(len(plan.sources), dtype=np.int64)

    def window(self, max_rows: int) -> _Window:
        """Plans the next steps, up to `max_rows` global rows (at least one step)."""
        plan = self.plan
        spec = plan.spec
        step = self.next_step
        batch = spec.batch.global_batch_size_at(step)
        steps = max(1, max_rows // batch)
        for boundary in (spec.batch.next_boundary(step), _next_start(spec.mixture, step)):
            if boundary is not None:
                steps = min(steps, boundary - step)
        stage_start = plan.stage_start_at(step)
        served = self._served if stage_start == self._stage_start else 0 * self._served
        weights = spec.mixture.weights[spec.mixture.stage_at(step)]
        for walker, taken in zip(self.walkers, self._taken.tolist(), strict=True):
            walker.release(taken)
        base = self._taken

        def units_of(source: int, count: int) -> np.ndarray:
            return self.walkers[source].units(int(base[source]), count)

        source = merged_sources(weights, served.tolist(), units_of, steps * batch)
        source = source.reshape(steps, batch)
        n = len(self.walkers)
        rank = np.zeros(source.shape, dtype=np.int64)
        counts = np.zeros((steps, n), dtype=np.int64)
        units_served = np.zeros((steps, n), dtype=np.int64)
        flat = source.reshape(-1)
        for i in range(n):
            mine = flat == i
            k = int(mine.sum())
            if not k:
                continue
            rank.reshape(-1)[mine] = base[i] + np.arange(k)
            counts[:, i] = mine.reshape(steps, batch).sum(axis=1)
            units = units_of(i, k)
            ends = np.cumsum(counts[:, i])
            sums = np.concatenate([[0], np.cumsum(units)])
            units_served[:, i] = sums[ends] - sums[ends - counts[:, i]]
        taken = base + np.concatenate([np.zeros((1, n), np.int64), np.cumsum(counts, axis=0)])
        served_at = served + np.concatenate(
            [np.zeros((1, n), np.int64), np.cumsum(units_served, axis=0)]
        )
        window = _Window(step, steps, stage_start, source, rank, taken, served_at)
        self.next_step, self._stage_start = step + steps, stage_start
        self._served, self._taken = served_at[-1], taken[-1]
        return window

    def cursor_table(self, window: _Window) -> list[list[int]]:
        """`Cursor.to_list()` before each step of `window` and the one after it, in one pass.

        Every step's cursor is read (a chunk carries one per step), so they
        are made for the whole window with numpy: 9.5 us per step one at a
        time, a third of the planner's CPU outside packing (bench/plan's corpus).
        """
        n = len(self.walkers)
        table = np.empty((window.steps + 1, HEADER_FIELDS + len(PER_SOURCE_FIELDS) * n), np.int64)
        table[:, 0] = window.first + np.arange(window.steps + 1)
        table[:, 1] = window.stage_start
        for i, walker in enumerate(self.walkers):
            start, offset, row = walker.positions(window.taken[:, i])
            column = HEADER_FIELDS + i
            table[:, column] = start
            table[:, column + n] = row
            table[:, column + 2 * n] = window.served[:, i]
            table[:, column + 3 * n] = offset
        return table.tolist()

    def host_pieces(self, window: _Window, lo: int, count: int) -> Pieces:
        """Rows `[lo, lo + count)` of every step of the window, step after step."""
        source = window.source[:, lo : lo + count].reshape(-1)
        rank = window.rank[:, lo : lo + count].reshape(-1)
        parts, order = [], np.empty(len(source), dtype=np.int64)
        base = 0
        for i in [*range(len(self.walkers)), -1]:
            mine = np.flatnonzero(source == i)
            if not len(mine):
                continue
            if i < 0:
                parts.append(Pieces.empty_rows(len(mine)))
            else:
                parts.append(self.walkers[i].pieces(rank[mine]))
            order[mine] = base + np.arange(len(mine))
            base += len(mine)
        joined = Pieces.concat(parts)
        if len(parts) == 1:
            return joined
        return joined.take_rows(order)


def _next_start(mixture: MixtureSchedule, step: int) -> int | None:
    stage = mixture.stage_at(step)
    return mixture.starts[stage + 1] if stage + 1 < len(mixture.starts) else None


@dataclasses.dataclass(frozen=True)
class _HostWindow:
    window: _Window
    rows_per_step: int
    pieces: Pieces


class HostPlanner:
    """A data host's rows of each step, walking the plan forward from a cursor.

    Steps are meant to be asked for in increasing order. A step before the
    current window (a grain dataset of these steps iterated a second time,
    which starts again at its first index) walks again from the starting
    cursor: the plan is a pure function of the step, so the rows are the
    same, at the cost of planning the steps in between once more. A step
    before the starting cursor is refused: the steps before a restored
    cursor may have been planned under another mixture or layout.

    Args:
      plan: The global plan.
      host_index: This data host.
      host_count: Data hosts; must divide every stage's global batch.
      cursor: The position to start at (a restored one), or None for step 0.
    """

    def __init__(
        self, plan: GlobalPlan, host_index: int, host_count: int, cursor: Cursor | None = None
    ):
        self.plan = plan
        self.host_index = host_index
        self.host_count = host_count
        self._start = cursor or plan.start_cursor()
        self._rewind()

    def _rewind(self) -> None:
        """Back to the starting cursor, nothing planned."""
        self._walker = StepWalker(self.plan, self._start)
        self._current: _HostWindow | None = None
        #: The cursors of one window (`StepWalker.cursor_table`), made at its first cursor.
        self._cursors: tuple[_HostWindow, list[list[int]]] | None = None
        self._window_rows = max(1, FIRST_WINDOW_ROWS // 2)  # rows of the last window planned

    def host_rows(self, step: int) -> tuple[int, int]:
        """`(first global row, rows)` of this host at `step`."""
        per_host = self.plan.spec.batch.global_batch_size_at(step) // self.host_count
        return self.host_index * per_host, per_host

    def _window_of(self, step: int, end_inclusive: bool = False) -> _HostWindow:
        """The window holding `step` (or ending right before it, with `end_inclusive`)."""
        current = self._current
        while True:
            first = self._walker.next_step if current is None else current.window.first
            if step < first:
                if step < self._start.step:
                    raise DataCheckpointError(
                        f"the plan was asked for data step {step}, before the cursor it "
                        f"started from (step {self._start.step}); ask for steps from "
                        f"{self._start.step} on, or plan from an earlier cursor"
                    )
                logging.info(
                    "data step %d is behind step %d: planning again from step %d",
                    step,
                    first,
                    self._start.step,
                )
                self._rewind()
                current = None
                continue
            if current is not None:
                end = first + current.window.steps
                if step < end or (end_inclusive and step == end):
                    return current
            lo, count = self.host_rows(self._walker.next_step)
            self._window_rows = min(2 * self._window_rows, WINDOW_ROWS)
            window = self._walker.window(self._window_rows)
            pieces = self._walker.host_pieces(window, lo, count)
            current = self._current = _HostWindow(window, count, pieces)

    def pieces_at(self, step: int) -> Pieces:
        """This host's rows of the global batch at `step`, in row order."""
        current = self._window_of(step)
        first = (step - current.window.first) * current.rows_per_step
        return current.pieces.row_slice(first, first + current.rows_per_step)

    def cursor_at(self, step: int) -> Cursor:
        """The cursor that resumes the plan at `step` (the same on every host)."""
        if step == self._start.step:
            return self._start
        return Cursor.from_list(self.cursor_list_at(step))

    def cursor_list_at(self, step: int) -> list[int]:
        """`cursor_at(step).to_list()`, without making the `Cursor` (a chunk's per step)."""
        if step == self._start.step:
            return self._start.to_list()
        current = self._window_of(step, end_inclusive=True)
        if self._cursors is None or self._cursors[0] is not current:
            self._cursors = (current, self._walker.cursor_table(current.window))
        return list(self._cursors[1][step - current.window.first])


def _mean_positions(spec: PlanSpec, tokens: int, documents: int) -> float:
    """Input positions a document of a source fills on average (`example_tokens`).

    A float: the document-weighted shares reported (`token_shares`) divide by
    it. It was cut to a whole number, which skewed the shares of short
    documents and called a source of mean length below 1 empty.
    """
    return tokens / documents + eod_positions(spec.shift, spec.shift_target)


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
