"""A watchdog that kills a test process stuck past its timeout, after dumping every thread.

pytest-timeout's SIGALRM acts only when the main thread runs Python again,
and only once per test: a test stuck in native code holding the GIL, or stuck
again in its cleanup after the timeout was raised, held a CI run until the
CI's own limit (5400 s) with no word of which test. faulthandler's watchdog
is a native thread: it needs no GIL, writes every thread's stack, and ends
the process. Under xdist that is reported as a crash of the worker naming
the test; its stacks go to a file per worker that the controller prints at
the end (a worker's captured stderr would be lost with it), and the test
fails at once instead of hanging again on the worker xdist starts next.
Without xdist the stacks go to the terminal.

conftest.py imports the hooks, so pytest finds them there.
"""

from __future__ import annotations

import faulthandler
import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

#: Seconds past a test's own pytest-timeout before the watchdog kills its process
#: (shorter for the watchdog's own test).
GRACE_S = float(os.environ.get("XLSTM_DATA_TEST_HANG_GRACE_S", 120))
#: What faulthandler writes first when its watchdog fires.
FIRED = "Timeout ("

_DIR_ENV = "XLSTM_DATA_TEST_HANG_DUMPS"
#: Set once by the first process, so that xdist's workers inherit it.
DUMPS = Path(os.environ.get(_DIR_ENV) or tempfile.mkdtemp(prefix="xlstm-data-hang-"))
_MADE_HERE = _DIR_ENV not in os.environ
os.environ[_DIR_ENV] = str(DUMPS)

#: The terminal's stderr, for the stacks of a process outside xdist.
_STDERR = pytest.StashKey[object]()
#: The running test's deadline (monotonic seconds) and where its stacks go.
_armed: dict[str, object] = {}


def _limit(item: pytest.Item) -> float:
    """The test's own pytest-timeout in seconds (0: none), as pytest-timeout reads it.

    Its marker, `--timeout` and ini settings read by its own (private) reader,
    so the two never disagree.
    """
    try:
        from pytest_timeout import _get_item_settings

        return float(_get_item_settings(item).timeout or 0)
    except (ImportError, AttributeError):  # not installed, or off (-p no:timeout)
        return 0.0


def _arm(seconds: float) -> None:
    faulthandler.dump_traceback_later(max(seconds, 1.0), exit=True, file=_armed["file"])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    limit = _limit(item)
    if limit <= 0:
        yield
        return
    worker = hasattr(item.config, "workerinput")
    if worker:
        dump = open(DUMPS / f"{os.getpid()}.txt", "w")  # noqa: SIM115
        dump.write(f"{item.nodeid}\nstill running {limit + GRACE_S:.0f} s after it started:\n")
        dump.flush()
    else:
        dump = item.config.stash[_STDERR]
    _armed.update(deadline=time.monotonic() + limit + GRACE_S, file=dump)
    _arm(limit + GRACE_S)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
        _armed.clear()
        if worker:
            dump.close()
            os.unlink(dump.name)


@pytest.hookimpl(trylast=True)
def pytest_exception_interact():
    """Re-arms after pytest's faulthandler plugin cancelled the watchdog on a failure.

    A test that fails (a pytest-timeout included) still runs its teardown,
    which may hang in turn.
    """
    if _armed:
        _arm(_armed["deadline"] - time.monotonic())


def _hangs() -> dict[str, str]:
    """{file name: its text} of the processes the watchdog killed."""
    hangs = {}
    for path in DUMPS.glob("*.txt"):
        try:
            text = path.read_text()
        except FileNotFoundError:  # a test that ended while we looked
            continue
        if FIRED in text:
            hangs[path.name] = text
    return hangs


def pytest_runtest_setup(item):
    """A test the watchdog killed fails at once when xdist hands it to a new worker."""
    for name, text in _hangs().items():
        if text.split("\n", 1)[0] == item.nodeid:
            pytest.fail(f"hung in process {name[:-4]}: its stacks end the output", pytrace=False)


def pytest_configure(config):
    # Output capture is suspended here, so this is the terminal's stderr.
    config.stash[_STDERR] = os.fdopen(os.dup(2), "w")


def pytest_terminal_summary(terminalreporter):
    for name, text in sorted(_hangs().items()):
        terminalreporter.write_sep("=", f"hung test process {name[:-4]}")
        terminalreporter.write_line(text)


def pytest_unconfigure(config):
    config.stash[_STDERR].close()
    if _MADE_HERE and not hasattr(config, "workerinput"):
        shutil.rmtree(DUMPS, ignore_errors=True)
