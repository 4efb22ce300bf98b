"""`WorkerHandover`: the loop never waits for workers to start, and no step is lost or repeated."""

from __future__ import annotations

import functools
import threading

import pytest

from xlstm_data.multihost.shared_slots import RELEASE
from xlstm_data.multihost.worker_handover import WorkerHandover

STEPS = 40


class SlowWorkers:
    """Workers whose first element (element `first` of the stream) waits for `ready`."""

    def __init__(self, first: int, ready: threading.Event):
        self.first = first
        self.ready = ready
        self.made = 0

    def __iter__(self):  # a generator: closable, as grain's worker iterator
        self.ready.wait(10)
        for index in range(self.first, STEPS):
            self.made += 1
            yield ("workers", index)


def _in_process():
    return iter(("here", index) for index in range(STEPS))


def _served(workers: SlowWorkers, ready: threading.Event, ready_after: int) -> tuple[list, int]:
    """Every element of a handover whose workers get ready after `ready_after` were served here.

    Returns them, and the index of the workers' first element (after the helper's drops).
    """
    handover = WorkerHandover(_in_process(), workers, workers_from=3)
    got = []
    try:
        for _ in range(ready_after):
            got.append(next(handover))
        ready.set()
        index, _ = handover._first.result(10)  # the workers' first element is there
        got.extend(handover)
    finally:
        handover.close()
    return got, index


@pytest.mark.parametrize("ready_after", [0, 3, 11, 39])
def test_steps_are_served_here_until_the_workers_first_chunk_is_there(ready_after):
    """Whenever the workers become ready, every element comes once and in order."""
    ready = threading.Event()
    workers = SlowWorkers(first=3, ready=ready)
    got, index = _served(workers, ready, ready_after)
    assert index == max(ready_after, 3)  # the helper dropped what was served here
    assert [index for _, index in got] == list(range(STEPS))
    here = max(ready_after, 3)
    assert {origin for origin, _ in got[:here]} == {"here"}
    assert {origin for origin, _ in got[here:]} <= {"workers"}
    assert workers.made == STEPS - 3  # the workers began at their fixed element


def test_the_stream_ends_with_the_in_process_one_when_workers_never_start():
    ready = threading.Event()
    handover = WorkerHandover(_in_process(), SlowWorkers(3, ready), workers_from=3)
    try:
        assert [index for _, index in handover] == list(range(STEPS))
    finally:
        ready.set()
        handover.close()


def test_without_in_process_steps_the_workers_serve_from_the_first():
    ready = threading.Event()
    ready.set()
    handover = WorkerHandover(None, SlowWorkers(0, ready))
    try:
        assert [index for _, index in handover] == list(range(STEPS))
    finally:
        handover.close()


def test_workers_slower_than_this_process_still_take_over():
    """A loop that asks as fast as this process computes: the workers catch up, then serve."""
    import time

    class Slow(SlowWorkers):
        def __iter__(self):
            for origin, index in super().__iter__():
                time.sleep(0.01)  # slower than the in-process elements
                yield origin, index

    ready = threading.Event()
    ready.set()

    def in_process():
        for element in _in_process():
            time.sleep(0.001)  # faster than the workers
            yield element

    handover = WorkerHandover(in_process(), Slow(3, ready), workers_from=3)
    try:
        got = list(handover)
    finally:
        handover.close()
    assert [index for _, index in got] == list(range(STEPS))
    assert got[-1][0] == "workers"  # this process stopped serving once the workers were up


def test_workers_from_needs_elements_served_in_process():
    with pytest.raises(ValueError, match="workers_from"):
        WorkerHandover(None, SlowWorkers(0, threading.Event()), workers_from=3)


class LendingWorkers(SlowWorkers):
    """Workers whose elements are lent slots (`SlotRing.lease`): each must be released once."""

    def __init__(self, first: int, ready: threading.Event):
        super().__init__(first, ready)
        self.released: list[int] = []

    def __iter__(self):
        for origin, index in super().__iter__():
            yield {"step": (origin, index), RELEASE: functools.partial(self.released.append, index)}


@pytest.mark.parametrize("ready_after", [3, 11, 39])
def test_a_dropped_chunk_frees_its_lent_slot(ready_after):
    """Chunks the workers made for steps served here are dropped, and their slots freed.

    A slot left full would stop its worker for good once it came round to it.
    """
    ready = threading.Event()
    workers = LendingWorkers(first=3, ready=ready)
    got, _ = _served(workers, ready, ready_after)
    served = [e["step"][1] for e in got if isinstance(e, dict)]
    assert sorted(workers.released) == list(range(3, ready_after))  # exactly the dropped ones
    assert not set(workers.released) & set(served)
