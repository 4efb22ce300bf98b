"""A data host's batches as a grain `MapDataset` indexed by step.

Element i is the host's batch at training step `start_step + i`, computed from
the plan at that step's data step (they differ only after `data.skip_steps`):
the host's rows' pieces, read and assembled. The iterator reads
`PlannedChunkDataset`, several consecutive steps per element, in its own
process or in workers (`mp_prefetch`): grain deals worker w the chunks w,
w + W, ...; each worker walks the plan forward on its own, so the batches
never depend on the worker count. Each element also carries, beside the batch, the cursor that
resumes the plan at the *next* step and the tokens per source, so the
iterator in the main process knows its position without planning. The batch
is one int32 block of all fields (`row_assembly.FIELDS`).

Small host batches are assembled several steps at a time (`CHUNK_TOKENS`): read
step by step (`PlannedDataIterator.host_batches`), the steps it will be asked
for next (the same stride as its last two requests) are planned, read and
assembled in one call, and handed out one by one; a `PlannedChunkDataset`
element is such a call. Which rows a step holds never depends on this.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from concurrent import futures
from typing import Any, Protocol

import grain
import numpy as np

from xlstm_data.errors import DataReadError
from xlstm_data.plan.global_plan import Cursor, GlobalPlan, HostPlanner
from xlstm_data.plan.pieces import Pieces
from xlstm_data.plan.skips import NO_SKIPS, StepSkips
from xlstm_data.reading.row_assembly import assemble_rows

#: Host tokens (rows x row length) assembled per call. A step of 8 rows of
#: 1024 spent ~0.5 ms CPU in the fixed cost of a batch's ~80 numpy calls and
#: ~0.2 ms in work per row (host pipeline: 11.9 M tokens per CPU second at 8
#: rows a step, 31.7 M at 64, bench/peers corpus); assembling the next steps
#: with it shares that cost. A chunk also pays a fixed cost to cross from a
#: worker (grain's queue and its feeder thread, the slot, the hand-over to the
#: loop): with 1 worker, 64 rows of 1024 a chunk gave the whole iterator 0.75
#: (0.74-0.78) of the in-process host pipeline, 128 rows 0.88 (0.86-0.88) and
#: 256 rows 0.97 (0.97-0.97), the host pipeline itself 111, 120 and 118 M
#: tok/s (bench/peers target6, 3 rounds each). 256 rows of 1024 are 7.3 MB a
#: chunk of int32 fields; longer rows keep the bytes, not the rows.
CHUNK_TOKENS = 1 << 18
#: Most host rows per call: shorter rows keep the rows, not the bytes. A chunk
#: of thousands of short rows would hold hundreds of steps, each restart
#: computing them before its second step.
CHUNK_ROWS_MAX = 256


def chunk_rows(row_length: int) -> int:
    """Host rows assembled per call for rows of `row_length`, at least one."""
    return max(1, min(CHUNK_ROWS_MAX, CHUNK_TOKENS // max(int(row_length), 1)))


def chunk_steps(row_length: int, host_rows: int) -> int:
    """Steps of `host_rows` rows of `row_length` in a whole chunk (`chunk_rows`), at least one."""
    return max(1, chunk_rows(row_length) // max(int(host_rows), 1))


class BlockPlacement(Protocol):
    """Places chunk blocks (`assemble_rows`'s `empty`) and names them for the hand-over."""

    def empty(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray: ...

    def ref(self, block: np.ndarray) -> Any: ...


class PlannedBatchDataset(grain.MapDataset):
    """This host's batches from `start_step` on.

    Args:
      plan: The global plan.
      sources: Document sources in plan order (`source[i]["tokens"]`).
      host_index: This data host.
      host_count: Data hosts.
      eod_token_id: Appended to every document.
      start_step: The first training step (a restored position).
      cursor: The plan's position at or before the data step of `start_step`
        (None: at data step 0).
      num_steps: Training steps of a finite run (None: endless).
      read_threads: Threads reading a batch's documents (0: the calling thread).
      skips: Data steps skipped (`data.skip_steps`).
      blocks: Where `assemble_chunk` puts a chunk's block and what it hands
        over in its place (a worker's reused shared-memory slots,
        `multihost.shared_slots`); None: a new array in this process. Only
        for chunks (`PlannedChunkDataset`): single steps need the block.
    """

    def __init__(
        self,
        plan: GlobalPlan,
        sources: Sequence[Any],
        host_index: int,
        host_count: int,
        eod_token_id: int,
        *,
        start_step: int = 0,
        cursor: Cursor | None = None,
        num_steps: int | None = None,
        read_threads: int = 0,
        skips: StepSkips = NO_SKIPS,
        blocks: BlockPlacement | None = None,
    ):
        super().__init__()
        self._blocks = blocks
        self._plan = plan
        self._sources = list(sources)
        self._host_index = host_index
        self._host_count = host_count
        self._eod = eod_token_id
        self._start_step = start_step
        self._cursor = cursor
        self._num_steps = num_steps
        self._read_threads = read_threads
        self._skips = skips
        self._planner: HostPlanner | None = None
        self._executor: futures.ThreadPoolExecutor | None = None
        #: Elements assembled ahead (`chunk_rows`), by index, and the last index asked for.
        self._ready: dict[int, dict[str, Any]] = {}
        self._last_index: int | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_planner"] = None  # each process plans for itself
        state["_executor"] = None
        state["_ready"] = {}
        state["_last_index"] = None
        return state

    def __len__(self) -> int:
        if self._num_steps is None:
            return sys.maxsize
        return max(0, self._num_steps - self._start_step)

    def _read_documents(self, source: int, documents: np.ndarray) -> list[np.ndarray]:
        """A source's documents of one step, in one `read_many` call where it has one.

        With `read_threads` > 1 the documents are split among the threads, a
        `read_many` each. A source without `read_many` (any grain
        random-access source of `{"tokens": ...}` dicts) is read one document
        at a time.
        """
        reader = self._sources[source]
        read_many = getattr(reader, "read_many", None)
        if read_many is None:

            def read_many(chosen: np.ndarray) -> list[np.ndarray]:
                return [
                    np.asarray(reader[d]["tokens"], dtype=np.int32).reshape(-1)
                    for d in chosen.tolist()
                ]

        if self._executor is None or len(documents) < 2:
            tokens = list(read_many(documents))
        else:
            chunks = np.array_split(documents, min(self._read_threads, len(documents)))
            tokens = [t for part in self._executor.map(read_many, chunks) for t in part]
        self._check_lengths(source, documents, tokens)
        return tokens

    def _check_lengths(self, source: int, documents: np.ndarray, tokens: list[np.ndarray]) -> None:
        """Every document read must be as long as the plan was told, or rows would be wrong.

        A longer one would be cut silently, a shorter one leave a row short:
        both mean the lengths (an edited `lengths.npy`, a stale cache) are
        not those of the documents.
        """
        got = np.fromiter(map(len, tokens), dtype=np.int64, count=len(tokens))
        want = np.asarray(self._plan.lengths[source])[documents]
        wrong = np.flatnonzero(got != want)
        if wrong.size:
            first = int(wrong[0])
            name = self._plan.spec.names[source]
            raise DataReadError(
                f"data.train.{name}: document {int(documents[first])} holds {int(got[first])} "
                f"tokens but the lengths the plan was built on say {int(want[first])} "
                f"({wrong.size} of the {len(documents)} documents of this step disagree): the "
                "lengths (index.json/lengths.npy, or the lengths cache) are not those of the "
                "documents read; rerun `xlstm-data index` on the shards, or delete the cache "
                "entry, and restart"
            )

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return self.slice(index)
        index = int(index)
        stride = 0 if self._last_index is None else index - self._last_index
        self._last_index = index
        element = self._ready.pop(index, None)
        if element is None:
            self._ready = self._assemble(self._chunk(index, stride))
            element = self._ready.pop(index)
        return element

    def _chunk(self, index: int, stride: int) -> list[int]:
        """`index` and the indices likely asked for next, as many as `chunk_rows` allows.

        Only `index` before the stride is known (a forward stride between the
        last two requests): a worker must not assemble its neighbours' steps.
        """
        if stride <= 0:
            return [index]
        rows = self._host_planner().host_rows(self._skips.data_step(self._start_step + index))[1]
        count = chunk_steps(self._plan.spec.row_length, rows)
        return list(range(index, min(index + count * stride, len(self)), stride))

    def _host_planner(self) -> HostPlanner:
        if self._planner is None:
            self._planner = HostPlanner(
                self._plan, self._host_index, self._host_count, self._cursor
            )
        return self._planner

    def _assemble(self, indices: list[int]) -> dict[int, dict[str, Any]]:
        """The elements of `indices` (increasing), assembled in one call."""
        if self._blocks is not None:
            raise ValueError(
                "steps are split from a chunk's block: read blocks placed elsewhere "
                "through PlannedChunkDataset"
            )
        chunk = self.assemble_chunk(indices)
        return dict(zip(indices, split_chunk(chunk), strict=True))

    def assemble_chunk(self, indices: Sequence[int]) -> dict[str, np.ndarray]:
        """The steps `indices` (increasing) as one element: a block of all their rows.

        `"fields"` is `[FIELDS, rows of all the steps, L]`, `"rows"` each
        step's rows, `"row_tokens"` each row's tokens (from the pieces: the
        counts need no pass over the block), and the other entries one per
        step, stacked (`split_chunk` gives the steps back).
        """
        if self._executor is None and self._read_threads > 1:
            self._executor = futures.ThreadPoolExecutor(self._read_threads)
        planner = self._host_planner()
        spec = self._plan.spec
        steps = [self._skips.data_step(self._start_step + i) for i in indices]
        parts: list[Pieces] = []
        cursors: list[list[int]] = []
        for step in steps:  # in order: an earlier step makes the planner start again
            parts.append(planner.pieces_at(step))
            cursors.append(planner.cursor_list_at(step + 1))
        pieces = Pieces.concat(parts)
        block = assemble_rows(
            pieces,
            self._read_documents,
            spec.row_length,
            shift=spec.shift,
            shift_target=spec.shift_target,
            eod_token_id=self._eod,
            empty=None if self._blocks is None else self._blocks.empty,
        )
        # Each step's counts, from its pieces: one bincount over the chunk's.
        sources = len(spec.names)
        step_of_piece = np.repeat(
            np.arange(len(parts)), [len(part.source) for part in parts]
        ).astype(np.int64)
        continued = (pieces.start > 0).astype(np.int64)
        return {
            "fields": block if self._blocks is None else self._blocks.ref(block),
            "rows": np.array([part.rows for part in parts], dtype=np.int64),
            "data_step": np.array(steps, dtype=np.int64),
            "piece_counts": np.bincount(
                2 * step_of_piece + continued, minlength=2 * len(parts)
            ).reshape(len(parts), 2),
            "source_tokens": np.bincount(
                sources * step_of_piece + pieces.source,
                weights=pieces.stop - pieces.start,
                minlength=sources * len(parts),
            )
            .reshape(len(parts), sources)
            .astype(np.int64),
            "cursor": np.array(cursors, dtype=np.int64),
            "row_tokens": pieces.row_tokens(),
        }

    def __str__(self) -> str:
        return (
            f"PlannedBatchDataset(host={self._host_index}/{self._host_count}, "
            f"start_step={self._start_step})"
        )


def split_chunk(chunk: Mapping[str, np.ndarray]) -> list[dict[str, Any]]:
    """The steps of an `assemble_chunk` element, each as `PlannedBatchDataset` gives it.

    A step's `"fields"` is a view of the chunk's block (no copy).
    """
    ends = np.cumsum(chunk["rows"]).tolist()
    block = chunk["fields"]
    return [
        {
            "fields": block[:, end - rows : end],
            "data_step": chunk["data_step"][k],
            "piece_counts": chunk["piece_counts"][k],
            "source_tokens": chunk["source_tokens"][k],
            "cursor": chunk["cursor"][k],
        }
        for k, (rows, end) in enumerate(zip(chunk["rows"].tolist(), ends, strict=True))
    ]


class PlannedChunkDataset(grain.MapDataset):
    """A host's steps, `steps_per_chunk` consecutive ones per element.

    Handing a worker's step to the main process costs a fixed ~1.6 ms of CPU
    on 2 cores (a shared-memory segment made, mapped, copied out and
    unlinked, the resource tracker told twice, four thread hand-offs) plus
    ~3.7 ms per MB (bench/peers, 2 workers, 8 and 64 rows of 1024). A step of
    8 rows paid the fixed part per 0.23 MB. In the main process, a chunk
    goes to the devices in one transfer (`global_arrays.ChunkTransfer`) and
    is counted from its pieces (`data_stats.chunk_counts`). Element j holds steps
    `[j * steps_per_chunk, (j + 1) * steps_per_chunk)` of `steps`, assembled
    in one call as one block (`assemble_chunk`). Which rows a step holds
    never depends on this, nor on the worker count.

    Args:
      steps: The host's steps, one per element.
      steps_per_chunk: Steps per element (>= 1).
      first_chunk_steps: Steps of element 0 (1 to `steps_per_chunk`; None: a
        whole chunk). 1 for the main process: its first step must not wait
        for the chunk's others (the first batch of a cold start took 1.5x
        Megatron's time at 10^5 documents with a whole chunk, bench/peers).
    """

    def __init__(
        self,
        steps: PlannedBatchDataset,
        steps_per_chunk: int,
        first_chunk_steps: int | None = None,
    ):
        super().__init__()
        self._steps = steps
        self._per_chunk = max(1, int(steps_per_chunk))
        first = self._per_chunk if first_chunk_steps is None else int(first_chunk_steps)
        self._first = min(max(1, first), self._per_chunk)

    def first_step(self, index: int) -> int:
        """The first of `steps`' indices that element `index` holds."""
        if index == 0:
            return 0
        return min(self._first + (index - 1) * self._per_chunk, len(self._steps))

    def __len__(self) -> int:
        rest = max(0, len(self._steps) - self._first)
        return min(1, len(self._steps)) + -(-rest // self._per_chunk)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return self.slice(index)
        index = int(index)
        return self._steps.assemble_chunk(range(self.first_step(index), self.first_step(index + 1)))

    def __str__(self) -> str:
        return f"PlannedChunkDataset({self._steps}, steps_per_chunk={self._per_chunk})"
