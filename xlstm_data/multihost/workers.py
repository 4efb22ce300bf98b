"""grain worker processes that work from plain scripts and never outlive their parent.

Workers compute whole steps of the plan (`PlannedBatchDataset`), so their
number changes speed, never data. Every pipeline this library runs in worker
processes goes through `prefetch_in_workers`, which makes grain's workers
usable from a plain Python script (not only inside an absl app), refuses a
script that would re-run itself in every worker, and ties each worker's life
to the process that started it, so a killed training job leaves no orphans.
"""

from __future__ import annotations

import ast
import functools
import multiprocessing
import multiprocessing.resource_tracker
import os
import signal
import sys
import threading
import time
from typing import Any

import grain
import jax
import numpy as np
from absl import flags, logging

from xlstm_data.errors import DataConfigError
from xlstm_data.multihost import shared_slots
from xlstm_data.reading.row_assembly import aligned_copy

#: Seconds between a worker's checks that the process that started it is alive.
PARENT_CHECK_INTERVAL_S = 0.5

#: Arrays at least this large leave a worker in shared memory, smaller ones are
#: pickled through its pipe. The pipe is cheaper for small arrays (2-3x less
#: main-process CPU than grain's create, map and unlink per array), but what
#: a worker has buffered must fit in the pipe (64 KiB on Linux): when grain
#: stops a worker it stops reading, and a worker whose queue feeder thread
#: still holds elements blocks at exit until grain kills it 25 s later. At
#: 256 KiB this stalled a restart (`set_mixture`, `set_state`, an eval pass)
#: for 25 s in one of three (py-spy: `Queue._finalize_join`). At 8 KiB, 4
#: buffered elements of a few small arrays stay well under 64 KiB; a planned
#: step's fields are one array, so one segment per step.
MIN_SHARED_MEMORY_BYTES = 8 * 1024


def allow_grain_flag_reads() -> None:
    """Lets grain read its absl flags when the program never parsed them.

    grain's worker start-up reads one of its absl flags directly (worker
    profiling, whenever a profiler such as JAX's is loaded), and absl raises
    `UnparsedFlagAccessError` for any flag read before `FLAGS(argv)`. That flag
    is not one of grain's `grain.config` options, so `grain.config.update`
    cannot set it; the read also happens lazily, in grain's own threads, so
    marking flags parsed only around our calls would not cover it. Flags are
    therefore marked parsed (all keep their defaults) only if nothing parsed
    them: inside an absl app this does nothing, and a later `app.run` or
    `FLAGS(argv)` still parses the command line as usual.
    """
    if not flags.FLAGS.is_parsed():
        logging.info("absl flags were not parsed; marking them parsed (defaults) for grain workers")
        flags.FLAGS.mark_as_parsed()


class ExitWithParent:
    """grain `worker_init_fn` that ends the worker as soon as its parent is gone.

    It also makes the worker ignore SIGTERM and SIGINT, which a scheduler sends
    to every process of a job: the parent handles the pre-emption and saves.

    grain's workers stop only when their parent asks them to, so a parent
    killed with SIGKILL (pre-emption, OOM killer) left them running for
    minutes, each holding its pipeline's memory, and with them the
    multiprocessing resource tracker, which exits only once every process
    sharing it has. Each worker therefore starts a daemon thread that checks
    every `PARENT_CHECK_INTERVAL_S` whether its parent process changed (a
    re-parented orphan's parent is init or a subreaper) and then exits at once;
    the resource tracker then sees its last user go, unlinks any shared memory
    left over and exits too.

    Linux's `prctl(PR_SET_PDEATHSIG)` is not used: it fires when the *thread*
    that started the worker exits, and grain starts workers from short-lived
    threads of its own (interleave's iterator-making pool), which would kill
    healthy workers. Polling works on every POSIX system and costs one
    `getppid` call per interval.

    The parent's pid is taken when grain pickles this object to start a
    worker, i.e. in the process that starts it, not where the dataset was
    built.
    """

    def __init__(self, interval_s: float = PARENT_CHECK_INTERVAL_S):
        self.interval_s = interval_s
        self.parent_pid = os.getpid()

    def __getstate__(self) -> dict[str, Any]:
        return {"interval_s": self.interval_s, "parent_pid": os.getpid()}

    def __call__(self, worker_index: int, worker_count: int) -> None:
        del worker_count
        shared_slots.enter_worker(worker_index)
        # A scheduler's pre-emption notice goes to the whole process group (SLURM,
        # `kill -TERM -PGID`): workers must outlive it so the parent can read its
        # batches up to the agreed step and save it. grain stops its workers
        # without signals; this thread ends them if the parent is gone.
        for signum in (signal.SIGTERM, signal.SIGINT):
            try:
                signal.signal(signum, signal.SIG_IGN)
            except ValueError:  # not the worker's main thread
                logging.warning("grain worker %d keeps the default %s handler", os.getpid(), signum)
        # Started with them blocked (`prefetch.block_job_signals`): one sent to the job
        # meanwhile was pending, and is dropped now that they are ignored.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT})
        threading.Thread(
            target=_exit_when_parent_changes,
            args=(self.parent_pid, self.interval_s),
            name="xlstm-data-watch-parent",
            daemon=True,
        ).start()


def _exit_when_parent_changes(parent_pid: int, interval_s: float) -> None:
    while os.getppid() == parent_pid:
        time.sleep(interval_s)
    logging.warning("parent process %d is gone; grain worker %d exits", parent_pid, os.getpid())
    os._exit(1)


def _min_shm_size_set_by_user(dataset: grain.IterDataset) -> bool:
    pending = [dataset]
    while pending:
        node = pending.pop()
        if isinstance(node, grain.experimental.WithOptionsIterDataset) and (
            node.options.min_shm_size
        ):
            return True
        pending.extend(getattr(node, "parents", ()))
    return False


@functools.cache
def _script_without_main_guard() -> str | None:
    """The path of the `__main__` script if it has no `if __name__ == "__main__":` block.

    grain starts its workers with the spawn method, which imports the main
    script again in every worker: without the guard each worker re-runs the
    whole script (building iterators, training), and a script that started
    workers at import hung forever. Not a file (an interactive session, a
    notebook, `python -c`): None.
    """
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    if not path or not path.endswith(".py") or not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as file:
            tree = ast.parse(file.read(), path)
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None
    for node in tree.body:
        if isinstance(node, ast.If) and "__name__" in ast.unparse(node.test):
            return None
    return path


def check_main_guard(worker_count: int) -> None:
    """Refuses workers when the main script would re-run in each of them."""
    path = _script_without_main_guard() if worker_count > 0 else None
    if path is not None and multiprocessing.parent_process() is None:
        raise DataConfigError(
            f"worker_count={worker_count} starts worker processes, which import the main "
            f'script {path} again and, as it has no `if __name__ == "__main__":` block, '
            "would re-run all of it in every worker; put the code that builds the iterators "
            "and trains under that guard, or set worker_count=0 (data.worker_count=0)"
        )


def prefetch_in_workers(
    dataset: grain.IterDataset, options: grain.MultiprocessingOptions
) -> grain.IterDataset:
    """`dataset.mp_prefetch(options)`, usable outside absl apps and orphan-free.

    See `allow_grain_flag_reads` and `ExitWithParent`. Elements arrive in
    this process's memory (`_owned`). Arrays smaller than
    `MIN_SHARED_MEMORY_BYTES` are pickled through the worker's pipe instead of
    grain's default shared memory (unless the pipeline sets `min_shm_size`
    itself), see there.
    """
    if options.num_workers == 0:
        return dataset
    return _shared_memory_prefetch(dataset, options).map(_owned)


def _shared_memory_prefetch(
    dataset: grain.IterDataset, options: grain.MultiprocessingOptions
) -> grain.IterDataset:
    """`prefetch_in_workers` before the copy out of shared memory."""
    check_main_guard(options.num_workers)
    allow_grain_flag_reads()
    # Started here, in the thread building the pipeline: multiprocessing starts
    # its resource tracker on first use and then *unblocks* SIGTERM and SIGINT
    # in the thread that started it. Left to a grain thread, that thread then
    # spawned a worker that a group SIGTERM killed before it could ignore the
    # signal (every run with worker_buffer_size=1, see `block_job_signals`).
    multiprocessing.resource_tracker.ensure_running()
    if not _min_shm_size_set_by_user(dataset):
        dataset = grain.experimental.WithOptionsIterDataset(
            dataset, grain.experimental.DatasetOptions(min_shm_size=MIN_SHARED_MEMORY_BYTES)
        )
    dataset = dataset.map(_contiguous_arrays)
    return dataset.mp_prefetch(options, worker_init_fn=ExitWithParent())


def _contiguous_arrays(element: Any) -> Any:
    """`element` with every array C-contiguous, so grain can put it in shared memory.

    grain pickles a non-contiguous array through the worker's pipe whatever
    its size. A step that was a slice of a block of several steps went
    through the pipe (344 KB a step), and a worker stopped with one in its
    queue blocked at exit for 25 s (py-spy: `Queue._finalize_join`), past
    JAX's shutdown barrier on the other host.
    """
    return jax.tree.map(
        lambda leaf: np.ascontiguousarray(leaf) if isinstance(leaf, np.ndarray) else leaf, element
    )


def _owned(element: Any) -> Any:
    """`element` with arrays in this process's memory instead of a worker's shared memory.

    grain unlinks a shared-memory segment when its array is deleted. A device
    array made from it without a copy (CPU devices) kept it alive, and one
    still alive at interpreter exit was deleted after numpy's module was torn
    down: the segment leaked (the resource tracker warns). So did a chunk of
    steps (`PlannedChunkDataset`) whose later steps a restart left unread.
    Copied on arrival, before anything holds a view of it: one copy of an
    element (1.8 MB at 32 x 2048) is small against computing it. The copy
    (`aligned_copy`) is aligned as the main process's own blocks are, so a
    CPU device uses it in place.
    """
    return jax.tree.map(lambda leaf: aligned_copy(leaf) if _shared(leaf) else leaf, element)


def _shared(leaf: Any) -> bool:
    return isinstance(leaf, np.ndarray) and type(leaf) is not np.ndarray  # grain's subclass
