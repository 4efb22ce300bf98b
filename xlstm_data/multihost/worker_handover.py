"""Worker processes that start without making the training loop wait.

Starting grain's worker processes takes seconds (spawn, importing grain,
JAX and orbax, the first batch), and stopping them a third of one. Every
restart of a pipeline with workers paid both while the loop waited: an
online mixture update (`set_mixture`), a restore, every eval pass. Measured
in `bench/plan_mixture`: `set_mixture` every 50 steps of 0.1 s cost the loop
21.6 % with 2 workers, against 0.14 % without.

`WorkerHandover` serves the steps of a restarted pipeline in this process
while the new workers start in a helper thread, and hands over to them once
they have caught up with the steps served here: no fixed number of steps
served here can cover a start whose length depends on the machine and its
load. With the first 16 steps served here, 2 workers took 2.8-4.3 s to
deliver their first chunk on the 2-core VM (importing grain alone took
1.2-2 s per process), and the loop waited 1-2 s after every update (37.8 %
of the bench's loop). The workers begin at a fixed step; the helper thread
drops the chunks they made for steps already served here while this process
serves on, so the data is the same as without them. Once the workers are
up, this process serves at most `workers_from` more chunks: a loop that asks
for data as fast as this process makes it would otherwise never let workers
no faster than it catch up. The old workers are stopped in a background
thread, not a daemon: the interpreter waits for it at exit, so no worker or
shared-memory segment outlives the process.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from concurrent import futures
from typing import Any

from absl import logging

from xlstm_data.multihost.prefetch import block_job_signals
from xlstm_data.multihost.shared_slots import SlotRing, give_back


class WorkerHandover:
    """Elements from `in_process` until the workers catch up, then from the workers.

    Every host pipeline is one, with or without workers, so the iterator
    closes them all alike.

    Args:
      in_process: Iterator of the pipeline's elements from the first (all of
        them), computed in this process; its end is the stream's end. None:
        the workers' elements only.
      workers: The workers' pipeline, whose first element is element
        `workers_from` of `in_process`'s, or None. Its iterator is made and
        its first element requested at once, in a helper thread that blocks
        the job's signals (`block_job_signals`), which starts the worker
        processes.
      slots: The shared-memory slots the workers' chunks arrive in
        (`shared_slots.SlotRing`), or None. A worker waiting for a slot is
        released before the workers are asked to stop (else it would not see
        grain's request until grain killed it), and the slots are unlinked
        once the workers are gone.
      workers_from: Elements served in process at least (the workers' first
        is the next one).
    """

    def __init__(
        self,
        in_process: Iterator[Any] | None,
        workers: Iterable[Any] | None = None,
        slots: SlotRing | None = None,
        workers_from: int = 0,
    ):
        self._slots = slots
        self._in_process = in_process
        self._workers: Iterator[Any] | None = None
        self._first: futures.Future | None = None
        self._workers_from = workers_from
        #: Elements handed out so far (read by the helper thread).
        self._served = 0
        self._closing = False
        #: Set by the helper once the workers' first element is there.
        self._workers_up = threading.Event()
        #: Elements served when the consumer first saw the workers up.
        self._served_when_up: int | None = None
        if in_process is None and workers_from:
            raise ValueError("workers_from counts elements served in process; there are none")
        if workers is not None:
            starter = futures.ThreadPoolExecutor(1, thread_name_prefix="xlstm-data-workers")
            self._first = starter.submit(self._start, workers)
            starter.shutdown(wait=False)

    def _start(self, workers: Iterable[Any]) -> tuple[int, Any]:
        """The workers' first element not yet served here, and its index (helper thread).

        The chunks the workers made for steps served here meanwhile are
        dropped here, beside the loop: a catch-up in the loop's thread would
        make it wait as long as the workers took to start.
        """
        block_job_signals()
        self._workers = iter(workers)
        index, element = self._workers_from, next(self._workers)
        self._workers_up.set()
        while index < self._served and not self._closing:  # `_served` only grows
            give_back(element)  # dropped unread
            index, element = index + 1, next(self._workers)
        return index, element

    def __iter__(self) -> WorkerHandover:
        return self

    def _serve_here(self) -> bool:
        """Whether the next element is computed in this process.

        While the workers start, always. Once they are up, for at most
        `workers_from` more elements while the helper catches up: where the
        loop asks for data as fast as this process makes it, workers no
        faster than this process would never catch up, and both would compute
        every step while only this process's were used. The loop then waits
        for the rest of the catch-up.
        """
        if self._in_process is None:
            return False
        if self._first is None or self._served < self._workers_from:
            return True
        if self._first.done():
            return False
        if not self._workers_up.is_set():
            return True
        if self._served_when_up is None:
            self._served_when_up = self._served
        return self._served < self._served_when_up + max(self._workers_from, 1)

    def __next__(self) -> Any:
        if self._serve_here():
            element = next(self._in_process)  # its end is the stream's end
            self._served += 1
            return element
        if self._first is not None:
            self._close_in_process()
            first, self._first = self._first, None
            index, element = first.result()  # raises what the workers raised
            dropped = index - self._workers_from
            while index < self._served:  # served here since the helper caught up
                give_back(element)  # dropped unread
                index, element = index + 1, next(self._workers)
                dropped += 1
            if dropped:
                logging.info("dropped %d chunks the workers made while they started", dropped)
            self._served += 1
            return element
        if self._workers is None:  # in process only, and it ended
            raise StopIteration
        self._served += 1
        return next(self._workers)

    def close(self) -> None:
        """Stops the workers and waits until they are gone."""
        self._closing = True
        self._close_in_process()
        first, self._first = self._first, None
        self._close_workers(first)

    def close_in_background(self) -> None:
        """Stops the workers in a background thread (a restart need not wait for it)."""
        self._closing = True
        self._close_in_process()
        first, self._first = self._first, None
        if first is None and self._workers is None:
            self._release_shared()
            return
        threading.Thread(
            target=self._close_workers, args=(first,), name="xlstm-data-close-workers"
        ).start()

    def _close_workers(self, first: futures.Future | None) -> None:
        """Closes the workers once started (grain's iterator is not thread-safe)."""
        try:
            if self._slots is not None:
                self._slots.release_waiting()
            if first is not None:
                futures.wait([first])
            if self._workers is not None:  # set by the starter thread, read after it
                self._workers.close()
        except Exception as error:  # noqa: BLE001 - a background close must not kill the thread
            logging.warning("closing grain workers in the background failed: %s", error)
        finally:
            self._release_shared()

    def _release_shared(self) -> None:
        slots, self._slots = self._slots, None
        if slots is not None:
            slots.close()

    def _close_in_process(self) -> None:
        close = getattr(self._in_process, "close", None)
        if close is not None:
            close()
        self._in_process = None
