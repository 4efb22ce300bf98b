"""The flags that say how a run's processes start, and the watching launcher.

A multi-process run's launched process only watches a child that trains
(`lost_process.run_watched`). It decides so from these flags alone, before
`trainer_hooks.train` imports JAX, orbax and the data pipeline: importing
them cost the launcher 2.7 s of CPU (and their memory) per process and
start, for nothing it used.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Sequence

from absl import flags

from trainer_hooks.lost_process import in_child, run_watched


@dataclasses.dataclass(frozen=True)
class LaunchFlags:
    """Holders of the launch flags, defined on one `FlagValues`."""

    coordinator: flags.FlagHolder
    num_processes: flags.FlagHolder
    process_id: flags.FlagHolder
    distributed: flags.FlagHolder
    heartbeat_timeout: flags.FlagHolder
    debug: flags.FlagHolder

    def is_distributed(self) -> bool:
        """Whether this process joins others (flags, `JAX_COORDINATOR_ADDRESS`, detection)."""
        return bool(
            self.coordinator.value
            or os.environ.get("JAX_COORDINATOR_ADDRESS")
            or self.distributed.value
        )

    def is_debug(self) -> bool:
        """`--debug` or `XLSTM_DATA_DEBUG`: tracebacks, and no watching parent."""
        return self.debug.value or os.environ.get("XLSTM_DATA_DEBUG", "") not in ("", "0")


def define_launch_flags(flag_values: flags.FlagValues = flags.FLAGS) -> LaunchFlags:
    """Defines the launch flags on `flag_values`."""
    return LaunchFlags(
        coordinator=flags.DEFINE_string(
            "coordinator", None, "host:port of process 0 (multi-process).", flag_values=flag_values
        ),
        num_processes=flags.DEFINE_integer(
            "num_processes", None, "Number of processes.", flag_values=flag_values
        ),
        process_id=flags.DEFINE_integer(
            "process_id", None, "This process's index.", flag_values=flag_values
        ),
        distributed=flags.DEFINE_bool(
            "distributed",
            False,
            "Join a multi-process run detected by JAX (SLURM, MPI, k8s, TPU).",
            flag_values=flag_values,
        ),
        heartbeat_timeout=flags.DEFINE_integer(
            "heartbeat_timeout",
            10,
            "Seconds without a heartbeat after which a process counts as lost and the others "
            "stop (JAX's default, 100, kept a survivor waiting 56-101 s).",
            lower_bound=1,
            flag_values=flag_values,
        ),
        debug=flags.DEFINE_bool(
            "debug",
            False,
            "Show the traceback behind an error line (also XLSTM_DATA_DEBUG=1).",
            flag_values=flag_values,
        ),
    )


def exit_if_watching(argv: Sequence[str]) -> None:
    """In a multi-process run's launched process: trains in a watched child, then exits.

    Anything else returns at once (one process, `--debug`, the child itself).
    Only the launch flags are read here; a bad value among them is left to
    the full parse, which names it.
    """
    if in_child():
        return
    flag_values = flags.FlagValues()
    launch = define_launch_flags(flag_values)
    try:
        flag_values([sys.argv[0], *argv], known_only=True)
    except flags.Error:
        return
    if not launch.is_distributed() or launch.is_debug():
        return
    num_processes = launch.num_processes.value
    if num_processes is None and os.environ.get("JAX_NUM_PROCESSES", "").isdigit():
        num_processes = int(os.environ["JAX_NUM_PROCESSES"])
    sys.exit(run_watched(argv, num_processes, launch.heartbeat_timeout.value))
