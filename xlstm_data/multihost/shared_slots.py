"""Reused shared-memory slots that carry a worker's chunks to the main process.

grain sends a worker's array through a new shared-memory segment per
element, which the main process maps, copies and unlinks. The kernel
allocates and zeroes a new segment's pages on first touch: 2.1-2.7 ms per
chunk of 1.8 MB on the 2-core VM, against 0.05 ms to write the same bytes
into pages already touched. Assembling a chunk cost a worker 0.3 ms per step
in its own memory and 0.7 ms straight into a new segment (bench/peers
corpus, 8 x 1024 rows, 8 steps per chunk).

`SlotRing` is made by the main process for one pipeline with workers: a
segment per worker, cut into `slots` slots of `slot_bytes` each, whose pages
the worker reserves once, when it maps the segment, and then reuses. grain
has no public way to send into memory the worker already holds, hence this
module. A worker assembles a chunk straight into its next free slot
(`SlotWriter.empty`) and sends a `SlotRef` in its place (`SlotWriter.ref`),
a few bytes through grain's pipe; the main process copies the slot out on
arrival and marks it free (`SlotRing.take`), or lends the slot itself to
the consumer until it has read it (`SlotRing.lease`: the iterator's picks
read it in place). A worker whose next slot is still full waits for it, so
a slot is never written while the main process reads it. A pipeline being
closed first releases any waiting worker (`SlotRing.release_waiting`: it
must get back to grain's stop request), and unlinks the segments, which
belong to the main process, once the workers are gone (`SlotRing.close`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import mmap
import os
import threading
import time
from multiprocessing import shared_memory
from typing import Any

import numpy as np
from absl import logging

from xlstm_data.reading.row_assembly import ALIGNMENT, aligned_copy, aligned_empty

#: Bytes before the first slot: the closed flag, then one state per slot.
_HEADER_INTS = ALIGNMENT // 4
_CLOSED = 0
_FREE, _FULL = 0, 1
#: Longest sleep between two looks at a full slot (the first is 0.1 ms).
_MAX_WAIT_S = 0.005
#: A lock taken twice between copying a slot and freeing it, the free stored
#: inside the second: a release then an acquire keep the copy's reads before
#: the free on machines that reorder loads and stores (ARM), not only on x86.
_FENCE = threading.Lock()

#: The entry of a leased element (`SlotRing.lease`) that frees its slot.
RELEASE = "release_slot"

#: This worker's index among its pipeline's workers (`enter_worker`), or None.
_worker_index: int | None = None


def enter_worker(worker_index: int | None) -> None:
    """Tells this worker process which of the ring's segments is its own."""
    global _worker_index
    _worker_index = worker_index


@dataclasses.dataclass(frozen=True)
class SlotRef:
    """A chunk block in slot `slot` of worker `worker`'s segment, sent in its place."""

    worker: int
    slot: int
    shape: tuple[int, ...]
    dtype: str


def _header_bytes(slots: int) -> int:
    ints = _HEADER_INTS + slots
    return -(-ints * 4 // ALIGNMENT) * ALIGNMENT


def _layout(buffer: Any, slots: int, slot_bytes: int) -> tuple[np.ndarray, np.ndarray]:
    """The segment's int32 header and its `[slots, slot_bytes]` uint8 slots."""
    header = _header_bytes(slots)
    states = np.ndarray((header // 4,), np.int32, buffer=buffer)
    data = np.ndarray((slots, slot_bytes), np.uint8, buffer=buffer, offset=header)
    return states, data


class SlotWriter:
    """The workers' side of a `SlotRing` (pickled into each worker with its dataset).

    Args:
      names: Each worker's segment.
      slots: Slots per segment.
      slot_bytes: Bytes per slot (a multiple of `ALIGNMENT`).
    """

    def __init__(self, names: tuple[str, ...], slots: int, slot_bytes: int):
        self._names = names
        self._slots = slots
        self._slot_bytes = slot_bytes
        self._views: tuple[np.ndarray, np.ndarray] | None = None
        self._next = 0

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_views": None, "_next": 0}

    def empty(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """An uninitialised array in this worker's next slot, once that slot is free.

        Outside a worker, or for an array larger than a slot, an ordinary
        aligned array (sent as grain sends any array).
        """
        dtype = np.dtype(dtype)
        size = math.prod(shape) * dtype.itemsize
        opened = self._open() if size <= self._slot_bytes else None
        if opened is None:
            return aligned_empty(shape, dtype)
        states, data = opened
        slot = self._next
        self._next = (slot + 1) % self._slots
        _wait_free(states, slot)
        with _FENCE:  # the free was seen before anything is written
            states[_HEADER_INTS + slot] = _FULL
        return data[slot, :size].view(dtype).reshape(shape)

    def ref(self, array: np.ndarray) -> SlotRef | np.ndarray:
        """`array`'s `SlotRef` if `empty` placed it in a slot, else `array` itself."""
        opened = self._views
        if opened is None:
            return array
        data = opened[1]
        offset = array.ctypes.data - data.ctypes.data
        if not 0 <= offset < data.nbytes or offset % self._slot_bytes:
            return array
        return SlotRef(_worker_index or 0, offset // self._slot_bytes, array.shape, array.dtype.str)

    def _open(self) -> tuple[np.ndarray, np.ndarray] | None:
        if _worker_index is None or _worker_index >= len(self._names):
            return None
        if self._views is None:
            try:
                segment = _attach(self._names[_worker_index])
            except (OSError, ImportError) as error:
                # Closed before this worker began, no room left in /dev/shm, or
                # no POSIX shared memory: grain sends this worker's chunks.
                logging.info("worker %d sends chunks without slots: %s", _worker_index, error)
                return None
            self._views = _layout(segment, self._slots, self._slot_bytes)
        return self._views


def _wait_free(states: np.ndarray, slot: int) -> None:
    """Waits until `slot` is free or the ring is closed."""
    wait = 0.0001
    while states[_HEADER_INTS + slot] != _FREE and not states[_CLOSED]:
        time.sleep(wait)
        wait = min(2 * wait, _MAX_WAIT_S)


def _attach(name: str, reserve: bool = True) -> mmap.mmap:
    """Maps the main process's segment `name`, its pages reserved, leaving the resource tracker out.

    A segment is sized by `ftruncate` but its pages are taken on first
    touch, and a touch past a full tmpfs kills the worker with SIGBUS;
    `posix_fallocate` takes them all now or fails with ENOSPC (then the
    worker goes without slots). It costs about a millisecond per MB, once
    per worker and pipeline, in the worker.

    `shared_memory.SharedMemory(name)` registers the segment with the
    resource tracker on every open before Python 3.13 (the main process's
    tracker, which the workers share): a worker's registration arriving after
    the main process unlinked the segment made the tracker report it leaked
    at exit. The segment is the main process's to unlink, so a worker maps
    it with CPython's own `shm_open`, as `SharedMemory` does, and nothing else.

    Args:
      name: The segment.
      reserve: Take its pages now (a worker); the main process, which maps
        it again only for its views (`SlotRing`), leaves that to the worker.
    """
    import _posixshmem

    fd = _posixshmem.shm_open("/" + name, os.O_RDWR, mode=0o600)
    try:
        size = os.fstat(fd).st_size
        if reserve and hasattr(os, "posix_fallocate"):
            os.posix_fallocate(fd, 0, size)
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)


#: Where POSIX shared memory lives on Linux (a tmpfs, 64 MB in a default Docker container).
SHM_DIR = "/dev/shm"


def slots_that_fit(workers: int, wanted: int, slot_bytes: int) -> int:
    """`wanted` slots per worker, or fewer if they would take over half of the free shared memory.

    Sized to what is free when the ring is made, leaving the other half to
    grain's own segments, which come and go beside it (a worker that still
    finds no room when it reserves its pages goes without slots, `_attach`).
    0 when not even 2 slots per worker fit: the caller then lets grain send
    the chunks as it does any array.
    """
    try:
        stats = os.statvfs(SHM_DIR)
    except OSError:  # not Linux: no tmpfs to measure
        return wanted
    free = stats.f_bavail * stats.f_frsize
    fitting = free // 2 // max(workers, 1) // max(slot_bytes, 1)
    slots = min(wanted, fitting)
    return slots if slots >= 2 else 0


def _release_of(element: Any) -> Any:
    """What frees the slot `element` was lent (`SlotRing.lease`), or None."""
    return element.get(RELEASE) if isinstance(element, dict) else None


def give_back(element: Any) -> None:
    """Frees the slot `element` was lent, if any: its reader is done with the block.

    A lent slot left full would make its worker wait for it forever once the
    worker came round to it again (a chunk dropped unread, or read as numpy).
    """
    release = _release_of(element)
    if release is not None:
        release()


def owned(element: Any) -> Any:
    """`element` with a block lent from a slot (`SlotRing.lease`) copied, and the slot freed.

    Anything else is returned as it is.
    """
    release = _release_of(element)
    if release is None:
        return element
    copied = {key: value for key, value in element.items() if key != RELEASE}
    try:
        copied["fields"] = aligned_copy(element["fields"])
    finally:
        release()
    return copied


class SlotRing:
    """The main process's side: owns the segments, and copies or lends slots out.

    Args:
      workers: Worker processes of the pipeline, a segment each.
      slots: Slots per worker: more than the chunks a worker can have in
        flight (its buffer and grain's queue), or the worker waits.
      slot_bytes: Bytes of the largest chunk block.
    """

    def __init__(self, workers: int, slots: int, slot_bytes: int):
        self._slots = slots
        self._slot_bytes = -(-slot_bytes // ALIGNMENT) * ALIGNMENT
        size = _header_bytes(slots) + slots * self._slot_bytes
        self._segments: list[shared_memory.SharedMemory] = []
        try:
            for _ in range(workers):
                self._segments.append(shared_memory.SharedMemory(create=True, size=size))
        except BaseException:
            self._unlink_all()
            raise
        # Mapped again, apart from `SharedMemory`'s own mapping, which `close()`
        # unmaps whatever still views it: these mappings go only with the last
        # array that views them (a lent slot read after the ring closed).
        self._views = [
            _layout(_attach(s.name, reserve=False), slots, self._slot_bytes) for s in self._segments
        ]
        self.writer = SlotWriter(tuple(s.name for s in self._segments), slots, self._slot_bytes)
        self._closed = False

    def take(self, element: Any) -> Any:
        """`element` with its `SlotRef` (`"fields"`) replaced by a copy, the slot freed."""
        return owned(self.lease(element))

    def lease(self, element: Any) -> Any:
        """`element` with its `SlotRef` (`"fields"`) replaced by a view of the slot itself.

        The slot stays full, so its worker does not write it, until the
        element's `RELEASE` entry is called (once) by whoever read the view
        last: the view must not be read after that. A consumer that keeps the
        block longer copies it first (`take`).
        """
        if not isinstance(element, dict) or not isinstance(element.get("fields"), SlotRef):
            return element
        if self._closed:
            raise RuntimeError("a chunk arrived from a pipeline already closed")
        ref: SlotRef = element["fields"]
        data = self._views[ref.worker][1]
        dtype = np.dtype(ref.dtype)
        size = math.prod(ref.shape) * dtype.itemsize
        view = data[ref.slot, :size].view(dtype).reshape(ref.shape)
        return {**element, "fields": view, RELEASE: functools.partial(self._free, ref)}

    def _free(self, ref: SlotRef) -> None:
        """Marks `ref`'s slot free for its worker (nothing once the ring is closed)."""
        views = self._views  # held here, the mapping stays while it is written
        if self._closed or not views:
            return
        states = views[ref.worker][0]
        with _FENCE:  # the view's reads finish before the worker may write again
            pass
        with _FENCE:
            states[_HEADER_INTS + ref.slot] = _FREE

    def release_waiting(self) -> None:
        """Lets every worker write without waiting (its chunks will not be read)."""
        for views in self._views:
            views[0][_CLOSED] = 1

    def close(self) -> None:
        """Releases any waiting worker and unlinks the segments."""
        if self._closed:
            return
        self._closed = True
        self.release_waiting()
        self._views = []
        self._unlink_all()

    def _unlink_all(self) -> None:
        for segment in self._segments:
            try:
                segment.close()
            except BufferError:  # nothing views this mapping (the views have their own)
                logging.debug("shared slots %s still viewed at close", segment.name)
            try:
                segment.unlink()
            except OSError as error:  # one failure must not keep the others
                logging.warning("could not unlink shared slots %s: %s", segment.name, error)
