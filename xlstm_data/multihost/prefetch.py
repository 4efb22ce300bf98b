"""A bounded background buffer that keeps the next batches ready.

A producer thread calls `produce()` until it raises StopIteration, keeping at
most `depth` results ahead of the consumer. A result may be a bundle that
counts as several (`size`): a chunk's steps then cross between the threads
in one hand-over instead of one each (`PlannedDataIterator._produce`).
While the buffer stays full, the thread may finish buffered results
(`finish`): work the consumer would otherwise do itself, done only when the
consumer is the slower side and the producer has nothing else to do.
Errors in the thread are re-raised in the consumer at the position where
they happened, never swallowed.

The thread never keeps its owner alive: it shares only a small channel (the
buffer and its condition) with the `BackgroundPrefetcher`, and holds a bound
method `produce` weakly, taking a strong reference only for the duration of
one call (`finish` is held strongly, so it must not reference the owner). An
iterator dropped without `close()` is therefore collected, and its
prefetcher's finalizer stops the thread; a thread that finds its producer
gone stops by itself.

Threads still running at interpreter exit are stopped by an `atexit` hook:
a daemon thread frozen inside XLA's native code during finalisation aborts
the process, so an iterator the caller forgot to close must not do that.
"""

from __future__ import annotations

import atexit
import collections
import inspect
import signal
import threading
import weakref
from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class _Failure:
    def __init__(self, error: BaseException):
        self.error = error


class _Channel:
    """What the producer thread and the consumer share (no reference to either)."""

    def __init__(self, depth: int, size: Callable[[Any], int]):
        self.depth = depth
        self.size = size
        self.buffer: collections.deque[Any] = collections.deque()
        #: How many results at the buffer's front were passed to `finish`.
        self.finished = 0
        #: What the buffered results count for (`size` of each).
        self.held = 0
        self.ended = False
        self.stopping = False
        self.cond = threading.Condition()

    def stop(self) -> None:
        with self.cond:
            self.stopping = True
            self.buffer.clear()
            self.held = 0
            self.finished = 0
            self.cond.notify_all()


#: Channels whose thread is still running; stopped at interpreter exit. No
#: lock: a finalizer may run (and join a thread) wherever the garbage collector
#: does, and single set operations are atomic under the GIL.
_live: set[_Channel] = set()


@atexit.register
def _stop_all_at_exit() -> None:
    for channel in _live.copy():
        channel.stop()


#: Signals a scheduler sends to a whole job; see `block_job_signals`.
JOB_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})


def block_job_signals() -> None:
    """Blocks SIGTERM and SIGINT in the calling (non-main) thread.

    Worker processes are started from the threads that first pull their
    batches (this prefetch thread, or threads grain starts from it), and a
    new process starts with the signal mask of the thread that started it.
    A SIGTERM sent to the whole process group (SLURM's pre-emption notice)
    used to kill a worker that had not yet reached its `worker_init_fn`,
    which ignores the signal (3 of 19 runs): with the mask, the signal
    stays pending in a new worker until `ExitWithParent` ignores and then
    unblocks it. The process itself still gets the signal: the main thread
    does not block it.
    """
    signal.pthread_sigmask(signal.SIG_BLOCK, JOB_SIGNALS)


def _wait_for_room(
    channel: _Channel, finish: Callable[[Any], None] | None, finish_after: float
) -> bool:
    """Waits until the buffer has room, finishing buffered results meanwhile.

    A result is finished once the buffer has stayed full for `finish_after`
    seconds. Returns False when the prefetcher is stopping.
    """

    def room() -> bool:
        return channel.stopping or channel.held < channel.depth

    while True:
        with channel.cond:
            if channel.stopping:
                return False
            if channel.held < channel.depth:
                return True
            if finish is None or channel.finished >= len(channel.buffer):
                channel.cond.wait_for(room)
                continue
            if channel.cond.wait_for(room, timeout=finish_after):
                continue
            item = channel.buffer[channel.finished]
            channel.finished += 1
        if not isinstance(item, _Failure):
            finish(item)  # outside the lock: the consumer may take the item meanwhile


def _run(
    channel: _Channel,
    producer: Callable[[], Callable[[], Any] | None],
    finish: Callable[[Any], None] | None,
    finish_after: float,
) -> None:
    block_job_signals()
    try:
        while True:
            try:
                room = _wait_for_room(channel, finish, finish_after)
            except BaseException as error:  # noqa: BLE001 - a `finish` that broke its contract
                with channel.cond:
                    if not channel.stopping:
                        channel.buffer.append(_Failure(error))  # after the results it has
                    channel.cond.notify_all()
                return
            if not room:
                return
            produce = producer()
            if produce is None:  # the owner was collected: end the stream
                with channel.cond:
                    channel.ended = True
                    channel.cond.notify_all()
                return
            try:
                item: Any = produce()
            except StopIteration:
                item = None
            except BaseException as error:  # noqa: BLE001 - re-raised in the consumer
                item = _Failure(error)
            del produce  # hold the owner only while producing
            with channel.cond:
                if channel.stopping:
                    return
                if item is None:
                    channel.ended = True
                else:
                    channel.buffer.append(item)
                    if not isinstance(item, _Failure):
                        channel.held += channel.size(item)
                channel.cond.notify_all()
                if item is None or isinstance(item, _Failure):
                    return
    finally:
        _live.discard(channel)


def _weak_producer(produce: Callable[[], T]) -> Callable[[], Callable[[], T] | None]:
    """A bound method is held weakly (its object may go); anything else strongly."""
    if inspect.ismethod(produce):
        return weakref.WeakMethod(produce)
    return lambda: produce


class BackgroundPrefetcher(Generic[T]):
    """Runs a producer in a daemon thread, `depth` results ahead.

    Args:
      produce: Called repeatedly in the thread; StopIteration ends the stream.
        A bound method is held weakly: once its object is collected, the
        thread stops instead of keeping it alive.
      depth: Most results buffered ahead of the consumer (>= 1); the
        producer makes the next one while they count for fewer.
      name: Thread name, for debugging.
      size: What a result counts for (1 each by default; `len` for bundles).
      finish: Called in the thread on each buffered result, oldest first,
        once the buffer has stayed full for `finish_after` seconds (the
        consumer is slower than the producer); it must be safe to run while
        the consumer takes and uses the same result, and should not raise:
        an error it raises ends the stream, after the results buffered.
      finish_after: Seconds the buffer stays full before `finish` is called.
    """

    def __init__(
        self,
        produce: Callable[[], T],
        depth: int,
        name: str = "xlstm-data-prefetch",
        size: Callable[[T], int] = lambda _: 1,
        finish: Callable[[T], None] | None = None,
        finish_after: float = 0.0,
    ):
        if depth < 1:
            raise ValueError(f"prefetch depth must be >= 1, got {depth}")
        self._channel = _Channel(depth, size)
        self._thread = threading.Thread(
            target=_run,
            args=(self._channel, _weak_producer(produce), finish, finish_after),
            name=name,
            daemon=True,
        )
        _live.add(self._channel)
        self._thread.start()
        # Dropped without stop(): wake the thread so it ends (without joining).
        weakref.finalize(self, self._channel.stop)

    def get(self) -> T:
        """Returns the next result; raises StopIteration at the end of the stream.

        A producer error is raised by this and every later call: the thread
        has ended, and a retry must not wait for it.
        """
        channel = self._channel
        with channel.cond:
            channel.cond.wait_for(lambda: channel.buffer or channel.ended or channel.stopping)
            if not channel.buffer:
                if channel.stopping:
                    raise RuntimeError("the prefetcher was stopped")
                raise StopIteration
            item = channel.buffer[0]
            if isinstance(item, _Failure):  # kept: every later get raises it again
                raise item.error
            channel.buffer.popleft()
            channel.finished = max(channel.finished - 1, 0)
            channel.held -= channel.size(item)
            channel.cond.notify_all()
        return item

    def peek(self) -> T | None:
        """Waits for the next result and returns it without consuming it.

        Returns None at the end of the stream; re-raises a producer error.
        """
        channel = self._channel
        with channel.cond:
            channel.cond.wait_for(lambda: channel.buffer or channel.ended or channel.stopping)
            item = channel.buffer[0] if channel.buffer else None
        if isinstance(item, _Failure):
            raise item.error
        return item

    def stop(self) -> None:
        """Stops the thread after its current `produce()` or `finish` call; drops the buffer."""
        self._channel.stop()
        if self._thread is not threading.current_thread():
            self._thread.join()

    @property
    def thread(self) -> threading.Thread:
        """The producer thread (for tests and debugging)."""
        return self._thread
