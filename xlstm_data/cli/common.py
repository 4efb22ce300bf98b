"""What the subcommands share besides the dispatcher: the usage error, tokenizer flags, progress.

`main` registers the subcommands and imports their modules (`index_command`
among them) when a command runs; those modules take what they share from
here rather than from `main`, so no subcommand module imports the dispatcher
that imports it. (Under `python -m xlstm_data.cli.main` the dispatcher is
`__main__`, and a `UsageError` imported back from `xlstm_data.cli.main` would be
another class than the one it catches.)
"""

from __future__ import annotations

import sys

from absl import flags


class UsageError(Exception):
    """A bad command line; the message names the argument and what is valid."""


def define_tokenizer_flags(fv: flags.FlagValues, *, tokenizer_help: str, vocab_help: str) -> None:
    """--tokenizer, --vocab_size, --eod_token and --pad_token, as `prepare` and `index` take
    them (both write an index recording them)."""
    flags.DEFINE_string("tokenizer", "byte", tokenizer_help, flag_values=fv)
    flags.DEFINE_integer(
        "vocab_size",
        None,
        "vocabulary every id is checked against and recorded in index.json (default: the "
        f"tokenizer's); {vocab_help}",
        flag_values=fv,
    )
    flags.DEFINE_string(
        "eod_token",
        None,
        "the tokenizer's end-of-document token, when it is not one of the usual spellings",
        flag_values=fv,
    )
    flags.DEFINE_string("pad_token", None, "the tokenizer's padding token", flag_values=fv)


#: Per label, the last tenth of the work reported to a stderr that is not a terminal.
_reported_tenths: dict[str, int] = {}


def progress_bar(label: str, done: int, total: int) -> None:
    """One line on stderr, redrawn in place, ending when `done == total`.

    Redrawing with carriage returns suits a terminal only: in a log file it
    made one line of 250 KB. Elsewhere a plain line is printed at each tenth.
    """
    if not sys.stderr.isatty():
        tenth = 10 * done // max(1, total)
        if done == total or tenth > _reported_tenths.get(label, -1):
            _reported_tenths[label] = tenth
            print(f"{label}: {done}/{total}", file=sys.stderr, flush=True)
        return
    width = 30
    filled = int(width * done / max(1, total))
    print(
        f"\r{label:<9} [{'#' * filled}{'.' * (width - filled)}] {done}/{total}",
        end="" if done < total else "\n",
        file=sys.stderr,
        flush=True,
    )
