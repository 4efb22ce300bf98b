"""A bounded background buffer that keeps the next batches ready.

A producer thread calls `produce()` until it raises StopIteration, keeping at
most `depth` results ahead of the consumer. Errors in the thread are re-raised
in the consumer at the position where they happened, never swallowed.

Threads still running at interpreter exit are stopped by an `atexit` hook:
a daemon thread frozen inside XLA's native code during finalisation aborts
the process, so an iterator the caller forgot to close must not do that.
"""

from __future__ import annotations

import atexit
import collections
import threading
import weakref
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class _Failure:
    def __init__(self, error: BaseException):
        self.error = error


_running: weakref.WeakSet[BackgroundPrefetcher] = weakref.WeakSet()


@atexit.register
def _stop_all_at_exit() -> None:
    for prefetcher in list(_running):
        prefetcher.stop()


class BackgroundPrefetcher(Generic[T]):
    """Runs a producer in a daemon thread, `depth` results ahead.

    Args:
      produce: Called repeatedly in the thread; StopIteration ends the stream.
      depth: Most results buffered ahead of the consumer (>= 1).
      name: Thread name, for debugging.
    """

    def __init__(self, produce: Callable[[], T], depth: int, name: str = "xlstm-data-prefetch"):
        if depth < 1:
            raise ValueError(f"prefetch depth must be >= 1, got {depth}")
        self._produce = produce
        self._depth = depth
        self._buffer: collections.deque[T | _Failure] = collections.deque()
        self._ended = False
        self._stopping = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        _running.add(self)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._stopping or len(self._buffer) < self._depth)
                if self._stopping:
                    return
            try:
                item: T | _Failure = self._produce()
            except StopIteration:
                item = None  # type: ignore[assignment]
            except BaseException as error:  # noqa: BLE001 - re-raised in the consumer
                item = _Failure(error)
            with self._cond:
                if self._stopping:
                    return
                if item is None:
                    self._ended = True
                else:
                    self._buffer.append(item)
                self._cond.notify_all()
                if item is None or isinstance(item, _Failure):
                    return

    def get(self) -> T:
        """Returns the next result; raises StopIteration at the end of the stream."""
        with self._cond:
            self._cond.wait_for(lambda: self._buffer or self._ended)
            if not self._buffer:
                raise StopIteration
            item = self._buffer.popleft()
            self._cond.notify_all()
        if isinstance(item, _Failure):
            raise item.error
        return item

    def peek(self) -> T | None:
        """Waits for the next result and returns it without consuming it.

        Returns None at the end of the stream; re-raises a producer error.
        """
        with self._cond:
            self._cond.wait_for(lambda: self._buffer or self._ended)
            item = self._buffer[0] if self._buffer else None
        if isinstance(item, _Failure):
            raise item.error
        return item

    def wait_filled(self) -> tuple[int, bool]:
        """Waits until the buffer is full or the stream ended.

        Returns:
          `(buffered, ended)`: results ready to `get`, and whether the producer
          has finished (so no result beyond them will come).
        """
        with self._cond:
            self._cond.wait_for(
                lambda: (
                    self._ended
                    or len(self._buffer) >= self._depth
                    or any(isinstance(i, _Failure) for i in self._buffer)
                )
            )
            failed = any(isinstance(i, _Failure) for i in self._buffer)
            return len(self._buffer), self._ended or failed

    def stop(self) -> None:
        """Stops the thread after its current `produce()` call and drops the buffer."""
        with self._cond:
            self._stopping = True
            self._buffer.clear()
            self._cond.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join()
        _running.discard(self)
