"""One `error:` line, not JAX's abort, when another process of a multi-process run is lost.

When a process dies, JAX's coordination service notices its missing
heartbeats and every other process aborts inside XLA's C++ (SIGABRT) with a
fatal log, a C++ stack and a dump of every Python thread. jaxlib 0.10.2 has
no Python hook for this: `get_distributed_runtime_client` takes a
`missed_heartbeat_callback`, but calling it fails to convert its
`absl::Status` argument (`std::bad_cast`, then `terminate`).

So `trainer_hooks.train` of a multi-process run trains in a child process
(`run_watched`), and this parent streams the child's stderr through until
JAX's report of unhealthy tasks appears. From there it holds the rest back
and, when the child then dies, prints one line naming the lost process and
exits 1. Any other ending passes through unchanged: the child's output as
it came and its exit status; a child ended by signal N ends this process by
signal N too, so a caller sees what an unwatched run would give.

The child runs in its own session, so a signal sent to the parent's process
group (SLURM's pre-emption SIGTERM) reaches it once, forwarded by the
parent; and it asks the kernel to SIGKILL it when the parent dies
(`PR_SET_PDEATHSIG`), so killing the launched process kills the run.
"""

from __future__ import annotations

import ctypes
import os
import re
import signal
import subprocess
import sys
from collections.abc import Sequence

#: Set in the child's environment; its presence means "train here, do not watch".
CHILD_ENV = "XLSTM_DATA_TRAIN_CHILD"
#: JAX's coordination service lists the lost tasks on the lines after this.
UNHEALTHY = "The following tasks are unhealthy (stopped sending heartbeats):"
_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
_PR_SET_PDEATHSIG = 1


def in_child() -> bool:
    """Whether this process is the watched child (it trains)."""
    return bool(os.environ.get(CHILD_ENV))


def die_with_parent() -> None:
    """Asks Linux to SIGKILL this process when its parent dies (a no-op elsewhere)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:  # the parent died before the request
        os.kill(os.getpid(), signal.SIGKILL)


def lost_processes(lines: Sequence[str]) -> list[int]:
    """The process indices JAX reported as unhealthy in `lines` (its stderr, held back)."""
    text = "".join(lines)
    at = text.find(UNHEALTHY)
    if at < 0:
        return []
    found = []
    for line in text[at + len(UNHEALTHY) :].splitlines():
        if not line.strip():
            continue
        task = re.fullmatch(r"\s*(?:\S*task:)?(\d+)\s*", line)  # "1" or ".../task:1"
        if task is None:
            break  # past the list
        found.append(int(task.group(1)))
    return sorted(set(found))


def run_watched(argv: Sequence[str], num_processes: int | None, heartbeat_secs: int) -> int:
    """Runs `python -m trainer_hooks.train ARGV` as a child; returns the exit status.

    Args:
      argv: The command line's arguments (without the program).
      num_processes: The run's process count, for the message (None: unknown).
      heartbeat_secs: `--heartbeat_timeout`, for the message.
    """
    child = subprocess.Popen(
        [sys.executable, "-m", "trainer_hooks.train", *argv],
        env={**os.environ, CHILD_ENV: "1"},
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    for sig in _FORWARDED:
        signal.signal(sig, lambda number, frame: child.send_signal(number))
    held: list[str] = []
    assert child.stderr is not None
    out = sys.stderr.buffer
    for raw in child.stderr:
        line = raw.decode("utf-8", "replace")
        if held or UNHEALTHY in line:
            held.append(line)
            continue
        out.write(raw)
        out.flush()
    code = child.wait()
    lost = lost_processes(held)
    if code != 0 and lost:
        of = f" of {num_processes}" if num_processes else ""
        names = ", ".join(str(i) for i in lost)
        print(
            f"error: process {names}{of} stopped (no heartbeat for {heartbeat_secs} s); this "
            f"process stops too. Rerun all processes to resume from the last checkpoint.",
            file=sys.stderr,
            flush=True,
        )
        return 1
    out.write("".join(held).encode())
    out.flush()
    if code < 0:  # ended by a signal: end the same way, as an unwatched run would
        if -code != signal.SIGKILL:
            signal.signal(-code, signal.SIG_DFL)  # ours forwards it
        os.kill(os.getpid(), -code)
    return code
