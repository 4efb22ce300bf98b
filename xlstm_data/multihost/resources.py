"""What a data iterator must release: its prefetch thread and its host pipeline.

Kept apart from the iterator so that a finalizer can release them after the
iterator itself is gone, and an `atexit` hook at interpreter exit. The hook
runs before multiprocessing's own (this module imports `multiprocessing.util`
first), so worker processes and their shared memory are gone before the
resource tracker counts leaks.
"""

from __future__ import annotations

import atexit
import multiprocessing.util  # noqa: F401 - imported first, so its atexit hook runs after ours
import threading
from typing import Any

from absl import logging

from xlstm_data.multihost.prefetch import BackgroundPrefetcher
from xlstm_data.multihost.worker_handover import WorkerHandover


class IteratorClosedError(RuntimeError):
    """`next()` (or a restart) on a data iterator after `close()`."""


class IteratorResources:
    """The prefetch thread and the host pipeline of one iterator.

    Attributes:
      prefetcher: The background thread preparing global batches, or None.
      pipeline: The host pipeline (with any worker processes), or None.
    """

    def __init__(self) -> None:
        self.prefetcher: BackgroundPrefetcher[Any] | None = None
        self.pipeline: WorkerHandover | None = None
        #: One release at a time: a background one may still run at exit.
        self._releasing = threading.Lock()
        _open.add(self)

    def stop_prefetch(self) -> None:
        if self.prefetcher is not None:
            self.prefetcher.stop()
            self.prefetcher = None

    def replace_pipeline(self, pipeline: WorkerHandover) -> None:
        """Installs a new host pipeline; the old one's workers stop in the background.

        The new pipeline need not wait for them (a third of a second per
        restart, measured in `bench/plan_mixture`).
        """
        self.stop_prefetch()
        if self.pipeline is not None:
            self.pipeline.close_in_background()
        self.pipeline = pipeline

    def release(self) -> None:
        """Stops the thread and the workers, waiting until they are gone."""
        with self._releasing:
            self.stop_prefetch()
            if self.pipeline is not None:
                self.pipeline.close()
                self.pipeline = None
            _open.discard(self)

    def release_in_background(self) -> None:
        """`release` in a new thread: what an iterator's finalizer does.

        A finalizer runs wherever the garbage collector does: in any thread,
        which may hold a lock the prefetch thread needs before it can stop
        (a logging handler's, a source's). Waiting for that thread there
        could wait forever, so the wait happens elsewhere.
        """
        try:
            threading.Thread(target=self.release, name="xlstm-data-release", daemon=True).start()
        except RuntimeError as error:  # no new threads while the interpreter exits
            logging.warning("a dropped data iterator could not be released: %s", error)


#: Resources of iterators not yet released; released at exit. No lock: it
#: changes in several threads (closing, releasing in the background), and
#: single set operations are atomic under the GIL.
_open: set[IteratorResources] = set()


@atexit.register
def _release_all_at_exit() -> None:
    for resources in _open.copy():
        try:
            resources.release()
        except Exception as error:  # noqa: BLE001 - exiting anyway; release the others
            logging.warning("releasing a data iterator at exit failed: %s", error)
