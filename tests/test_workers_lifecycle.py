"""Worker processes and prefetch threads start, stop and go away cleanly.

The worker tests run real scripts in fresh interpreters: pytest's conftest
marks absl flags parsed, which would hide a script's `UnparsedFlagAccessError`,
and orphaned processes or leaked shared memory show only when a process
really exits or is killed.
"""

from __future__ import annotations

import gc
import itertools
import select
import signal
import subprocess
import sys
import textwrap
import threading
import time
import weakref
from pathlib import Path

import grain
import numpy as np
import psutil
import pytest

import xlstm_data as xd
from tests.helpers import unique_token_docs
from tests.multiprocess import subprocess_env
from xlstm_data.multihost.prefetch import BackgroundPrefetcher
from xlstm_data.multihost.resources import IteratorClosedError

SCRIPT_TIMEOUT_S = 120
#: The bound on how long orphans may outlive their killed parent.
ORPHAN_GRACE_S = 10

#: A user's plain script: no absl app, no flag parsing, only the `__main__` guard.
PLAIN_SCRIPT = """
import numpy as np
import xlstm_data as xd

if __name__ == "__main__":
    mesh = xd.create_mesh()
    docs = [{"tokens": np.arange(10, 13 + i % 7, dtype=np.int32)} for i in range(64)]
    # worker_count=1 is the default; steps of 32 x 2048 tokens are computed in
    # the worker and big enough to cross in shared memory.
    endless = xd.make_grain_llm_iterator(
        None, None, mesh, [{"tokens": np.arange(10, 3000, dtype=np.int32)}] * 64, 32, 2048,
        True, 0, grain_packing=True,
    )
    # Two workers on a finite run: every step exactly once, in order.
    finite = xd.make_grain_llm_iterator(
        None, None, mesh, docs, 4, 8, False, 0, num_epochs=1, worker_count=2, grain_packing=True
    )
    shapes = [next(endless).inputs.shape for _ in range(3)]
    rows = sum(1 for _ in finite)
    finite.close()
    print("OK", shapes[-1], rows > 0, flush=True)
    # `endless` is left open on purpose: exit must release it too.
"""

#: A user's absl app with its own flag: our iterator must not disturb it.
ABSL_APP_SCRIPT = """
import numpy as np
from absl import app, flags
import xlstm_data as xd

STEPS = flags.DEFINE_integer("steps", 1, "batches to read")

def main(argv):
    del argv
    mesh = xd.create_mesh()
    docs = [{"tokens": np.arange(10, 20, dtype=np.int32)} for _ in range(32)]
    iterator = xd.make_grain_llm_iterator(None, None, mesh, docs, 4, 8, True, 0, worker_count=2)
    shapes = [next(iterator).inputs.shape for _ in range(STEPS.value)]
    iterator.close()
    print("OK", STEPS.value, len(shapes), flush=True)

if __name__ == "__main__":
    app.run(main)
"""

#: Iterates a two-worker iterator, says so, then waits to be killed.
KILLED_SCRIPT = """
import time
import numpy as np
import xlstm_data as xd

if __name__ == "__main__":
    mesh = xd.create_mesh()
    # Enough steps after those computed here for a chunk of steps per worker.
    docs = [{"tokens": np.arange(10, 20 + i % 5, dtype=np.int32)} for i in range(640)]
    iterator = xd.make_grain_llm_iterator(None, None, mesh, docs, 4, 8, True, 0, worker_count=2)
    for _ in range(40):  # past the chunk of 16 steps computed here while the workers start
        next(iterator)
    print("READY", flush=True)
    time.sleep(300)
"""


#: A SIGTERM to the whole process group, as SLURM sends a pre-emption notice: the
#: parent handles it (JAX's preemption service in `train`); its workers must live on.
GROUP_SIGTERM_SCRIPT = """
import os, signal
import xlstm_data as xd

if __name__ == "__main__":
    mesh = xd.create_mesh()
    source = xd.sources.SyntheticSource(num_documents=2000, mean_length=100)
    iterator = xd.make_grain_llm_iterator(
        None, None, mesh, source, 8, 64, True, 0, worker_count=2, grain_packing=True
    )
    next(iterator)
    signal.signal(signal.SIGTERM, lambda *_: print("parent got SIGTERM", flush=True))
    os.killpg(0, signal.SIGTERM)
    for _ in range(60):
        next(iterator)
    iterator.close()
    print("60 batches after the signal")
"""


#: Restarts workers 8 times and sends SIGTERM to the whole group while each
#: set starts (the window before a worker ignores it), then reads on.
SIGTERM_AT_START_SCRIPT = """
import os, signal, threading, time
import numpy as np
import xlstm_data as xd

DATA = {
    "train": {"a": {"kind": "synthetic", "num_documents": 400, "mean_length": 60}},
    "global_batch_size": 8, "max_target_length": 64, "worker_count": 2,
}

if __name__ == "__main__":
    signals = []
    signal.signal(signal.SIGTERM, lambda *_: signals.append(1))
    mesh = xd.create_mesh()
    reference, _ = xd.iterators_from_config(dict(DATA, worker_count=0), mesh)
    expected = [np.asarray(next(reference).inputs) for _ in range(40)]
    reference.close()
    train, _ = xd.iterators_from_config(DATA, mesh)
    start = train.get_state()
    for round in range(4):
        train.set_state(start)  # new workers start now, in a background thread
        train.start_prefetch()
        for _ in range(8):  # the group signal, again and again while they start
            os.killpg(0, signal.SIGTERM)
            time.sleep(0.02)
        for step in range(40):
            assert np.array_equal(np.asarray(next(train).inputs), expected[step]), (round, step)
    train.close()
    print("rounds 4, signals", len(signals))
"""


#: A plain script without the `__main__` guard that asks for workers.
GUARDLESS_SCRIPT = """
import xlstm_data as xd

data = {
    "train": {"a": {"kind": "synthetic", "num_documents": 400}},
    "global_batch_size": 8, "max_target_length": 64, "worker_count": 2,
}
train, _ = xd.iterators_from_config(data, xd.create_mesh())
print("batch", next(train).inputs.shape)
"""


def _run_script(
    tmp_path: Path, source: str, *args: str, own_group: bool = False
) -> subprocess.CompletedProcess:
    script = tmp_path / "user_script.py"
    script.write_text(textwrap.dedent(source))
    return subprocess.run(
        [sys.executable, str(script), *args],
        env=subprocess_env(),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=SCRIPT_TIMEOUT_S,
        start_new_session=own_group,
    )


def _assert_clean_run(result: subprocess.CompletedProcess) -> str:
    report = f"rc={result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr[-5000:]}"
    assert result.returncode == 0, report
    assert "UnparsedFlagAccessError" not in result.stderr, report
    assert "leaked shared_memory" not in result.stderr, report
    return result.stdout


def test_workers_run_in_a_plain_script_and_exit_leaves_no_shared_memory(tmp_path):
    out = _assert_clean_run(_run_script(tmp_path, PLAIN_SCRIPT))
    assert "OK (32, 2048) True" in out


def test_workers_survive_a_sigterm_to_the_process_group(tmp_path):
    out = _assert_clean_run(_run_script(tmp_path, GROUP_SIGTERM_SCRIPT, own_group=True))
    assert "parent got SIGTERM" in out and "60 batches after the signal" in out


def test_workers_starting_while_the_group_gets_sigterm_survive(tmp_path):
    """The race of `test_workers_survive_a_sigterm_to_the_process_group`, hit 32 times.

    Each round restarts the workers and signals the group 8 times while they
    start; a worker killed before its `worker_init_fn` would end the run with
    "terminated unexpectedly" (it did in 3 of 19 runs with one signal each).
    Every round starts 2 worker processes: 8 rounds cost 55 s of CPU here.
    """
    out = _assert_clean_run(_run_script(tmp_path, SIGTERM_AT_START_SCRIPT, own_group=True))
    assert "rounds 4, signals 32" in out


def test_a_script_without_the_main_guard_is_refused_before_any_worker_starts(tmp_path):
    result = _run_script(tmp_path, GUARDLESS_SCRIPT)
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert "worker_count=2 starts worker processes" in last, result.stderr[-3000:]
    assert 'no `if __name__ == "__main__":` block' in last and "worker_count=0" in last
    assert "batch" not in result.stdout  # neither the script nor a worker re-running it trained


def test_workers_leave_an_absl_apps_flags_alone(tmp_path):
    out = _assert_clean_run(_run_script(tmp_path, ABSL_APP_SCRIPT, "--steps=3"))
    assert "OK 3 3" in out


def _read_line(proc: subprocess.Popen, timeout: float) -> str:
    """One line of the child's stdout, or '' if none came in `timeout` seconds."""
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    return proc.stdout.readline() if ready else ""


def _children_and_commands(pid: int) -> tuple[list[psutil.Process], list[str]]:
    """`pid`'s descendants and their command lines (a process gone meanwhile is left out)."""
    children, commands = [], []
    for child in psutil.Process(pid).children(recursive=True):
        try:
            commands.append(" ".join(child.cmdline()))
        except psutil.NoSuchProcess:
            continue
        children.append(child)
    return children, commands


def _alive(processes: list[psutil.Process]) -> list[psutil.Process]:
    alive = []
    for process in processes:
        try:
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                alive.append(process)
        except psutil.NoSuchProcess:
            pass
    return alive


def test_killed_parent_leaves_no_worker_or_resource_tracker(tmp_path):
    script = tmp_path / "killed.py"
    script.write_text(textwrap.dedent(KILLED_SCRIPT))
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        env=subprocess_env(),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    children: list[psutil.Process] = []
    try:
        line = _read_line(proc, SCRIPT_TIMEOUT_S)
        assert line.strip() == "READY", f"script did not get ready (rc={proc.poll()})"
        # The 40 steps may all be computed in the script's own process while its
        # workers start (`WorkerHandover` serves them there until the workers are
        # up), so READY can come before the second worker exists: wait for both.
        deadline = time.monotonic() + SCRIPT_TIMEOUT_S
        while True:
            children, commands = _children_and_commands(proc.pid)
            if sum("spawn_main" in c for c in commands) == 2 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert sum("spawn_main" in c for c in commands) == 2, commands
        assert sum("resource_tracker" in c for c in commands) == 1, commands
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
        deadline = time.monotonic() + ORPHAN_GRACE_S
        while _alive(children) and time.monotonic() < deadline:
            time.sleep(0.2)
        survivors = [" ".join(p.cmdline()) for p in _alive(children)]
        assert not survivors, f"still alive {ORPHAN_GRACE_S} s after SIGKILL: {survivors}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        for child in _alive(children):
            child.kill()


# Threads (in-process) ---------------------------------------------------------


@pytest.fixture(scope="module")
def mesh():
    return xd.create_mesh()


def _iterator(mesh):
    docs = unique_token_docs(range(1, 40))
    return xd.make_grain_llm_iterator(None, None, mesh, docs, 4, 8, True, 0, worker_count=0)


def _new_threads(before: set[threading.Thread]) -> list[str]:
    return [t.name for t in threading.enumerate() if t not in before and t.is_alive()]


def test_dropped_iterators_release_their_threads(mesh):
    before = set(threading.enumerate())
    refs = []
    for _ in range(5):
        iterator = _iterator(mesh)
        next(iterator)
        assert iterator._resources.prefetcher.thread.is_alive()
        refs.append(weakref.ref(iterator))
    del iterator
    deadline = time.monotonic() + 10
    while (_new_threads(before) or any(r() for r in refs)) and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.05)
    assert not any(r() for r in refs), "a dropped iterator was not collected"
    assert not _new_threads(before)


class _GatedDocuments:
    """Documents whose reads wait while the gate is shut, as for a lock another thread holds."""

    def __init__(self, docs):
        self.docs = docs
        self.cond = threading.Condition()
        self.shut = False
        self.waiting = 0

    def __len__(self):
        return len(self.docs)

    def __getitem__(self, index):
        with self.cond:
            self.waiting += 1
            self.cond.notify_all()
            self.cond.wait_for(lambda: not self.shut)
            self.waiting -= 1
        return self.docs[index]

    def set_shut(self, shut: bool) -> None:
        with self.cond:
            self.shut = shut
            self.cond.notify_all()


def _take_until_it_fails(iterator) -> None:
    try:
        while True:
            next(iterator)
    except Exception:  # noqa: BLE001 - stopped by the release; nothing to report
        pass


def test_a_finalizer_run_while_the_prefetch_thread_waits_on_the_finalizing_thread(mesh):
    """The collector may finalize a dropped iterator in a thread holding what its
    prefetch thread waits for (here a read a gate holds): the finalizer returns,
    and the release ends once the gate opens."""
    docs = _GatedDocuments(unique_token_docs(range(1, 40)))
    iterator = xd.make_grain_llm_iterator(None, None, mesh, docs, 4, 8, True, 0, worker_count=0)
    next(iterator)
    producer = iterator._resources.prefetcher.thread
    docs.set_shut(True)
    try:
        threading.Thread(target=_take_until_it_fails, args=(iterator,), daemon=True).start()
        with docs.cond:
            assert docs.cond.wait_for(lambda: docs.waiting > 0, timeout=30)
        finalizing = threading.Thread(target=iterator._finalizer, daemon=True)
        finalizing.start()  # what the collector calls once the iterator is unreachable
        finalizing.join(5)
        assert not finalizing.is_alive(), "the finalizer waited for the blocked prefetch thread"
        assert producer.is_alive()
    finally:
        docs.set_shut(False)
    producer.join(10)
    assert not producer.is_alive()


def test_next_after_close_raises_a_clear_error(mesh):
    iterator = _iterator(mesh)
    next(iterator)
    thread = iterator._resources.prefetcher.thread
    iterator.close()
    assert not thread.is_alive()
    iterator.close()  # closing twice is harmless
    with pytest.raises(IteratorClosedError, match="was closed"):
        next(iterator)
    with pytest.raises(IteratorClosedError):
        list(itertools.islice(iterator, 1))
    with pytest.raises(IteratorClosedError):
        iterator.reset()
    assert iterator.get_state()["step"] == 1


def test_prefetcher_thread_stops_when_its_owner_is_dropped():
    class Owner:
        def __init__(self):
            self.count = 0

        def produce(self) -> int:
            self.count += 1
            return self.count

    owner = Owner()
    prefetcher = BackgroundPrefetcher(owner.produce, depth=2)
    assert prefetcher.get() == 1
    owner_ref = weakref.ref(owner)
    del owner
    gc.collect()
    assert owner_ref() is None  # the thread did not keep it alive
    rest = []
    with pytest.raises(StopIteration):  # what was buffered, then the end
        while len(rest) < 10:
            rest.append(prefetcher.get())
    assert rest == list(range(2, 2 + len(rest))) and 1 <= len(rest) <= 3
    prefetcher.thread.join(timeout=10)
    assert not prefetcher.thread.is_alive()


def test_bundles_count_as_their_steps_towards_the_prefetch_depth():
    made = []

    def produce() -> list[int]:
        bundle = [len(made) * 3 + k for k in range(3)]
        made.append(bundle)
        return bundle

    prefetcher = BackgroundPrefetcher(produce, depth=4, size=len)
    try:
        deadline = time.monotonic() + 10
        while len(made) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)
        assert len(made) == 2  # 3 steps < 4: one more bundle, then 6 >= 4 waits
        assert prefetcher.get() == [0, 1, 2]
        deadline = time.monotonic() + 10
        while len(made) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)
        assert len(made) == 3  # 3 held again: one more, then 6 again
        assert [prefetcher.get() for _ in range(2)] == [[3, 4, 5], [6, 7, 8]]
    finally:
        prefetcher.stop()


def _a_step_of_a_chunk(index: int) -> dict:
    """A step's fields as `PlannedBatchDataset` gives them: rows of a larger block."""
    block = np.full((7, 2 * 24, 512), index, dtype=np.int32)
    return {"fields": block[:, 24:], "data_step": np.int64(index)}


def test_a_slice_of_a_chunk_leaves_a_worker_through_shared_memory():
    """Non-contiguous fields went through the worker's pipe, 344 KB a step.

    A worker stopped with one in its queue blocked at exit for 25 s, and the
    other host's JAX shutdown barrier timed out (a CI failure).
    """
    from xlstm_data.multihost import workers

    dataset = grain.MapDataset.range(3).map(_a_step_of_a_chunk).to_iter_dataset()
    options = grain.MultiprocessingOptions(num_workers=1, per_worker_buffer_size=1)
    iterator = iter(workers._shared_memory_prefetch(dataset, options))
    try:
        element = next(iterator)
        # grain hands shared-memory arrays back as its own ndarray subclass.
        assert type(element["fields"]).__name__ == "SharedMemoryArray"
        assert (np.asarray(element["fields"]) == 0).all()
        assert element["fields"].shape == (7, 24, 512)
    finally:
        iterator.close()
    # What the pipeline gets: the same, copied into this process's memory on arrival.
    iterator = iter(workers.prefetch_in_workers(dataset, options))
    try:
        element = next(iterator)
        assert type(element["fields"]) is np.ndarray
        assert element["fields"].shape == (7, 24, 512) and (element["fields"] == 0).all()
    finally:
        iterator.close()
