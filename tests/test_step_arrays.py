"""A step's device arrays are made once, by whichever thread asks first, and nothing is lost.

The prefetch thread makes a buffered chunk's arrays ahead only once its
buffer has stayed full a while (a loop slower than its data); a loop that
waits for data makes them itself when it takes the chunk. Either way every
step hands out the host pipeline's fields, and an error making a step's
arrays is raised at that step's `next()`, which a retry then serves.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time

import jax
import numpy as np
import pytest

from tests.test_planned_iterator import DATA
from xlstm_data import create_mesh, iterators_from_config
from xlstm_data.multihost import global_arrays, iterator
from xlstm_data.multihost.global_arrays import StepArrays
from xlstm_data.multihost.prefetch import BackgroundPrefetcher
from xlstm_data.reading.row_assembly import fields_of

pytestmark = pytest.mark.usefixtures("small_chunks")

STEPS = 24  # three chunks of 8 steps


def _wait_until(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.005)


def test_the_prefetch_thread_finishes_only_results_left_in_a_full_buffer():
    finished: list[tuple[int, threading.Thread]] = []
    counter = itertools.count()

    def produce() -> int:
        time.sleep(0.02)  # the consumer is already waiting for the first result
        return next(counter)

    prefetcher = BackgroundPrefetcher(
        produce,
        depth=1,
        finish=lambda item: finished.append((item, threading.current_thread())),
        finish_after=0.5,  # far longer than the waiting consumer takes to wake
    )
    try:
        assert prefetcher.get() == 0  # taken as soon as it was made: never finished
        _wait_until(lambda: len(finished) == 1)
        time.sleep(0.2)
        assert [item for item, _ in finished] == [1]  # left in the full buffer
        assert finished[0][1] is prefetcher.thread
        assert prefetcher.get() == 1
        _wait_until(lambda: len(finished) == 2)
        assert [item for item, _ in finished] == [1, 2]
    finally:
        prefetcher.stop()
    assert not prefetcher.thread.is_alive()


def test_stop_waits_for_a_finish_under_way():
    started = threading.Event()

    def slow_finish(item: int) -> None:
        started.set()
        time.sleep(0.2)

    prefetcher = BackgroundPrefetcher(itertools.count().__next__, depth=1, finish=slow_finish)
    assert started.wait(10)
    prefetcher.stop()
    assert not prefetcher.thread.is_alive()


def test_a_finish_that_raises_ends_the_stream_after_the_buffered_results():
    def broken_finish(item: int) -> None:
        raise SystemExit("finish broke its contract")

    prefetcher = BackgroundPrefetcher(itertools.count().__next__, depth=1, finish=broken_finish)
    try:
        prefetcher.thread.join(10)  # ended by the broken finish of result 0
        assert not prefetcher.thread.is_alive()
        assert prefetcher.get() == 0  # buffered before the finish broke
        for _ in range(2):  # raised, then raised again: a retry does not wait forever
            with pytest.raises(SystemExit, match="broke its contract"):
                prefetcher.get()
    finally:
        prefetcher.stop()


def test_a_failure_made_ahead_is_raised_once_then_made_again():
    results = iter([RuntimeError("device out of memory"), {"inputs": 1}])

    def make() -> dict:
        result = next(results)
        if isinstance(result, Exception):
            raise result
        return result

    step = StepArrays(make)
    step.make_ahead()
    step.make_ahead()  # pending failure: not tried again
    with pytest.raises(RuntimeError, match="out of memory"):
        step.get(keep_error=True)  # a peek keeps it for the step's own get
    with pytest.raises(RuntimeError, match="out of memory"):
        step.get()
    assert step.get() == {"inputs": 1} and step.made


def test_the_prefetch_thread_skips_a_step_another_thread_is_making():
    step = StepArrays(lambda: {"inputs": 1})
    with step._lock:  # the loop is making it
        step.make_ahead(wait=False)
    assert not step.made
    step.make_ahead(wait=False)
    assert step.made


def test_racing_threads_make_each_steps_arrays_once():
    calls = itertools.count()
    steps = [StepArrays(lambda: {"calls": next(calls)}) for _ in range(500)]
    seen: dict[str, list[dict]] = {}

    def take(name: str) -> None:
        seen[name] = [step.get() for step in steps]

    threads = [threading.Thread(target=take, args=(name,)) for name in "ab"]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert next(calls) == 500  # one make per step
    assert all(x is y for x, y in zip(seen["a"], seen["b"], strict=True))


def _host_steps(train) -> list[dict[str, np.ndarray]]:
    return [fields_of(e["fields"]) for e in itertools.islice(train.host_batches(), STEPS)]


def _assert_step(batch, expected: dict[str, np.ndarray], step: int) -> None:
    got = batch.to_dict()
    assert got.keys() == expected.keys()
    for name, want in expected.items():
        np.testing.assert_array_equal(np.asarray(got[name]), want, err_msg=f"step {step} {name}")


def _check_a_loop(
    monkeypatch, axes: str, slow_loop: bool, guard: contextlib.AbstractContextManager | None = None
) -> list[dict[str, np.ndarray]]:
    """Runs a loop (slow: 30 ms a step) over the iterator; every step is the host's."""
    if not slow_loop:  # no buffer stays full this long: the loop makes every step
        monkeypatch.setattr(iterator, "MAKE_AHEAD_AFTER_SECS", 60.0)
    train, _ = iterators_from_config(DATA, create_mesh(axes))
    try:
        expected = _host_steps(train)
        with guard or contextlib.nullcontext():
            for step, want in enumerate(expected):
                if slow_loop:
                    time.sleep(0.03)
                _assert_step(next(train), want, step)
    finally:
        train.close()
    return expected


@pytest.mark.parametrize("slow_loop", [False, True])
def test_each_step_is_made_by_the_thread_the_loop_speed_calls_for(monkeypatch, slow_loop):
    """Slow loop: the prefetch thread makes the buffered chunks; fast loop: the loop itself."""
    makers: dict[bytes, list[str]] = {}  # by a step's inputs
    form = global_arrays.form_global_batch

    def recording(fields, *args):
        key = np.asarray(fields["inputs"]).tobytes()
        makers.setdefault(key, []).append(threading.current_thread().name)
        return form(fields, *args)

    monkeypatch.setattr(global_arrays, "form_global_batch", recording)
    monkeypatch.setattr(global_arrays, "PYTREE_STEPS", 10**6)  # every step a pytree
    expected = _check_a_loop(monkeypatch, "dp:4,fsdp:1,tp:1,sp:1", slow_loop)
    made = [makers[want["inputs"].tobytes()] for want in expected]
    assert all(len(threads) == 1 for threads in made)  # once each
    threads = {thread for (thread,) in made[STEPS // 2 :]}
    if slow_loop:  # the first chunk was taken at once; the later ones waited in the buffer
        assert threads == {"xlstm-data-prefetch"}
    else:
        assert threads == {threading.main_thread().name}


def _failing_once(monkeypatch, step: int, error: BaseException) -> tuple[list[str], dict]:
    """`form_global_batch` raising `error` the first time it makes `step`.

    Returns the threads that made `step`, and a dict whose "expected" the
    test sets to the host steps once it has them.
    """
    form = global_arrays.form_global_batch
    calls: list[str] = []
    state = {"expected": None}

    def failing(fields, *args):
        want = state["expected"]
        if want is not None and np.array_equal(fields["inputs"], want[step]["inputs"]):
            calls.append(threading.current_thread().name)
            if len(calls) == 1:
                raise error
        return form(fields, *args)

    monkeypatch.setattr(global_arrays, "form_global_batch", failing)
    monkeypatch.setattr(global_arrays, "PYTREE_STEPS", 10**6)
    return calls, state


@pytest.mark.parametrize("slow_loop", [False, True])
def test_a_failure_making_a_steps_arrays_is_raised_at_that_step_and_a_retry_serves_it(
    monkeypatch, slow_loop
):
    """Made ahead by either thread, the failure is kept for the step's own next(), not retried."""
    failing_step = 12  # in the second chunk: the slow loop's prefetch thread makes it
    calls, state = _failing_once(monkeypatch, failing_step, RuntimeError("device out of memory"))
    if not slow_loop:
        monkeypatch.setattr(iterator, "MAKE_AHEAD_AFTER_SECS", 60.0)
    train, _ = iterators_from_config(DATA, create_mesh("dp:4,fsdp:1,tp:1,sp:1"))
    try:
        expected = state["expected"] = _host_steps(train)
        for step in range(failing_step):
            if slow_loop:
                time.sleep(0.03)
            _assert_step(next(train), expected[step], step)
        with pytest.raises(RuntimeError, match="device out of memory"):
            next(train)
        assert len(calls) == 1  # kept, not tried again before the loop asked
        assert calls[0] == ("xlstm-data-prefetch" if slow_loop else threading.main_thread().name)
        assert train.get_state()["step"] == failing_step  # not handed out
        for step in range(failing_step, STEPS):  # the retry serves it, then the rest
            _assert_step(next(train), expected[step], step)
        assert len(calls) == 2
    finally:
        train.close()


def test_an_interrupt_while_the_loop_makes_a_chunk_loses_no_step(monkeypatch):
    """Ctrl-C in a notebook while next() makes a chunk's arrays, then the loop run again."""
    calls, state = _failing_once(monkeypatch, 12, KeyboardInterrupt())
    monkeypatch.setattr(iterator, "MAKE_AHEAD_AFTER_SECS", 60.0)
    train, _ = iterators_from_config(DATA, create_mesh("dp:4,fsdp:1,tp:1,sp:1"))
    try:
        expected = state["expected"] = _host_steps(train)
        served = []
        while len(served) < STEPS:
            try:
                served.append(next(train))
            except KeyboardInterrupt:
                assert len(calls) == 1
        for step, batch in enumerate(served):
            _assert_step(batch, expected[step], step)
    finally:
        train.close()


@pytest.mark.parametrize("slow_loop", [False, True])
def test_picked_steps_are_the_host_steps_whichever_thread_makes_them(monkeypatch, slow_loop):
    """The compiled pick's path (every whole chunk), under the loop's own transfer guard."""
    monkeypatch.setattr(global_arrays, "PYTREE_STEPS", 0)
    # a user's loop that forbids implicit transfers
    _check_a_loop(monkeypatch, "dp:2,fsdp:2,tp:1,sp:1", slow_loop, jax.transfer_guard("disallow"))
