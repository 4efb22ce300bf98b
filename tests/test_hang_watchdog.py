"""The suite's hang watchdog (`tests/hang_watchdog.py`) on tests that hang as CI's did.

A pytest run of its own, on 2 xdist workers as `make test` runs, over tests
that hold the GIL in native code forever, or hang again in their teardown
after pytest-timeout failed them.
"""

from __future__ import annotations

import re
import subprocess
import sys

from tests.multiprocess import REPO

HANGING = """
import ctypes
import signal
import time

import pytest


def _deadlock_holding_the_gil():
    libc = ctypes.PyDLL(None)  # a PyDLL call keeps the GIL
    mutex = ctypes.create_string_buffer(64)
    libc.pthread_mutex_lock(mutex)
    libc.pthread_mutex_lock(mutex)


@pytest.mark.timeout(1)
def test_native_hang():
    _deadlock_holding_the_gil()


@pytest.fixture
def stuck_teardown():
    yield
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    time.sleep(600)


@pytest.mark.timeout(1)
def test_hangs_again_in_its_teardown(stuck_teardown):
    time.sleep(600)


def test_after_the_hangs():
    assert True
"""


def test_hung_tests_are_killed_named_with_their_stacks_and_not_run_again(tmp_path):
    (tmp_path / "test_hanging.py").write_text(HANGING)
    (tmp_path / "test_other.py").write_text("def test_other():\n    assert True\n")
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(REPO),
        "XLSTM_DATA_TEST_HANG_GRACE_S": "2",
    }
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "tests.hang_watchdog",
            "-p",
            "no:cacheprovider",
            "-n",
            "2",
            "--dist",
            "loadfile",
            "-q",
            "--rootdir",
            str(tmp_path),
            str(tmp_path),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    summary = out.split("short test summary info")[-1]
    assert "2 passed" in summary  # the other tests ran, on the workers xdist started next
    for test in ("test_native_hang", "test_hangs_again_in_its_teardown"):
        assert f"crashed while running 'test_hanging.py::{test}'" in out
        assert f"test_hanging.py::{test}\nstill running 3 s after it started:\nTimeout (" in out
    # Each stack shows where it hung: the native call, and the teardown after the timeout.
    assert "in _deadlock_holding_the_gil" in out and "in stuck_teardown" in out
    assert "Failed: Timeout (>1.0s) from pytest-timeout" in out
    # Handed to the worker xdist started next, a hung test failed at once.
    for test in ("test_native_hang", "test_hangs_again_in_its_teardown"):
        assert re.search(f"ERROR at setup of {test} _+\n.*\nhung in process \\d+: its stacks", out)
