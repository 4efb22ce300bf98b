"""Refuses a bad run config before `trainer_hooks.train` loads JAX, flax and orbax.

A mistyped key (`--config.data.wroker_count=2`), an override of the wrong
type or a value out of range was refused only after those imports and JAX's
start: 2.5-3 s of CPU per process, and in a multi-process run after every
process had joined. Here it takes ~0.4 s and no process starts. `train`
checks the same config again, as the library checks whatever a caller
passes it, so a source's path is listed twice (a prepared directory's
`index.json`, or a glob): a missing corpus is worth finding before the
processes join.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import NoReturn

from absl import flags

from trainer_hooks.launch import define_launch_flags
from trainer_hooks.lost_process import in_child
from xlstm_data.config.data_config import validate_data_config
from xlstm_data.config.overrides import (
    config_file_error,
    define_config_file,
    flag_error,
    override_error,
)
from xlstm_data.config.run_config import with_defaults
from xlstm_data.errors import DataConfigError, DataReadError

#: absl's help flags: with one, the help is shown, not a config error.
_HELP = ("-h", "-help", "--help", "--helpshort", "--helpfull", "--helpxml")


def exit_if_config_is_bad(argv: Sequence[str]) -> None:
    """Exits with one `error:` line if `--config` or an override is bad; else returns.

    Reads `--config` (also a file that is not there), its `--config.*`
    overrides and the launch flags (`trainer_hooks.launch`), which it
    refuses as the full parse would; any other flag is left to the full
    parse, which names a bad one. With `--help` nothing is checked, and with
    `--debug` the config's keys and values are not, so the run shows where
    its error is raised. The exit statuses are the full run's: 2 for a flag,
    1 for a key, a value or an unreadable corpus index.
    """
    if in_child() or any(arg in _HELP for arg in argv):  # checked already; help first
        return
    missing = config_file_error(argv)
    if missing:
        exit_with_error(missing, 2)
    program = sys.argv[0]
    flag_values = flags.FlagValues()
    launch = define_launch_flags(flag_values)
    config = define_config_file("", flag_values=flag_values, sys_argv=[program, *argv])
    parse_or_exit(flag_values, [program, *argv], known_only=True)
    if config.value is None or launch.is_debug():
        return
    try:
        validate_data_config(with_defaults(config.value).data)
    except (DataConfigError, DataReadError) as error:
        exit_with_error(f"{error} (--debug shows where)", 1)


def parse_or_exit(
    flag_values: flags.FlagValues, argv: Sequence[str], *, known_only: bool = False
) -> list[str]:
    """absl's parse of `argv`; a bad flag or `--config` override exits with one line, status 2.

    The early check and the full parse of `trainer_hooks.train` both parse this way.
    """
    try:
        return flag_values(list(argv), known_only=known_only)
    except (KeyError, AttributeError) as error:
        exit_with_error(override_error(error, argv), 2)
    except flags.Error as error:
        exit_with_error(flag_error(error), 2)


def exit_with_error(message: str, status: int) -> NoReturn:
    """Prints the one `error:` line of a user's mistake and exits with `status`."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(status)
