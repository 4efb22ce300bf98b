"""`--config=FILE` with `--config.KEY=VALUE` overrides of any documented key.

Every command line that takes a run config (`trainer_hooks.train`,
`xlstm-data inspect`, `xlstm-data bench --config`) defines it here, so the
override syntax and what it accepts are the same everywhere:

* any key can be overridden, also one the file leaves out (a source option
  such as `--config.data.train.web.vocab_size=300`): `ml_collections` only
  overrides existing keys unless told to accept new ones. Typos are still
  refused, by name, when the config is validated (`validate_data_config` for
  `data`, `xlstm_data.config.run_config.with_defaults` for the rest), before any data
  is read;
* an override under a section the config does not have
  (`--config.chekpoint.every_steps=2`) is refused while parsing;
  `override_error` turns what `ml_collections` raises into one line;
* `None` resets a typed key to unset (`--config.data.eod_token_id=None`,
  `--config.checkpoint.max_to_keep=None`), which the integer and float
  parsers of `config_flags` refuse.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence
from typing import Any

from absl import flags
from ml_collections import config_flags

from xlstm_data.errors import DataConfigError

_NONE_SPELLINGS = ("None", "none", "null")


class _NullableParser(flags.ArgumentParser):
    """absl's parser for a type, plus `None` for an unset value."""

    def __init__(self, parser: flags.ArgumentParser):
        super().__init__()
        self._parser = parser

    def parse(self, argument: Any) -> Any:
        if argument is None or (isinstance(argument, str) and argument in _NONE_SPELLINGS):
            return None
        return self._parser.parse(argument)

    def flag_type(self) -> str:
        return self._parser.flag_type()


def _accept_none_for_numbers() -> None:
    config_flags.register_flag_parser_for_type(int, _NullableParser(flags.IntegerParser()))
    config_flags.register_flag_parser_for_type(float, _NullableParser(flags.FloatParser()))


def define_config_file(
    help_string: str,
    *,
    flag_values: flags.FlagValues = flags.FLAGS,
    sys_argv: Sequence[str] | None = None,
) -> flags.FlagHolder:
    """Defines `--config` (a .py file with `get_config()`) and its overrides.

    Args:
      help_string: The flag's help.
      flag_values: Where to define it (absl's global `FLAGS` by default).
      sys_argv: The full argv the overrides are read from (default sys.argv).

    Returns:
      The flag holder; `.value` is the loaded, overridden `ConfigDict`.
    """
    _accept_none_for_numbers()
    return config_flags.DEFINE_config_file(
        "config",
        None,
        help_string,
        flag_values=flag_values,
        lock_config=False,
        accept_new_attributes=True,
        sys_argv=None if sys_argv is None else list(sys_argv),
    )


def override_error(error: BaseException, argv: Sequence[str] = ()) -> str:
    """One line for what parsing `--config` overrides raised (a KeyError or AttributeError).

    `ml_collections` raises them for an override under a section the config
    does not have (a quoted key, then a "Did you mean" hint) and for a config
    file without `get_config()`. With the command line's `argv`, the line
    also lists the sections the config has where the override looked.
    """
    text = str(error.args[0] if error.args else error).replace("\\n", "\n")
    if "get_config" in text:
        return f"--config: the file has no get_config() function ({text})"
    key, *hints = [line.strip(" '\"") for line in text.split("\n") if line.strip(" '\"")]
    hint = f"; {' '.join(hints)}" if hints else ""
    return (
        f"--config: the config has no section {key!r}{hint}{_sections_beside(key, argv)} (an "
        "override may add a key to a section, not a new section)"
    )


def _sections_beside(key: str, argv: Sequence[str]) -> str:
    """ "; data.train has sections: a, b" for the override of `argv` that names `key`, or ""."""
    config_arg = _config_value(argv)
    override = next((a for a in argv if a.startswith("--config.") and f".{key}." in a), None)
    if config_arg is None or override is None:
        return ""
    parents = override.split("=", 1)[0].removeprefix("--config.").split(f".{key}.", 1)[0]
    parents = "" if parents.startswith(f"{key}.") else parents
    try:
        node = load_config(config_arg)
        for part in filter(None, parents.split(".")):
            node = node[part]
        sections = sorted(name for name, value in node.items() if hasattr(value, "items"))
    except Exception:  # noqa: BLE001 - only a hint; the error line stands without it
        return ""
    return f"; {parents or 'the config'} has sections: {', '.join(sections) or 'none'}"


def load_config(path: str) -> Any:
    """Runs `get_config()` of a config file, as config_flags loads `--config`.

    As with config_flags, what follows the first colon is `get_config`'s argument
    (`configs/megatron.py:/data/web_text_document,50256`).
    """
    missing = _not_a_file(path)
    if missing:
        raise DataConfigError(missing)
    file, colon, argument = path.partition(":")
    spec = importlib.util.spec_from_file_location("loaded_config", file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, "get_config"):
        raise DataConfigError(f"--config={path!r} has no get_config() function")
    return module.get_config(argument) if colon else module.get_config()


_TRACEBACK = "Traceback (most recent call last):"


def flag_error(error: flags.Error) -> str:
    """absl's message, with the expected type named for an override of a typed key.

    A config file's `get_config` that raises (a missing argument after the
    colon) reaches here as ml_collections' message with the whole traceback
    in it; only its last line, the config's own message, is kept.
    """
    text = str(error)
    if _TRACEBACK in text:
        head = text.split(_TRACEBACK)[0].strip()
        text = f"{head} {[line for line in text.splitlines() if line.strip()][-1].strip()}"
    text = text.replace("\n", " ").strip()
    for wrong, expected in (("for int()", "an integer"), ("to float", "a number")):
        if wrong in text:
            return f"{text.split(': ')[0]} is invalid; expected {expected} ({text})"
    return text


def config_file_error(argv: Sequence[str]) -> str | None:
    """The error line for a `--config` in `argv` that names no file, else None.

    Checked before parsing: `config_flags` would raise an `OSError` with a
    traceback, and only once the config is first read.
    """
    path = _config_value(argv)
    return None if path is None else _not_a_file(path)


def _not_a_file(path: str) -> str | None:
    """The one message for a `--config` (`FILE[:ARGUMENT]`) whose file does not exist."""
    if os.path.isfile(path.partition(":")[0]):
        return None
    return f"--config={path!r} is not a file; pass a config .py with get_config()"


def _config_value(argv: Sequence[str]) -> str | None:
    """`--config=V` or `--config V` of `argv`, the last one; not after `--`."""
    value = None
    for i, arg in enumerate(argv):
        if arg == "--":
            break
        if arg.startswith("--config="):
            value = arg.split("=", 1)[1]
        elif arg == "--config" and i + 1 < len(argv):
            value = argv[i + 1]
    return value
