"""What every system's runner shares: its task on argv, its result as one JSON line, clocks.

The runners execute in different virtual environments (ours in the
project's, the peers in `.venv-peers`), so this module needs only the
standard library (psutil when present): it is imported by both sides.

Protocol: a runner is started as `python -m bench.peers.run_<system> TASK_JSON`
and ends by printing one line `RESULT_PREFIX + json` to stdout; anything
else it prints (library logs, warnings) is kept by the harness only for a
failure's message. A runner that cannot import its peer prints a result
with `"missing": "<why>"` and exits 3, so the harness reports the peer as
missing instead of failing the whole run.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

#: Marks the runner's result line among whatever else it prints.
RESULT_PREFIX = "PEERS_RESULT "
#: Exit status of a runner whose peer cannot be imported.
MISSING_EXIT = 3


def settle_writeback() -> None:
    """Writes every dirty page out before a timed `prepare`, so no earlier write lands in it.

    Our input is written just before our clock starts, and the previous
    round's outputs just before either system's: flushed by the kernel
    during the next timed span, they made ours read 0.26 s in one round and
    0.68-0.69 s in the two others, Megatron's builder steady at 0.40 s.
    """
    if hasattr(os, "sync"):
        os.sync()


def task_from_argv(argv: list[str] | None = None) -> dict[str, Any]:
    """The task the harness passed as the first argument (a JSON object)."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        raise SystemExit(f"usage: python -m bench.peers.run_<system> TASK_JSON (got {argv!r})")
    return json.loads(argv[0])


def emit(result: Mapping[str, Any]) -> None:
    """Prints the result line (flushed: a runner may end with `os._exit`)."""
    sys.stdout.write(RESULT_PREFIX + json.dumps(dict(result)) + "\n")
    sys.stdout.flush()


def emit_missing(why: str) -> None:
    """Reports that this runner's peer cannot be imported, and exits."""
    emit({"missing": why})
    os._exit(MISSING_EXIT)


def parse_result(stdout: str) -> dict[str, Any] | None:
    """The last result line of a runner's stdout, or None if it printed none."""
    found = None
    for line in stdout.splitlines():
        if line.startswith(RESULT_PREFIX):
            found = json.loads(line[len(RESULT_PREFIX) :])
    return found


def cpu_secs() -> float:
    """CPU seconds of this process (all threads) and of its live children.

    Children are read through psutil while they run (DataLoader and grain
    workers are alive across a timed span, so `RUSAGE_CHILDREN`, which only
    counts reaped children, would miss them).
    """
    try:
        import psutil
    except ImportError:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime
    me = psutil.Process()
    total = sum(me.cpu_times()[:2])
    for child in me.children(recursive=True):
        with contextlib.suppress(psutil.Error):  # ended between listing and reading
            total += sum(child.cpu_times()[:2])
    return total


def memory_mb() -> dict[str, float]:
    """This process's memory now, MiB: peak resident set, and resident anonymous and file pages.

    The split tells the loader's own allocations (`anon_mb`) from pages of
    the files it maps (`file_mb`: the page cache, shared and reclaimable,
    but counted in the resident set). On kernels with large page-cache
    folios a fault maps the whole cached folio around it: 2,048 random
    reads of a cached 800 MB offsets file mapped 775 MB (Linux 6.18).
    """
    status = _status_mib()
    found = {"peak_rss_mb": peak_rss_mb(status)}
    for name, key in (("RssAnon", "anon_mb"), ("RssFile", "file_mb")):
        if name in status:
            found[key] = status[name]
    return found


def peak_rss_mb(status: dict[str, float] | None = None) -> float:
    """Peak resident set of this process in MiB: `VmHWM` of /proc/self/status.

    Not `ru_maxrss`: Linux carries the parent's peak across fork and exec
    into it, so every runner would report at least the harness's own peak.

    Args:
      status: `_status_mib()` when the caller has read it already.
    """
    peak = (_status_mib() if status is None else status).get("VmHWM")
    if peak is not None:
        return peak
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _status_mib() -> dict[str, float]:
    """The kB entries of /proc/self/status in MiB, by name (empty where it cannot be read)."""
    found = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                name, _, value = line.partition(":")
                parts = value.split()
                if len(parts) == 2 and parts[1] == "kB":
                    found[name] = int(parts[0]) / 1024
    except OSError:
        pass
    return found


def time_batches(
    batches: Iterator[Any],
    count: Callable[[Any], int],
    warmup: int,
    timed: int,
    warmup_secs: float = 0.0,
) -> dict[str, Any]:
    """Skips `warmup` batches, then times `timed` more: tokens, wall and CPU seconds.

    `count(batch)` gives the batch's non-padding tokens. The first batch is
    timed on its own (it pays for opening files, building indexes and
    starting workers), and is part of the warm-up. After it the runner
    sleeps until `warmup_secs` have passed since the start, consuming
    nothing: worker processes finish starting and fill their queues on every
    system alike (a count of batches alone would time our worker start-up,
    during which ours computes its first steps in the main process, but not
    a DataLoader's, whose first batch already waited for its workers).
    """
    started = time.perf_counter()
    first = next(batches)
    first_batch_secs = time.perf_counter() - started
    count(first)
    time.sleep(max(warmup_secs - (time.perf_counter() - started), 0.0))
    for _ in range(max(warmup - 1, 0)):
        count(next(batches))
    tokens = 0
    cpu_before = cpu_secs()
    began = time.perf_counter()
    for _ in range(timed):
        tokens += count(next(batches))
    wall = time.perf_counter() - began
    cpu = cpu_secs() - cpu_before
    return {
        "tokens": int(tokens),
        "batches": int(timed),
        "wall_secs": wall,
        "cpu_secs": cpu,
        "tokens_per_sec": tokens / wall if wall > 0 else 0.0,
        "cpu_secs_per_mtoken": cpu / (tokens / 1e6) if tokens else 0.0,
        "first_batch_secs": first_batch_secs,
    }
