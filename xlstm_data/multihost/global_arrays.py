"""Host-local numpy batches to one globally sharded `jax.Array` per field.

Every data-loading host holds `rows / host_count` rows of the global batch;
`jax.make_array_from_process_local_data` places them on the devices that hold
those rows, and processes that replicate the same rows pass identical data.
"""

from __future__ import annotations

import functools
import itertools
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from xlstm_data.reading.row_assembly import aligned_copy


def form_global_batch(
    local: Mapping[str, np.ndarray], sharding: NamedSharding, host_count: int
) -> dict[str, jax.Array]:
    """Builds the global arrays from this host's rows.

    Args:
      local: Host batch, each field `[host_rows, ...]`.
      sharding: Batch sharding over the mesh's data axes.
      host_count: Number of data-loading hosts.

    Returns:
      One `jax.Array` per field of shape `[host_rows * host_count, ...]`.
    """
    local = dict(local)
    global_shapes = {
        key: (array.shape[0] * host_count,) + tuple(array.shape[1:]) for key, array in local.items()
    }
    # One call for all fields: on one process it is a single batched transfer.
    return jax.make_array_from_process_local_data(sharding, local, global_shapes)


class ChunkTransfer:
    """Sends a chunk of consecutive steps, held as one block `[fields, rows, L]`, to the devices.

    A chunk's steps of equal rows go to the devices once, as one array
    `[fields, steps, rows, L]`; each step's fields are then picked from it on
    the devices by one compiled call (`_compiled_pick`). On one process with
    CPU devices the pick takes the host chunk itself, which a CPU device
    uses in place when it is 64-byte aligned (`row_assembly.aligned_empty`).
    An accelerator would copy a host argument to itself at every call, so
    there the chunk is put on the devices once and every pick reads it
    there. On an H100 (`bench/on_accelerator.sh`) a step of 8 x 1024 rows
    cost 0.51-0.54 ms of wall time and 0.67-0.70 ms of CPU with the host
    chunk passed to every pick, and 0.19-0.23 ms and 0.25-0.31 ms with the
    chunk put once; the whole 0-worker iterator went from 5.8 to 11.3 M
    tok/s (bench/peers corpus). On one CPU device, per step of 8 x 1024
    rows and 7 fields: a pytree of fields costs 0.77 ms of CPU
    (`form_global_batch`, JAX's per-array dispatch); one step's numpy block
    through a compiled split 0.11-0.16 ms, most of it copying the block
    (numpy allocates 16-byte aligned); a pick from an aligned chunk
    0.04-0.06 ms.

    No compile waits for a cold start: the first `PYTREE_STEPS` steps of a
    transfer go as pytrees, and so do the steps of a run shorter than a whole
    chunk (a ramp-up boundary, a finite plan's end), so only the chunk's
    full shape of each ramp-up stage is compiled. The pick is compiled in the
    calling thread (the prefetch thread), once per shape and process; each
    step's pick runs in whichever thread asks for its arrays first
    (`StepArrays`). A background compile was tried: a process then either
    waited for it at exit or ended inside it. The pick has no collective, so
    processes may run it in any order relative to their train steps.

    Args:
      names: The fields, in block order.
      sharding: Batch sharding over the mesh's data axes (rows split over them).
      host_count: Number of data-loading hosts.
      steps_per_chunk: Steps of a whole chunk (`PlannedChunkDataset`).
    """

    def __init__(
        self,
        names: Sequence[str],
        sharding: NamedSharding,
        host_count: int,
        steps_per_chunk: int,
    ):
        self._names = tuple(names)
        self._sharding = sharding
        self._host_count = host_count
        self._per_chunk = steps_per_chunk
        self._chunk_sharding = _chunk_sharding(sharding)
        self._in_place = picks_read_host_chunks(sharding)
        #: Step indices on the devices (the same on every process), made at the first pick.
        self._indices: list[jax.Array] = []
        self._sent = 0

    def steps(
        self,
        block: np.ndarray,
        rows: Sequence[int],
        release: Callable[[], None] | None = None,
    ) -> list[StepArrays]:
        """Each step's arrays to be made, `{name: jax.Array [rows * host_count, L]}` by `sharding`.

        What must happen once per chunk happens here (the pick's compile, the
        chunk's `device_put` on an accelerator); each step's arrays are made
        later, by the first thread that asks (`StepArrays`).

        Args:
          block: The chunk's host rows, `[fields, sum(rows), L]`, steps in order.
          rows: Each step's host rows.
          release: Given when `block` is lent (a worker's shared-memory slot,
            `SlotRing.lease`): called once nothing reads `block` any more.
            Picks on CPU devices read it in place, so it is released once
            every step's pick is ready (`_ReleasedWhenPicked`), and
            the copy out of the slot (1.8 MB a chunk) is saved: with 1 worker
            the whole iterator read 0.86 (0.71-0.94) of the host pipeline,
            against 0.78 (0.70-0.89) with the copy (bench/peers corpus, 8 x
            1024 rows, 9 processes each of paired windows, alternating).
            Anything else copies `block` and releases it at once: a pytree
            transfer on CPU would keep aliasing it, and an accelerator's
            chunk `device_put` is not waited for.
        """
        if release is not None:
            if self._in_place and self._picks_all(rows):
                try:
                    steps = self._picked(block, len(rows), _ReleasedWhenPicked(len(rows), release))
                except BaseException:  # no pick will read it
                    release()
                    raise
                self._sent += len(rows)
                return steps
            try:
                block = aligned_copy(block)
            finally:
                release()
        steps: list[StepArrays] = []
        start = 0
        for run_rows, run in itertools.groupby(int(r) for r in rows):
            count = len(list(run))
            if count == self._per_chunk and self._sent >= PYTREE_STEPS:
                steps += self._picked(block[:, start : start + count * run_rows], count)
            else:
                for first in range(start, start + count * run_rows, run_rows):
                    fields = dict(zip(self._names, block[:, first : first + run_rows], strict=True))
                    steps.append(
                        StepArrays(
                            functools.partial(
                                form_global_batch, fields, self._sharding, self._host_count
                            )
                        )
                    )
            self._sent += count
            start += count * run_rows
        return steps

    def _picks_all(self, rows: Sequence[int]) -> bool:
        """Whether every step of a chunk of `rows` goes through `_picked`."""
        return len(rows) == self._per_chunk and len(set(rows)) == 1 and self._sent >= PYTREE_STEPS

    def _picked(
        self, run: np.ndarray, count: int, lent: _ReleasedWhenPicked | None = None
    ) -> list[StepArrays]:
        """The steps of `run` (`[fields, count * rows, L]`), sent once and picked one by one."""
        local = run.reshape(run.shape[0], count, -1, *run.shape[2:])
        shape = (local.shape[0], count, local.shape[2] * self._host_count, *local.shape[3:])
        key = (self._names, self._sharding, shape, local.dtype.str)
        pick = _PICKS.get(key)
        if pick is None:
            pick = _PICKS[key] = _compiled_pick(*key)
        chunk = local
        if not self._in_place:
            chunk = jax.make_array_from_process_local_data(self._chunk_sharding, local, shape)
        if not self._indices:
            replicated = _replicated(self._sharding)
            self._indices = [
                jax.make_array_from_process_local_data(replicated, np.int32(k), ())
                for k in range(self._per_chunk)
            ]
        if lent is not None:
            return [
                StepArrays(functools.partial(lent.pick, pick, k, chunk, self._indices[k]))
                for k in range(count)
            ]
        return [StepArrays(functools.partial(pick, chunk, self._indices[k])) for k in range(count)]


class _ReleasedWhenPicked:
    """Releases a lent chunk once each of its `steps` steps has been picked from it.

    Each pick's outputs are waited for before they are kept and counted (on a
    CPU device a pick may run after its call returns), so before any thread
    hands them out: a user's loop cannot have donated or deleted them yet.
    A pick that fails, when called or while waited for, is not counted, and
    the chunk stays lent for the step's retry. A step picked before but not
    kept by its `StepArrays` (an interrupt in between) gets the arrays kept
    here: its slot may already be free again.

    Args:
      steps: The chunk's steps.
      release: Called once, after every step's outputs are ready.
    """

    def __init__(self, steps: int, release: Callable[[], None]):
        self._steps = steps
        self._release = release
        self._picked: dict[int, dict[str, jax.Array]] = {}
        self._lock = threading.Lock()

    def pick(
        self, pick: Callable[..., dict[str, jax.Array]], step: int, *args: Any
    ) -> dict[str, jax.Array]:
        with self._lock:
            arrays = self._picked.get(step)
        if arrays is not None:
            return arrays
        arrays = jax.block_until_ready(pick(*args))
        with self._lock:
            self._picked[step] = arrays
            last = len(self._picked) == self._steps
        if last:
            self._release()
        return arrays


class StepArrays:
    """One step's device arrays, made once, by whichever thread asks for them first.

    The prefetch thread makes a buffered chunk's arrays ahead once its buffer
    has stayed full a while (`BackgroundPrefetcher(finish=...)`): a loop
    slower than its data then finds them made. A loop that waits for data
    takes the chunk sooner and makes them itself, while the prefetch thread
    reads the next chunk's host rows (`PlannedDataIterator._take_chunk`,
    where the figures are). When only the prefetch thread made them, they
    waited behind the host pipeline on that thread.

    A failure while making them ahead, in either thread, is kept and raised
    by the step's own `get` (once: a later `get` tries again), so it reaches
    the loop at the step it belongs to, and is tried no more often than the
    loop asks.

    Args:
      make: Makes the arrays (a compiled pick, or a pytree transfer).
    """

    __slots__ = ("_arrays", "_error", "_lock", "_make")

    def __init__(self, make: Callable[[], dict[str, jax.Array]]):
        self._lock = threading.Lock()
        self._make: Callable[[], dict[str, jax.Array]] | None = make
        self._arrays: dict[str, jax.Array] = {}
        self._error: Exception | None = None

    @property
    def made(self) -> bool:
        """Whether the arrays exist (`get` will not make them)."""
        return self._make is None

    def get(self, keep_error: bool = False) -> dict[str, jax.Array]:
        """The arrays, made now if no thread has; raises a failure kept from `make_ahead`.

        Args:
          keep_error: Keep that failure for the step's own `get` (a peek).
        """
        if self._make is None:  # made, which a step with a kept failure never is
            return self._arrays
        with self._lock:
            if self._error is not None:
                error = self._error
                if not keep_error:
                    self._error = None
                raise error
            self._make_now()
            return self._arrays

    def make_ahead(self, wait: bool = True) -> None:
        """Makes the arrays unless they exist or a failure is pending, keeping a failure for `get`.

        Args:
          wait: Whether to wait while another thread holds this step (the
            prefetch thread does not: that thread is then making it).
        """
        if not self._lock.acquire(blocking=wait):
            return
        try:
            if self._error is None:
                self._make_now()
        except Exception as error:  # noqa: BLE001 - raised by this step's get()
            self._error = error
        finally:
            self._lock.release()

    def _make_now(self) -> None:
        """Makes the arrays unless made (the caller holds the lock)."""
        if self._make is not None:
            self._arrays = self._make()
            self._make = None  # after `_arrays`: `get` reads them without the lock


#: Steps sent as pytrees before the pick is compiled (per transfer).
PYTREE_STEPS = 64
#: Compiled picks by (names, sharding, chunk shape, dtype), shared by every
#: iterator of the process (an eval iterator rebuilt per pass compiles nothing again).
_PICKS: dict[tuple[Any, ...], Any] = {}


def picks_read_host_chunks(sharding: NamedSharding) -> bool:
    """Whether a pick takes the host chunk itself: one process with CPU devices (see above)."""
    return jax.process_count() == 1 and all(
        device.platform == "cpu" for device in sharding.mesh.devices.flat
    )


def _compiled_pick(
    names: tuple[str, ...], sharding: NamedSharding, shape: tuple[int, ...], dtype: str
) -> Any:
    """The compiled `(chunk, k) -> {name: chunk[i, k]}` whose outputs have `sharding`."""
    chunk_sharding = _chunk_sharding(sharding)
    index_sharding = _replicated(sharding)
    pick = jax.jit(
        lambda chunk, k: {name: chunk[i, k] for i, name in enumerate(names)},
        in_shardings=(chunk_sharding, index_sharding),
        out_shardings=sharding,
    )
    return pick.lower(
        jax.ShapeDtypeStruct(shape, dtype, sharding=chunk_sharding),
        jax.ShapeDtypeStruct((), np.int32, sharding=index_sharding),
    ).compile()


def _chunk_sharding(sharding: NamedSharding) -> NamedSharding:
    """`sharding` of a field's rows, for a chunk `[fields, steps, rows, L]` of them."""
    return NamedSharding(sharding.mesh, PartitionSpec(None, None, *sharding.spec))


def _replicated(sharding: NamedSharding) -> NamedSharding:
    """Every device of `sharding`'s mesh holds the whole (scalar) array."""
    return NamedSharding(sharding.mesh, PartitionSpec())
