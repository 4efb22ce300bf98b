"""The reused shared-memory slots a worker's chunks travel in (`multihost.shared_slots`).

The writer's side runs here as a worker would (`enter_worker`), on a copy
made by pickling, as grain sends it; the pipelines with real worker
processes are checked batch by batch in test_planned_iterator and
test_workers_lifecycle.
"""

from __future__ import annotations

import os
import pickle
import threading
import time

import numpy as np
import pytest

from xlstm_data.multihost import shared_slots
from xlstm_data.multihost.shared_slots import SlotRef, SlotRing
from xlstm_data.multihost.worker_handover import WorkerHandover

SHAPE = (7, 4, 32)


@pytest.fixture
def as_worker_1():
    shared_slots.enter_worker(1)
    yield
    shared_slots.enter_worker(None)


def _element(writer, value: int) -> dict:
    block = writer.empty(SHAPE, np.int32)
    block[...] = value
    return {"fields": writer.ref(block), "rows": np.array([4])}


def _segment_exists(name: str) -> bool:
    return os.path.exists(f"/dev/shm/{name}")


def test_a_chunk_goes_through_a_slot_and_comes_back_equal(as_worker_1):
    ring = SlotRing(workers=2, slots=3, slot_bytes=7 * 4 * 32 * 4)
    writer = pickle.loads(pickle.dumps(ring.writer))
    try:
        for value in range(7):  # more chunks than slots: each slot is freed and reused
            element = _element(writer, value)
            ref = element["fields"]
            assert isinstance(ref, SlotRef) and (ref.worker, ref.slot) == (1, value % 3)
            got = ring.take(element)
            assert type(got["fields"]) is np.ndarray and got["fields"].shape == SHAPE
            assert (got["fields"] == value).all()
            assert got["fields"].ctypes.data % 64 == 0  # a CPU device uses it in place
            assert got["rows"].tolist() == [4]
    finally:
        ring.close()


def test_a_worker_waits_for_its_next_slot_until_the_main_process_frees_it(as_worker_1):
    ring = SlotRing(workers=2, slots=2, slot_bytes=7 * 4 * 32 * 4)
    writer = ring.writer
    try:
        held = [_element(writer, 1), _element(writer, 2)]  # both slots written, none taken
        third: list[dict] = []
        waiting = threading.Thread(target=lambda: third.append(_element(writer, 3)))
        waiting.start()
        time.sleep(0.2)
        assert waiting.is_alive() and not third  # slot 0 still holds a chunk not yet read
        assert (ring.take(held[0])["fields"] == 1).all()
        waiting.join(5)
        assert not waiting.is_alive()
        assert (ring.take(held[1])["fields"] == 2).all()
        assert (ring.take(third[0])["fields"] == 3).all()
    finally:
        ring.close()


def test_a_lent_slot_is_the_slot_itself_and_stays_full_until_released(as_worker_1):
    ring = SlotRing(workers=2, slots=2, slot_bytes=7 * 4 * 32 * 4)
    writer = ring.writer
    try:
        lent = [ring.lease(_element(writer, value)) for value in (1, 2)]
        for value, element in enumerate(lent, start=1):
            assert (element["fields"] == value).all() and element["rows"].tolist() == [4]
            assert element["fields"].ctypes.data % 64 == 0  # a CPU device reads it in place
        assert np.shares_memory(lent[0]["fields"], ring._views[1][1])  # noqa: SLF001 - no copy
        third: list[dict] = []
        waiting = threading.Thread(target=lambda: third.append(_element(writer, 3)))
        waiting.start()
        time.sleep(0.2)
        assert waiting.is_alive()  # both slots are lent: the worker waits
        lent[0][shared_slots.RELEASE]()
        waiting.join(5)
        assert not waiting.is_alive()
        assert (lent[0]["fields"] == 3).all()  # released: the worker wrote its slot again
        assert (lent[1]["fields"] == 2).all()
        lent[1][shared_slots.RELEASE]()
        assert (ring.take(third[0])["fields"] == 3).all()
        kept = ring.lease(_element(writer, 4))
    finally:
        ring.close()
    lent[1][shared_slots.RELEASE]()  # after close: nothing to free, no error
    # A view lent before the close still reads its slot: the mapping goes with it.
    assert (kept["fields"] == 4).all()


def test_close_releases_a_waiting_worker_and_unlinks_the_segments(as_worker_1):
    ring = SlotRing(workers=2, slots=1, slot_bytes=7 * 4 * 32 * 4)
    names = ring.writer._names
    assert all(_segment_exists(name) for name in names)
    _element(ring.writer, 1)  # never taken: the slot stays full
    waiting = threading.Thread(target=lambda: _element(ring.writer, 2))
    waiting.start()
    time.sleep(0.1)
    assert waiting.is_alive()
    ring.close()
    waiting.join(5)
    assert not waiting.is_alive()
    assert not any(_segment_exists(name) for name in names)
    ring.close()  # twice is harmless
    with pytest.raises(RuntimeError, match="already closed"):
        ring.take({"fields": SlotRef(1, 0, SHAPE, "<i4")})


def test_outside_a_worker_or_larger_than_a_slot_blocks_are_ordinary_arrays(as_worker_1):
    ring = SlotRing(workers=2, slots=2, slot_bytes=64)
    try:
        element = _element(ring.writer, 5)  # 3,584 bytes: more than a slot
        assert type(element["fields"]) is np.ndarray
        assert ring.take(element) is element
        shared_slots.enter_worker(None)
        plain = _element(pickle.loads(pickle.dumps(ring.writer)), 6)
        assert type(plain["fields"]) is np.ndarray and (plain["fields"] == 6).all()
    finally:
        ring.close()


def test_a_worker_started_after_close_falls_back_to_its_own_memory(as_worker_1):
    ring = SlotRing(workers=2, slots=2, slot_bytes=7 * 4 * 32 * 4)
    writer = pickle.loads(pickle.dumps(ring.writer))
    ring.close()
    element = _element(writer, 4)
    assert type(element["fields"]) is np.ndarray and (element["fields"] == 4).all()


def test_a_closing_pipeline_lets_waiting_workers_go_before_asking_them_to_stop():
    """A worker stuck waiting for a slot would not see grain's stop request (25 s stall)."""
    ring = SlotRing(workers=1, slots=1, slot_bytes=64)
    names = ring.writer._names
    released_when_stopped = []

    class Workers:
        def __iter__(self):
            return self

        def __next__(self):
            return {"fields": np.zeros(1)}

        def close(self):
            states = ring._views[0][0]
            released_when_stopped.append(bool(states[shared_slots._CLOSED]))

    handover = WorkerHandover(None, Workers(), slots=ring)
    next(handover)
    handover.close()
    assert released_when_stopped == [True]
    assert not any(_segment_exists(name) for name in names)


def test_slots_fit_in_half_the_free_shared_memory(monkeypatch):
    class Stats:
        f_frsize = 4096
        f_bavail = 64 * 1024 * 1024 // 4096  # 64 MB free, a default Docker container

    monkeypatch.setattr(shared_slots.os, "statvfs", lambda path: Stats())
    megabyte = 1 << 20
    assert shared_slots.slots_that_fit(workers=2, wanted=8, slot_bytes=megabyte) == 8
    assert shared_slots.slots_that_fit(workers=2, wanted=8, slot_bytes=4 * megabyte) == 4
    assert shared_slots.slots_that_fit(workers=8, wanted=8, slot_bytes=4 * megabyte) == 0


def test_a_worker_with_no_room_to_reserve_its_slots_goes_without_them(as_worker_1, monkeypatch):
    """Pages are reserved when a worker maps its segment: a full tmpfs is ENOSPC, not SIGBUS."""
    import errno

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    ring = SlotRing(workers=2, slots=2, slot_bytes=7 * 4 * 32 * 4)
    monkeypatch.setattr(shared_slots.os, "posix_fallocate", full)
    try:
        element = _element(pickle.loads(pickle.dumps(ring.writer)), 3)
        assert type(element["fields"]) is np.ndarray and (element["fields"] == 3).all()
    finally:
        ring.close()
