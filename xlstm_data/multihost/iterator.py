"""The iterator a training loop pulls: the plan's global batches, sharded and prefetched.

Every entry point (`iterators_from_config`, the reference factories) builds
this one class. Each process computes its data-loading host's rows of every
step from the plan (`reading.PlannedBatchDataset`), in this process or in
grain worker processes, in a background thread, and turns them into global
`jax.Array`s on the mesh: ahead in that thread while the loop is slower than
its data (so device transfers overlap the training step), in `next()` while
the loop waits for data (`StepArrays`). It hands them out in order. Its
position (`plan_state`) is a step and one cursor of the plan, the same on
every process, so it resumes on any layout.

An iterator owns a prefetch thread and its host pipeline
(`resources.IteratorResources`). `close()` releases them; so does dropping
the iterator (a finalizer) and interpreter exit.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import numbers
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import clu.data
import grain
import jax
import numpy as np
from absl import logging
from etils import epath
from jax.experimental import multihost_utils
from jax.sharding import Mesh

from xlstm_data.errors import DataCheckpointError, DataConfigError
from xlstm_data.multihost.data_stats import BatchCounts, DataCounters, chunk_counts
from xlstm_data.multihost.global_arrays import ChunkTransfer, StepArrays
from xlstm_data.multihost.host_layout import data_host_layout
from xlstm_data.multihost.plan_state import (
    PLAN_STATE_KIND,
    PLAN_STATE_VERSION,
    check_state_format,
    cursor_by_name,
    saved_data_step,
)
from xlstm_data.multihost.prefetch import BackgroundPrefetcher
from xlstm_data.multihost.resources import IteratorClosedError, IteratorResources
from xlstm_data.multihost.shared_slots import RELEASE, SHM_DIR, SlotRing, slots_that_fit
from xlstm_data.multihost.worker_handover import WorkerHandover
from xlstm_data.multihost.workers import prefetch_in_workers
from xlstm_data.plan.global_plan import Cursor, GlobalPlan
from xlstm_data.plan.mixture import (
    MixtureUpdate,
    parse_mixture_weights,
    updates_from_pairs,
    updates_to_pairs,
    with_updates,
)
from xlstm_data.plan.schedule import BatchSizeSchedule
from xlstm_data.plan.skips import NO_SKIPS, StepSkips
from xlstm_data.reading.planned_batches import (
    BlockPlacement,
    PlannedBatchDataset,
    PlannedChunkDataset,
    chunk_steps,
)
from xlstm_data.reading.row_assembly import FIELDS
from xlstm_data.sources.identity import dataset_files, dataset_identities
from xlstm_data.sources.lengths_cache import tokenizer_identity

#: Shared memory a worker's slots may take (`_slot_ring`): 8 chunks of 256
#: host rows of 8,192 tokens (7 int32 fields, 59 MB each) nearly fill it.
SLOT_BYTES_PER_WORKER = 512 << 20


@dataclasses.dataclass(frozen=True)
class EpochLength:
    """Global steps of a finite run (the plan's count, always exact)."""

    steps: int
    exact: bool = True


@dataclasses.dataclass
class _Prefetched:
    """One step as the prefetch thread hands it over."""

    arrays: StepArrays
    position: dict[str, Any]
    counts: BatchCounts


class PlannedDataIterator(clu.data.DatasetIterator):
    """Global batches of the plan, sharded over the mesh's data axes.

    Args:
      plan: The global plan (the same on every process).
      sources: Document sources in plan order.
      mesh: The global mesh.
      eod_token_id: Appended to every document.
      worker_count: Worker processes computing whole steps (speed only).
      worker_buffer_size: Chunks each worker prepares ahead, each
        `chunk_rows` rows of consecutive steps, at least one step (the
        config's default, 4: see `data_config`'s defaults for the measurement).
      prefetch: Global batches prepared ahead in a background thread. The
        thread prepares a chunk's steps at a time (`_produce`), so up to
        one chunk more may be ready.
      read_threads: Threads reading a batch's documents.
      reset_after_epoch: Restart at step 0 after the last step (eval).
      batch_class: Turns the field dict into a batch: a class with
        `from_dict` (like `LLMBatch`), any other callable taking the fields
        as keyword arguments, or None for the dict itself.
      batch_axis_names: Mesh axes the batch rows are split over.
      data_config: What the data was built from, fingerprinted in
        checkpoints: the validated data config, or the factories'
        `FactorySettings`.
      sources_by_name: Sources by name (for `source_documents` and tools).
      skips: Data steps never trained on (`data.skip_steps`); the plan, its
        mixture and ramp-up stages, are indexed by data step.
    """

    def __init__(
        self,
        plan: GlobalPlan,
        sources: Sequence[Any],
        mesh: Mesh,
        *,
        eod_token_id: int,
        worker_count: int = 0,
        worker_buffer_size: int = 4,
        prefetch: int = 2,
        read_threads: int = 0,
        reset_after_epoch: bool = False,
        batch_class: Callable[..., Any] | None = None,
        batch_axis_names: str | Sequence[str] | None = None,
        data_config: Any = None,
        sources_by_name: Mapping[str, Any] | None = None,
        skips: StepSkips = NO_SKIPS,
    ):
        if prefetch < 1:
            raise DataConfigError(f"prefetch={prefetch} must be >= 1")
        self.plan = plan
        self.skips = skips
        self.global_mesh = mesh
        self.layout = data_host_layout(mesh, batch_axis_names)
        self.sharding = self.layout.sharding(mesh)
        self.prefetch = prefetch
        self.reset_after_epoch = reset_after_epoch
        self.batch_class = batch_class
        self.worker_count = worker_count
        #: What the data was built from (fingerprinted in checkpoints).
        self.data_config: Any = data_config
        #: The document sources of the datasets, by name (for `source_documents`,
        #: and for tools like `inspect` that would otherwise open them again).
        self.sources: Mapping[str, Any] = dict(sources_by_name or {})
        self._plan_sources = list(sources)
        self._eod_token_id = eod_token_id
        self._worker_buffer_size = worker_buffer_size
        self._read_threads = read_threads
        #: The config's mixture stages; online updates are laid over them.
        self._configured_mixture = plan.spec.mixture
        self._mixture_updates: list[MixtureUpdate] = []
        self._identities: dict[str, dict[str, Any]] | None = None
        self._files: dict[str, dict[str, list[int]]] | None = None
        data_steps = plan.num_steps()
        #: Training steps of a finite run (per pass with `reset_after_epoch`), or None.
        self.iterator_length = None if data_steps is None else skips.train_steps_before(data_steps)
        self.epoch_length = (
            None if self.iterator_length is None else EpochLength(self.iterator_length)
        )
        self.dataset_size = sum(len(x) for x in plan.lengths)
        spec = plan.spec
        #: Global and per-host batch size by data step, checked against this mesh.
        self.batch_schedule = BatchSizeSchedule(
            spec.batch.global_batch_size,
            spec.batch.rampup,
            data_parallel_size=self.layout.data_parallel_size,
            host_count=self.layout.host_count,
        )
        self.component_names = tuple(spec.names)
        #: What was handed out so far (tokens, padding, per dataset, wait time);
        #: saved with the position, so the totals continue across a resume.
        self.data_counters = DataCounters(self.component_names)
        self._resources = IteratorResources()
        #: Steps per chunk of the host pipeline, decided once: the transfer picks whole chunks.
        self._per_chunk = self._steps_per_chunk()
        self._transfer = ChunkTransfer(
            FIELDS, self.sharding, self.layout.host_count, self._per_chunk
        )
        # Dropped without close(): released in a thread of its own, since the
        # collector may run this in a thread holding what the prefetch thread
        # waits for. At exit, `resources` releases what is left, waiting.
        self._finalizer = weakref.finalize(self, self._resources.release_in_background)
        self._finalizer.atexit = False
        self._closed = False
        self._element_spec: Any = None
        self.state_set = False
        self._restart(None)

    # Host pipeline -------------------------------------------------------------

    def host_batches(self, step: int = 0, cursor: Cursor | None = None) -> grain.IterDataset:
        """This data host's steps from `step`, in order, in this process (for benchmarks).

        Elements are as `PlannedBatchDataset` gives them (`fields_of(e["fields"])`
        are the batch's fields). Read in order by one thread: the host planner
        walks the plan forward, and each new `iter()` of the dataset starts at
        `step` again, planning again from there.
        """
        return self._planned(step, cursor).to_iter_dataset(grain.ReadOptions(num_threads=0))

    def _planned(
        self, step: int, cursor: Cursor | None, blocks: BlockPlacement | None = None
    ) -> PlannedBatchDataset:
        return PlannedBatchDataset(
            self.plan,
            self._plan_sources,
            self.layout.host_index,
            self.layout.host_count,
            self._eod_token_id,
            start_step=step,
            cursor=cursor,
            num_steps=self.iterator_length,
            read_threads=self._read_threads,
            skips=self.skips,
            blocks=blocks,
        )

    def _pipeline(self, step: int, cursor: Cursor | None) -> WorkerHandover:
        """This host's chunks of steps from training step `step` (a cursor at or before it).

        Every element holds `_per_chunk` consecutive steps (the first
        one step, fewer at a finite plan's end), computed in this process or in
        workers. With workers, the steps are computed here until the workers'
        first chunk is there (`WorkerHandover`): at least the first step and
        the chunks of the next `2 * worker_count * worker_buffer_size` steps,
        after which the workers begin. Twice what the workers keep ready: with
        half as many, the loop still waited 0.27 s per restart (2 workers,
        0.1 s steps, bench/plan_mixture).
        """
        read = grain.ReadOptions(num_threads=0)
        per_chunk = self._per_chunk
        # The first step alone: a (re)start hands it out without waiting for its chunk.
        chunks = PlannedChunkDataset(self._planned(step, cursor), per_chunk, first_chunk_steps=1)
        handover = 1 + -(-2 * self.worker_count * self._worker_buffer_size // per_chunk)
        if self.worker_count == 0 or handover >= len(chunks):
            return WorkerHandover(iter(chunks.to_iter_dataset(read)))
        options = grain.MultiprocessingOptions(
            num_workers=self.worker_count, per_worker_buffer_size=self._worker_buffer_size
        )
        # Each worker walks the plan from the cursor to its own chunks of steps.
        later_step = step + chunks.first_step(handover)
        ring = self._slot_ring(per_chunk)
        try:
            blocks = None if ring is None else ring.writer
            later = PlannedChunkDataset(self._planned(later_step, cursor, blocks), per_chunk)
            workers = prefetch_in_workers(later.to_iter_dataset(read), options)
            if ring is not None:
                workers = workers.map(ring.lease)  # released by `_steps_of`'s transfer
            in_process = iter(chunks.to_iter_dataset(read))
        except BaseException:  # refused (a script without the main guard): nothing is left
            if ring is not None:
                ring.close()
            raise
        return WorkerHandover(in_process, workers, slots=ring, workers_from=handover)

    def _slot_ring(self, per_chunk: int) -> SlotRing | None:
        """Shared-memory slots for the workers' chunks, as many per worker as can be in flight.

        A worker's chunks in flight: the one it assembles, its queue
        (`worker_buffer_size`), the one grain's reader thread here holds, that
        thread's buffer (`worker_buffer_size` again), and the two lent to the
        prefetch thread and the loop until their steps are picked
        (`SlotRing.lease`). At most `SLOT_BYTES_PER_WORKER` per worker (but
        never fewer than 2 slots), and at most half of the free shared memory
        (`slots_that_fit`): with fewer slots than that a worker waits for the
        oldest to be read. None where not even 2 fit (a small `/dev/shm`):
        grain then sends each chunk through a new segment, as it sends any
        array, 2-3 ms a chunk slower.
        """
        block_bytes = self._chunk_bytes(per_chunk)
        in_flight = 2 * self._worker_buffer_size + 4
        wanted = max(2, min(in_flight, SLOT_BYTES_PER_WORKER // block_bytes))
        slots = slots_that_fit(self.worker_count, wanted, block_bytes)
        if not slots:
            logging.warning(
                "shared memory (%s) holds too little for 2 chunks of %d bytes per worker; "
                "workers send each chunk through a new segment instead (slower)",
                SHM_DIR,
                block_bytes,
            )
            return None
        return SlotRing(self.worker_count, slots, block_bytes)

    def _steps_per_chunk(self) -> int:
        """Steps per chunk of the host pipeline: `chunk_steps` of the largest host batch.

        With workers, halved until 2 slots a worker fit in half of the free
        shared memory (`slots_that_fit`; a default Docker container has 64
        MB): smaller chunks through the slots cost less than grain's new
        segment per chunk. Where none fits, whole chunks go through grain.
        """
        whole = chunk_steps(self.plan.spec.row_length, self._largest_host_rows())
        if not self.worker_count:
            return whole
        steps = whole
        while steps and not slots_that_fit(self.worker_count, 2, self._chunk_bytes(steps)):
            steps //= 2
        return steps or whole

    def _largest_host_rows(self) -> int:
        return max(1, self.plan.spec.batch.global_batch_size // self.layout.host_count)

    def _chunk_bytes(self, steps: int) -> int:
        """Bytes of a chunk block of `steps` steps of the largest host batch (int32 fields)."""
        return len(FIELDS) * steps * self._largest_host_rows() * self.plan.spec.row_length * 4

    def _restart(self, state: Mapping[str, Any] | None) -> None:
        """Continues at `state` ({step, data_step, cursor}) or at the start."""
        self._check_open()
        step = 0 if state is None else int(state["step"])
        cursor = None if state is None else Cursor.from_list(state["cursor"])
        self._resources.replace_pipeline(self._pipeline(step, cursor))
        #: Steps taken from the prefetch thread, not yet handed out (it is stopped).
        self._ready: collections.deque[_Prefetched] = collections.deque()
        self.step_counter = step
        self._moved = False  # whether a batch was handed out since this (re)start
        self._last_position: dict[str, Any] | None = None
        if state is not None:
            self._last_position = {
                "data_step": saved_data_step(state),
                "cursor": cursor.to_list(),
            }

    def _position(self) -> dict[str, Any]:
        """Where the next batch comes from: training step, data step and cursor."""
        last = self._last_position
        if last is None:  # nothing handed out since step 0
            last = {"data_step": 0, "cursor": self.plan.start_cursor().to_list()}
        return {"step": self.step_counter, **last}

    def _produce(self) -> list[_Prefetched]:
        """The next chunk's steps, to be made into global arrays (runs in the prefetch thread).

        A chunk's steps cross to the consumer in one hand-over, not one
        each: with one worker, the hand-over per step (`Condition.notify`
        waking the other thread) was the largest item of the main process's
        GIL time (10-15 %, py-spy --gil), and the whole iterator went from
        0.68 to 0.89 of the host pipeline's chunk rate (bench/peers corpus,
        8 x 1024 rows, 8 steps per chunk, 8 alternating rounds). The
        prefetch depth still counts steps (`size=len`).
        """
        pipeline = self._resources.pipeline
        assert pipeline is not None
        return self._steps_of(next(pipeline))

    def _steps_of(self, chunk: Mapping[str, np.ndarray]) -> list[_Prefetched]:
        """A chunk's steps, ready to be made on the devices, with their positions and counts."""
        release = chunk.get(RELEASE)  # a worker's slot, lent until its steps are picked
        try:
            counts = chunk_counts(chunk)
            cursors = chunk["cursor"].tolist()
            data_steps = chunk["data_step"].tolist()
            rows = chunk["rows"].tolist()
        except BaseException:
            if release is not None:
                release()
            raise
        step_arrays = self._transfer.steps(chunk["fields"], rows, release=release)
        return [
            _Prefetched(arrays, {"data_step": data_steps[k] + 1, "cursor": cursors[k]}, counts[k])
            for k, arrays in enumerate(step_arrays)
        ]

    # Lifecycle -----------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise IteratorClosedError(
                "this data iterator was closed (close() stopped its prefetch thread and "
                "workers); build a new iterator to read more data"
            )

    def start_prefetch(self) -> None:
        """Starts preparing the next batches in the background, if not yet started.

        Called by the first `next`; call it earlier (after any `set_state`) to
        overlap the first batches with model set-up and compilation. It is not
        started at construction, so a restore right after it wastes no work.
        """
        self._check_open()
        if self._resources.prefetcher is None:
            self._resources.prefetcher = BackgroundPrefetcher(
                self._produce,
                self.prefetch,
                size=len,
                finish=_make_ahead,
                finish_after=MAKE_AHEAD_AFTER_SECS,
            )

    def _prefetcher(self) -> BackgroundPrefetcher[list[_Prefetched]]:
        self.start_prefetch()
        assert self._resources.prefetcher is not None
        return self._resources.prefetcher

    def close(self) -> None:
        """Stops the prefetch thread and the host pipeline (and its workers).

        The iterator is done afterwards: `next()`, `reset()` and `set_state()`
        raise `IteratorClosedError`; `get_state()` still reports the position.
        Closing twice is harmless.
        """
        self._closed = True
        self._finalizer.detach()
        self._resources.release()

    def reset(self) -> None:
        """Restarts at step 0 (online mixture updates stay in force)."""
        self._restart(None)

    # Consuming -----------------------------------------------------------------

    def __iter__(self) -> PlannedDataIterator:
        """Returns the iterator itself; with `reset_after_epoch`, at the start of a pass.

        An eval iterator (`reset_after_epoch=True`) that handed out batches
        since its last (re)start is reset, so every `for` loop over it is one
        full pass, also after a loop that stopped early (`break`, `islice`).
        Right after `set_state`, a loop continues from the restored position.
        """
        if self.reset_after_epoch and self._moved:
            self.reset()
        return self

    def __next__(self) -> Any:
        self._check_open()
        started = time.perf_counter()
        if self.iterator_length is not None and self.step_counter >= self.iterator_length:
            self._end_of_epoch()
        if not self._ready:
            try:
                self._take_chunk()
            except StopIteration:
                self._end_of_epoch()
        item = self._ready[0]
        if item.arrays.made:
            arrays = item.arrays.get()
        else:  # its making failed before (and may raise again): the step stays next
            with jax.transfer_guard("allow"):  # see _take_chunk
                arrays = item.arrays.get()
        self._ready.popleft()
        self._moved = True
        self._last_position = item.position
        self.step_counter += 1
        if self._element_spec is None:
            self._element_spec = _spec_of(arrays)
        self.data_counters.add(item.counts, time.perf_counter() - started)
        return self._wrap(arrays)

    def _take_chunk(self) -> None:
        """The prefetch thread's next chunk of steps, with their device arrays made.

        Whatever the prefetch thread has not made yet (`StepArrays`) is made
        here, all of the chunk's steps in a row: on one CPU device
        (bench/peers corpus, 8 x 1024 rows, 0 workers, the host pipeline
        and the whole iterator alternating in windows of 1,500 steps in one
        process, 3 processes each) the iterator read 0.61-0.69 of the host
        pipeline this way, against 0.53-0.56 with every step's arrays made
        in the prefetch thread and 0.53-0.61 with each made at its own
        `next()`; with 1 worker 0.80-0.90 against 0.68-0.84
        (`bench/README.md`, "Step arrays made by the loop"). The steps are
        kept before any is made, so an interrupt loses none; a failure is
        raised at its own step (`StepArrays.get`). Transfers are allowed
        here: on one CPU process a pick reads the host chunk, which a loop
        under `jax.transfer_guard("disallow")` would otherwise refuse.
        """
        steps = self._prefetcher().get()
        self._ready.extend(steps)
        if all(step.arrays.made for step in steps):
            return  # made ahead by the prefetch thread (a loop slower than its data)
        with jax.transfer_guard("allow"):
            for step in steps:
                step.arrays.make_ahead()

    def get_next(self) -> Any:
        """The next batch (CLU's `DatasetIterator` surface)."""
        return next(self)

    def _end_of_epoch(self) -> None:
        if self.reset_after_epoch:
            self.reset()
        raise StopIteration

    def _wrap(self, arrays: dict[str, Any]) -> Any:
        if self.batch_class is None:
            return arrays
        from_dict = getattr(self.batch_class, "from_dict", None)
        if callable(from_dict):
            return from_dict(dict(arrays))
        return self.batch_class(**arrays)

    @property
    def element_spec(self) -> Any:
        """Global shape and dtype of each field (peeks at the first batch)."""
        if self._element_spec is None:
            self._check_open()
            steps = self._ready or self._prefetcher().peek()
            if not steps:
                raise ValueError("the plan has no batch, so the iterator has no element_spec")
            with jax.transfer_guard("allow"):  # see _take_chunk
                self._element_spec = _spec_of(steps[0].arrays.get(keep_error=True))
        return self._wrap(self._element_spec)

    # The datasets ----------------------------------------------------------------

    @property
    def source_names(self) -> tuple[str, ...]:
        """The datasets in plan order: a batch's `source_ids` index this tuple."""
        return tuple(self.plan.spec.names)

    @property
    def source_documents(self) -> dict[str, int] | None:
        """Documents found per dataset (fingerprinted in checkpoints)."""
        return {name: len(source) for name, source in self.sources.items()} or None

    @property
    def source_identities(self) -> dict[str, dict[str, Any]]:
        """Per dataset, its files' digest, lengths checksum and tokenizer (checkpointed)."""
        if self._identities is None:
            plan = self.plan
            self._identities = dataset_identities(self.sources, plan.spec.names, plan.lengths)
        return self._identities

    @property
    def source_files(self) -> dict[str, dict[str, list[int]]]:
        """Per dataset with files, `{path: [bytes, mtime_ns]}` (process 0 records it)."""
        if self._files is None:
            self._files = dataset_files(self.sources)
        return self._files

    @property
    def eod_token_id(self) -> int:
        """The end-of-document id appended to every document."""
        return self._eod_token_id

    @property
    def vocab_size(self) -> int | None:
        """The largest vocabulary among the datasets' sources (None if none declares one)."""
        sizes = [getattr(s, "vocab_size", None) for s in self._plan_sources]
        known = [int(v) for v in sizes if v is not None]
        return max(known) if known else None

    @property
    def tokenizer(self) -> Any:
        """The tokenizer every dataset's ids come from, or None when they differ or have none.

        Two sources share a tokenizer when they encode alike (`tokenizer_identity`:
        the byte tokenizer, or the same HuggingFace file).
        """
        tokenizers = [getattr(s, "tokenizer", None) for s in self._plan_sources]
        if not tokenizers or any(t is None for t in tokenizers):
            return None
        identities = [tokenizer_identity(t) for t in tokenizers]
        if identities[0] is None or any(i != identities[0] for i in identities):
            return None
        return tokenizers[0]

    # Online mixing -------------------------------------------------------------

    def set_mixture(self, weights: Mapping[str, float], from_step: int) -> None:
        """Mixes the datasets with `weights` from data step `from_step` on.

        Every process must call it with the same arguments, between the same
        two batches. It changes no batch before `from_step`; batches already
        prepared for later steps (in the prefetch thread or in workers) are
        prepared again. The update is saved with the data position, so a
        resumed run, on any number of processes, replays it; it holds until
        the next update or the next configured `data.mixture_schedule` stage,
        whichever starts first.

        Args:
          weights: `{dataset name: weight}` (normalised; a dataset left out is off).
          from_step: The first data step mixed this way; at least the data
            step of the next batch (`data_step_at(step_counter)`).
        """
        self._check_open()
        self._check_same_everywhere("set_mixture", (weights, from_step))
        names = self.plan.spec.names
        row = parse_mixture_weights(weights, names, "set_mixture(weights)")
        if isinstance(from_step, bool) or not isinstance(from_step, numbers.Integral):
            raise DataConfigError(
                f"set_mixture(from_step={from_step!r}) is invalid; expected an int data step"
            )
        next_step = self.data_step_at(self.step_counter)
        if from_step < next_step:
            raise DataConfigError(
                f"set_mixture(from_step={from_step}) is in the past: the next batch is data step "
                f"{next_step}; pass from_step >= {next_step}"
            )
        kept = [u for u in self._mixture_updates if u[0] < from_step]
        self._apply_mixture_updates([*kept, (int(from_step), row)])
        prefetching = self._resources.prefetcher is not None
        self._restart(self._position())  # what was prepared ahead is planned again
        if prefetching:  # overlap the new batches with the step in flight
            self.start_prefetch()
        logging.info("mixture from data step %d: %s", from_step, dict(zip(names, row, strict=True)))

    def mixture_weights_at(self, data_step: int, *, configured: bool = False) -> dict[str, float]:
        """`{dataset: normalised weight}` in force at `data_step`.

        With `configured`, the config's weights there, online updates left out.
        """
        mixture = self._configured_mixture if configured else self.plan.spec.mixture
        weights = mixture.weights[mixture.stage_at(data_step)]
        return dict(zip(mixture.names, weights, strict=True))

    def _apply_mixture_updates(self, updates: list[MixtureUpdate]) -> None:
        self._mixture_updates = updates
        self.plan = self.plan.with_mixture(with_updates(self._configured_mixture, updates))

    def _check_same_everywhere(self, what: str, value: Any) -> None:
        """Refuses a call whose arguments differ between processes (a collective)."""
        if self.layout.process_count == 1:
            return
        digest = hashlib.sha256(_canonical(value).encode()).digest()
        mine = np.frombuffer(digest, dtype=np.int32)
        table = np.asarray(multihost_utils.process_allgather(mine)).reshape(-1, mine.size)
        differ = np.flatnonzero(np.any(table != mine, axis=1))
        if differ.size:
            raise DataConfigError(
                f"{what} was called with other arguments on process {int(differ[0])} than on "
                f"process {self.layout.process_index} ({_canonical(value)} here); every process "
                "must pass the same weights and from_step"
            )

    # Steps -------------------------------------------------------------------

    def data_step_at(self, step: int) -> int:
        """The data step (of the plan) behind the batch handed out at training step `step`."""
        return self.skips.data_step(step)

    def mixture_stage_at(self, step: int) -> tuple[int, dict[str, float]]:
        """`(stage index, {dataset: planned token share})` of the batch at training step `step`."""
        stage = self.plan.spec.mixture.stage_at(self.data_step_at(step))
        shares = self.plan.token_shares(stage)
        return stage, dict(zip(self.plan.spec.names, shares.tolist(), strict=True))

    def batch_size_at(self, step: int) -> int:
        """Global batch size of the batch handed out at training step `step`."""
        return self.plan.spec.batch.global_batch_size_at(self.data_step_at(step))

    def host_batch_size_at(self, step: int) -> int:
        """This data host's rows of the batch handed out at training step `step`."""
        return self.batch_size_at(step) // self.layout.host_count

    def last_batch_size(self) -> int:
        """Global batch size of the batch handed out last (the first, before any)."""
        return self.batch_size_at(max(self.step_counter - 1, 0))

    def examples_seen(self, step: int | None = None) -> int:
        """Global rows handed out before training step `step` (skipped steps' rows not counted)."""
        step = self.step_counter if step is None else step
        batch = self.plan.spec.batch
        data_step = self.data_step_at(step)
        seen = batch.examples_seen(data_step)
        for first, end in self.skips.ranges:
            if end <= data_step:
                seen -= batch.examples_seen(end) - batch.examples_seen(first)
        return seen

    # State -------------------------------------------------------------------

    def get_state(self) -> dict[str, Any]:
        """The position after the last batch handed out (JSON-able, host-count free)."""
        position = self._position()
        return {
            "format_version": PLAN_STATE_VERSION,
            "kind": PLAN_STATE_KIND,
            "step": self.step_counter,
            # The cursors' position: the data step after the last one handed out.
            "data_step": position["data_step"],
            "skip_steps": self.skips.to_pairs(),
            "sources": list(self.plan.spec.names),
            "cursor": list(position["cursor"]),
            "batch_schedule": self.plan.spec.batch.rampup.to_pairs(),
            "mixture_schedule": self.plan.spec.mixture.to_pairs(),
            "mixture_updates": updates_to_pairs(self.plan.spec.names, self._mixture_updates),
            "global_batch_size": self.plan.spec.batch.global_batch_size,
            "process_index": self.layout.process_index,
            "process_count": self.layout.process_count,
            "data_host_index": self.layout.host_index,
            "data_host_count": self.layout.host_count,
            "data_counters": self.data_counters.to_state(),
        }

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Continues at a saved position, on any process, host or worker count.

        `state` is one process's `get_state()`, or several merged with
        `plan_state.merge_plan_states` (every process saves the same cursor).
        """
        check_state_format(state, self.plan.spec.packing)
        step = int(state["step"])
        saved_skips = StepSkips(tuple(tuple(r) for r in state.get("skip_steps", ())))
        self.skips.check_resume(saved_skips, saved_data_step(state))
        self._check_schedule(state)
        remapped = cursor_by_name(state, self.plan.spec.names)
        if remapped[0] != saved_data_step(state):
            raise DataCheckpointError(
                f"the saved data cursor is at data step {remapped[0]} but the state's data step "
                f"is {saved_data_step(state)}; the data-state file is corrupted"
            )
        updates = updates_from_pairs(
            state.get("mixture_updates"), self.plan.spec.names, "the saved mixture_updates"
        )
        self._apply_mixture_updates(updates)
        self._restart({"step": step, "data_step": saved_data_step(state), "cursor": remapped})
        counters = state.get("data_counters")
        if counters is not None:
            self.data_counters.set_state(counters)
        self.state_set = True

    def _check_schedule(self, state: Mapping[str, Any]) -> None:
        step = saved_data_step(state)  # ramp-up stages are data steps
        saved = BatchSizeSchedule(int(state["global_batch_size"]), state["batch_schedule"])
        mine = self.plan.spec.batch
        changed = [
            s
            for s in {0, step - 1, *(t.start_step for t in saved.stages())}
            if 0 <= s < step and saved.global_batch_size_at(s) != mine.global_batch_size_at(s)
        ]
        if changed or saved.examples_seen(step) != mine.examples_seen(step):
            first = min(changed) if changed else step
            raise DataConfigError(
                f"data.rampup/data.global_batch_size changed the global batch size at already "
                f"trained step {first} (saved {saved.global_batch_size_at(first)} rows, now "
                f"{mine.global_batch_size_at(first)}); only stages after the checkpoint's step "
                f"{step} may change"
            )

    def save(self, filename: epath.PathLike) -> None:
        """Writes this process's state as JSON to `filename` (CLU surface)."""
        epath.Path(filename).write_text(json.dumps(self.get_state()))

    def restore(self, filename: epath.PathLike) -> None:
        """Reads a state written by `save` (CLU surface)."""
        path = epath.Path(filename)
        try:
            state = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as error:
            raise DataCheckpointError(f"cannot read iterator state file {path}: {error}") from error
        self.set_state(state)


#: The reference implementation's name for the iterator type.
MultiHostDataLoadIterator = PlannedDataIterator


#: How long the prefetch buffer stays full before the prefetch thread makes
#: its steps' device arrays ahead (`StepArrays`). A loop that waits for data
#: takes the buffered chunk sooner than this and makes the arrays itself
#: (`_take_chunk`), while the prefetch thread goes on with the host rows; a
#: loop slower than its data (a training step of a few ms or more) leaves
#: the chunk longer and then finds them made, as before this split.
MAKE_AHEAD_AFTER_SECS = 0.002


def _make_ahead(steps: list[_Prefetched]) -> None:
    """Makes a buffered chunk's device arrays in the prefetch thread while its buffer is full.

    A step the loop is making meanwhile is skipped. Module-level: the
    prefetch thread holds it, and it must not hold the iterator.
    """
    for step in steps:
        step.arrays.make_ahead(wait=False)


def _spec_of(arrays: Mapping[str, jax.Array]) -> dict[str, clu.data.ArraySpec]:
    return {k: clu.data.ArraySpec(dtype=v.dtype, shape=tuple(v.shape)) for k, v in arrays.items()}


def _canonical(value: Any) -> str:
    """A text form of set_mixture's arguments that is equal when they are."""
    weights, step = value
    if isinstance(weights, Mapping):
        weights = sorted((str(k), repr(v)) for k, v in weights.items())
    return repr((weights, step))
