"""The `xlstm-data` command line: prepare, index, inspect, batch and bench.

`prepare` tokenizes raw text, JSON lines, Parquet, Arrow or token arrays into
ArrayRecord shards with an index; `index` writes that index for shards made
elsewhere; `inspect` prints what a config will do before a long run is
launched; `batch` lists the documents in given steps of a config or a run;
`bench` runs the benchmarks in `bench/`, or measures the pipeline
of your own config. Every subcommand parses its flags with absl, and a config
is read with ml_collections' `config_flags`, so `--config=run.py
--config.data.global_batch_size=32` means the same here as for
`python -m trainer_hooks.train`. User errors print one line naming the bad
argument and exit with status 2.

Each call parses into its own `absl.flags.FlagValues` instead of the global
`FLAGS`: the override flags that `config_flags` defines per call would clash
on a second call in one process (tests, notebooks), and `main` must return a
status rather than exit as `absl.app.run` does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import textwrap
from collections.abc import Callable, Sequence
from typing import Any

from absl import flags

from xlstm_data.cli.common import UsageError, define_tokenizer_flags, progress_bar
from xlstm_data.config.overrides import (
    config_file_error,
    define_config_file,
    flag_error,
    override_error,
)
from xlstm_data.errors import DataConfigError, DataReadError

PROG = "xlstm-data"
_HELP_ARGS = ("-h", "--help", "-help", "--helpfull")


@dataclasses.dataclass(frozen=True)
class Command:
    """A subcommand: its flags, how it runs, and its help.

    Attributes:
      name: Subcommand name (`xlstm-data <name>`).
      summary: One line for `xlstm-data --help`.
      usage: The usage line after the program name, e.g. `prepare INPUT... --output=DIR`.
      description: Paragraph shown by `--help`.
      define: Defines the flags on a fresh `FlagValues`; gets the command's
        argv too (config_flags needs it to find `--config.*` overrides).
      run: Runs with the parsed flags and the positional arguments; returns
        the exit status.
    """

    name: str
    summary: str
    usage: str
    description: str
    define: Callable[[flags.FlagValues, Sequence[str]], None]
    run: Callable[[flags.FlagValues, list[str]], int]


# ----------------------------------------------------------------------------
# Parsing shared by every subcommand (and by `python -m bench.run`).
# ----------------------------------------------------------------------------


def define_config_flag(
    fv: flags.FlagValues, argv: Sequence[str], help_string: str
) -> flags.FlagHolder:
    """`--config=FILE` with `--config.key=value` overrides (see `config_overrides`)."""
    return define_config_file(help_string, flag_values=fv, sys_argv=[PROG, *argv])


def run_config(fv: flags.FlagValues) -> Any:
    """The parsed `--config`, completed with defaults; unknown keys are refused by name."""
    from xlstm_data.config.run_config import with_defaults

    return with_defaults(fv.config)


def format_help(command: Command, fv: flags.FlagValues, prog: str) -> str:
    """Usage, description and every flag with its default."""
    lines = [f"usage: {prog.split()[0]} {command.usage}", "", command.description, "", "flags:"]
    for name in sorted(fv):
        flag = fv[name]
        if name != flag.name or name in ("flagfile", "undefok"):
            continue  # a short alias, or absl's own
        name = f"--[no]{flag.name}" if flag.boolean else f"--{flag.name}"
        default = "" if flag.default is None else f" (default: {flag.default_as_str})"
        lines += textwrap.wrap(
            f"{name}: {flag.help}{default}", 88, initial_indent="  ", subsequent_indent="      "
        )
    return "\n".join(lines) + "\n"


def parse(command: Command, argv: Sequence[str], prog: str) -> tuple[flags.FlagValues, list[str]]:
    """Parses `argv` (after the subcommand) into fresh flags; returns them and the positionals.

    Raises:
      UsageError: An unknown flag, a bad value, a missing config file or an
        override of a key the config does not have (named with the keys
        that exist there).
    """
    fv = flags.FlagValues()
    command.define(fv, argv)
    if "config" in fv:
        missing = config_file_error(argv)
        if missing:
            raise UsageError(missing)
    try:
        positional = fv([prog, *argv])[1:]
    except flags.UnrecognizedFlagError as error:
        valid = ", ".join(f"--{name}" for name in sorted(fv) if name not in ("flagfile", "undefok"))
        raise UsageError(f"unknown flag {error.flagvalue}; valid flags: {valid}") from None
    except flags.Error as error:
        raise UsageError(flag_error(error)) from None
    except (KeyError, AttributeError) as error:  # config_flags: a missing key or get_config
        raise UsageError(override_error(error, argv)) from None
    return fv, positional


#: Set (to anything but "" or "0") to see the traceback behind an `error:` line.
DEBUG_ENV = "XLSTM_DATA_DEBUG"


def run_command(command: Command, argv: Sequence[str], prog: str) -> int:
    """Parses, handles `--help`, runs, and turns user errors into one line and status 2.

    `--debug` (any command) or `XLSTM_DATA_DEBUG=1` shows the traceback instead.
    """
    flags_part = list(argv)[: list(argv).index("--")] if "--" in argv else list(argv)
    debug = "--debug" in flags_part or os.environ.get(DEBUG_ENV, "") not in ("", "0")
    if "--debug" in flags_part:
        argv = [arg for i, arg in enumerate(argv) if not (arg == "--debug" and i < len(flags_part))]
        flags_part = [arg for arg in flags_part if arg != "--debug"]
    if any(arg in _HELP_ARGS for arg in flags_part):
        fv = flags.FlagValues()
        command.define(fv, [])
        print(format_help(command, fv, prog), end="")
        return 0
    try:
        fv, positional = parse(command, argv, prog)
        return command.run(fv, positional)
    except UsageError as error:
        if debug:
            raise
        print(f"{prog}: error: {error}\n(see '{prog} --help')", file=sys.stderr)
        return 2
    except (DataConfigError, DataReadError) as error:
        if debug:
            raise
        print(f"{prog}: error: {error} (--debug shows where)", file=sys.stderr)
        return 2


# ----------------------------------------------------------------------------
# prepare
# ----------------------------------------------------------------------------


def _define_prepare(fv: flags.FlagValues, argv: Sequence[str]) -> None:
    del argv
    from xlstm_data.prepare.inputs import INPUT_FORMATS
    from xlstm_data.prepare.settings import RUNNERS
    from xlstm_data.sources import TEXT_UNITS

    flags.DEFINE_string("output", None, "output directory or URI (required)", flag_values=fv)
    flags.DEFINE_string(
        "format",
        "auto",
        f"one of {', '.join(INPUT_FORMATS)}: auto detects compression, Parquet, Arrow and "
        "numpy files from their bytes, then picks by suffix (.jsonl, .json holding JSON lines, "
        ".npy/.npz, else text)",
        flag_values=fv,
    )
    flags.DEFINE_string(
        "field", "text", "JSON key or Parquet/Arrow column holding each document", flag_values=fv
    )
    flags.DEFINE_string(
        "unit", "line", f"a text document is one {' or one '.join(TEXT_UNITS)}", flag_values=fv
    )
    define_tokenizer_flags(
        fv,
        tokenizer_help="byte, or a local HuggingFace tokenizer .json",
        vocab_help="for token arrays whose ids are not the tokenizer's",
    )
    flags.DEFINE_integer(
        "workers", 1, "processes tokenizing parts and writing shards (local runner)", flag_values=fv
    )
    flags.DEFINE_integer(
        "num_shards",
        None,
        "output shards of about equal tokens (default: one per input file)",
        flag_values=fv,
    )
    flags.DEFINE_float(
        "shard_size_mb",
        None,
        "target MiB of tokens per shard, instead of --num_shards",
        flag_values=fv,
    )
    flags.DEFINE_boolean(
        "skip_bad_lines",
        False,
        "skip unparsable lines and rows, and report how many per file (default: stop and name "
        "the file and line)",
        flag_values=fv,
    )
    flags.DEFINE_float(
        "validation_fraction",
        None,
        "share of documents held out into OUTPUT/validation, chosen by --seed",
        flag_values=fv,
    )
    flags.DEFINE_integer(
        "validation_documents",
        None,
        "number of documents held out, instead of --validation_fraction",
        flag_values=fv,
    )
    flags.DEFINE_integer("seed", 0, "chooses the held-out documents", flag_values=fv)
    flags.DEFINE_integer(
        "part_mb", 256, "inputs larger than this are tokenized in parallel parts", flag_values=fv
    )
    flags.DEFINE_enum(
        "layout",
        "flat",
        ["flat", "array_record"],
        "flat: per shard one token file (uint16 when the vocabulary fits, else uint32) and "
        "document offsets, read through memory maps; array_record: one ArrayRecord record of "
        "int32 ids per document",
        flag_values=fv,
    )
    flags.DEFINE_enum(
        "runner",
        "local",
        list(RUNNERS),
        "local processes, or an Apache Beam pipeline",
        flag_values=fv,
    )
    flags.DEFINE_string(
        "beam_options",
        "",
        "Beam pipeline options for --runner=beam, e.g. '--runner=DataflowRunner --project=P' "
        "(default DirectRunner)",
        flag_values=fv,
    )


def _prepare(fv: flags.FlagValues, inputs: list[str]) -> int:
    import shlex

    from xlstm_data.prepare.corpus import prepare_corpus

    if not inputs:
        raise UsageError("no INPUT given; pass input files or globs, e.g. 'raw/*.jsonl'")
    if not fv.output:
        raise UsageError("--output is required: the directory the shards are written to")
    if fv.beam_options and fv.runner != "beam":
        raise UsageError(f"--beam_options={fv.beam_options!r} needs --runner=beam")
    labels = {"tokenize": "parts", "write": "shards"}
    index = prepare_corpus(
        inputs,
        fv.output,
        workers=fv.workers,
        runner=fv.runner,
        beam_options=shlex.split(fv.beam_options),
        progress=lambda step, done, total: progress_bar(labels[step], done, total),
        input_format=fv.format,
        field=fv.field,
        unit=fv.unit,
        tokenizer=fv.tokenizer,
        eod_token=fv.eod_token,
        pad_token=fv.pad_token,
        vocab_size=fv.vocab_size,
        skip_bad_lines=fv.skip_bad_lines,
        num_shards=fv.num_shards,
        shard_size_mb=fv.shard_size_mb,
        validation_fraction=fv.validation_fraction,
        validation_documents=fv.validation_documents,
        seed=fv.seed,
        part_mb=fv.part_mb,
        layout=fv.layout,
    )
    output = fv.output.rstrip("/")
    shards = "*.tokens.npy" if fv.layout == "flat" else "*.array_record"
    for path, count in index.get("skipped_lines", {}).items():
        print(f"skipped {count:,} bad lines in {path}")
    print(
        f"prepared {index['documents']:,} documents, {index['tokens']:,} tokens in "
        f"{len(index['shards'])} shards: {output}/{shards} "
        f"(use kind='array_record', path='{output}')"
    )
    if "validation" in index:
        held = index["validation"]
        print(
            f"held out {held['documents']:,} documents, {held['tokens']:,} tokens in "
            f"{len(held['shards'])} shards: {output}/validation/{shards}"
        )
    return 0


PREPARE = Command(
    name="prepare",
    summary="tokenize text, JSON lines, Parquet, Arrow or token arrays into shards",
    usage="prepare INPUT... --output=DIR [flags]",
    description=(
        "Tokenizes the INPUT files, globs or HuggingFace dataset directories (plain, .gz or\n"
        ".zst) into shards in --output (flat token files, or ArrayRecord with\n"
        "--layout=array_record), with index.json and lengths.npy (and a\n"
        "held-out split in --output/validation). A rerun keeps finished parts and shards."
    ),
    define=_define_prepare,
    run=_prepare,
)


def _define_index(fv: flags.FlagValues, argv: Sequence[str]) -> None:
    from xlstm_data.cli.index_command import define_index

    define_index(fv, argv)


def _index(fv: flags.FlagValues, positional: list[str]) -> int:
    from xlstm_data.cli.index_command import run_index

    return run_index(fv, positional)


INDEX = Command(
    name="index",
    summary="write index.json and lengths.npy for ArrayRecord shards made elsewhere",
    usage="index PATH_GLOB... [flags]",
    description=(
        "Reads every record of the ArrayRecord shards matched by PATH_GLOB (one directory;\n"
        "int32 tokens, or UTF-8 text with --record_format=text), checks every id against the\n"
        "vocabulary and writes the index prepare writes beside them, for exact epoch lengths."
    ),
    define=_define_index,
    run=_index,
)


# ----------------------------------------------------------------------------
# inspect
# ----------------------------------------------------------------------------


def _define_inspect(fv: flags.FlagValues, argv: Sequence[str]) -> None:
    define_config_flag(
        fv,
        argv,
        "run config, a .py file with get_config() (required); override keys with "
        "--config.KEY=VALUE, e.g. --config.data.global_batch_size=32",
    )
    flags.DEFINE_string(
        "png", None, "write the plot here (default: ./<config name>.inspect.png)", flag_values=fv
    )
    flags.DEFINE_integer(
        "steps",
        None,
        "steps of the real pipeline to plot (default: num_train_steps, at most 300)",
        flag_values=fv,
    )
    flags.DEFINE_integer(
        "cpu_devices",
        None,
        "CPU devices to plan the mesh with (default: what the mesh's fixed axes need)",
        flag_values=fv,
    )
    flags.DEFINE_string(
        "workdir",
        None,
        "a run of this config: warn when the files behind its latest checkpoint changed",
        flag_values=fv,
    )


def _inspect(fv: flags.FlagValues, positional: list[str]) -> int:
    from xlstm_data.config.data_config import validate_data_config

    if positional:
        raise UsageError(f"unexpected arguments {positional}; inspect takes only flags")
    if fv.config is None:
        raise UsageError("--config is required: a config .py file with get_config()")
    config = run_config(fv)
    validate_data_config(config.data)  # a bad key is refused before JAX and grain load

    import jax

    from xlstm_data.cli.inspect_config import inspect_config, smallest_device_count

    # A CPU-only machine plans the mesh on as many CPU devices as its fixed axes need.
    devices = fv.cpu_devices or smallest_device_count(config)
    with contextlib.suppress(RuntimeError):  # JAX already started: keep its devices
        jax.config.update("jax_num_cpu_devices", devices)
    inspect_config(
        config,
        name=fv["config"].config_filename,
        png=fv.png,
        plot_steps=fv.steps,
        workdir=fv.workdir,
        out=sys.stdout,
        err=sys.stderr,
    )
    return 0


INSPECT = Command(
    name="inspect",
    summary="print the data plan of a config and plot its first steps",
    usage="inspect --config=FILE [--config.KEY=VALUE ...] [flags]",
    description=(
        "Prints each source's documents, tokens and expected share, the ramp-up stages,\n"
        "the epoch length and one decoded row, and plots the first steps of the real pipeline."
    ),
    define=_define_inspect,
    run=_inspect,
)


# ----------------------------------------------------------------------------
# batch
# ----------------------------------------------------------------------------


def _define_batch(fv: flags.FlagValues, argv: Sequence[str]) -> None:
    define_config_flag(
        fv,
        argv,
        "run config, a .py file with get_config() (or give --workdir); override keys with "
        "--config.KEY=VALUE, e.g. --config.data.skip_steps=[[100,200]]",
    )
    flags.DEFINE_string(
        "workdir",
        None,
        "a run's directory: its data config and position come from its latest checkpoint",
        flag_values=fv,
    )
    flags.DEFINE_integer(
        "step", None, "the step to list (as the data config counts steps)", flag_values=fv
    )
    flags.DEFINE_string("steps", None, "steps A:B to list (B excluded)", flag_values=fv)
    flags.DEFINE_integer(
        "processes", 1, "data-loading processes, to show which one reads each row", flag_values=fv
    )
    flags.DEFINE_boolean("decode", False, "print each document piece's text", flag_values=fv)
    flags.DEFINE_integer(
        "chars", 200, "characters of text shown per piece with --decode (0: all)", flag_values=fv
    )
    flags.DEFINE_string(
        "jsonl",
        None,
        "also write one JSON record per row here (text too with --decode)",
        flag_values=fv,
    )


def _batch(fv: flags.FlagValues, positional: list[str]) -> int:
    from xlstm_data.cli.batch_contents import parse_steps, run_batch

    if positional:
        raise UsageError(f"unexpected arguments {positional}; batch takes only flags")
    if fv.config is None and not fv.workdir:
        raise UsageError("give --config=FILE or --workdir=DIR")
    if fv.processes < 1:
        raise UsageError(f"--processes={fv.processes} must be >= 1")
    config = run_config(fv) if fv.config is not None else None
    run_batch(
        config,
        fv.workdir,
        parse_steps(fv.step, fv.steps),
        processes=fv.processes,
        decode=fv.decode,
        jsonl=fv.jsonl,
        chars=fv.chars,
        out=sys.stdout,
        err=sys.stderr,
    )
    return 0


BATCH = Command(
    name="batch",
    summary="list the documents in each row of given steps (no data read)",
    usage="batch (--config=FILE | --workdir=DIR) (--step=N | --steps=A:B) [flags]",
    description=(
        "Lists, for every row of the global batch at each step, the pieces of documents in it\n"
        "(dataset, document index, token range) and the data host that reads it on\n"
        "--processes processes, from the plan alone. Step N is the batch after N trained steps\n"
        "(trained by update N+1), as ramp-up, mixture stages and data.skip_steps count steps."
    ),
    define=_define_batch,
    run=_batch,
)


# ----------------------------------------------------------------------------
# The dispatcher.
# ----------------------------------------------------------------------------


def _bench_main(argv: Sequence[str]) -> int:
    try:
        from bench.run import main as bench_main
    except ImportError as error:
        print(f"{PROG} bench: the bench package is not installed ({error})", file=sys.stderr)
        return 2
    return bench_main(list(argv))


COMMANDS: dict[str, Command] = {
    "prepare": PREPARE,
    "index": INDEX,
    "inspect": INSPECT,
    "batch": BATCH,
}
#: Subcommands with their own entry point (same flags as `python -m bench.run`).
DELEGATED = {"bench": ("run the benchmarks, or measure your config's pipeline", _bench_main)}


def _top_help() -> str:
    lines = [f"usage: {PROG} COMMAND [flags]   ({PROG} COMMAND --help for its flags)", ""]
    lines.append(__doc__.splitlines()[0])
    lines += ["", "commands:"]
    for name, command in COMMANDS.items():
        lines.append(f"  {name:<8} {command.summary}")
    for name, (summary, _) in DELEGATED.items():
        lines.append(f"  {name:<8} {summary}")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `xlstm-data` console script; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in _HELP_ARGS:
        print(_top_help(), end="", file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name in DELEGATED:
        return DELEGATED[name][1](rest)
    if name not in COMMANDS:
        valid = [*COMMANDS, *DELEGATED]
        print(f"{PROG}: error: unknown command {name!r}; valid: {valid}", file=sys.stderr)
        return 2
    return run_command(COMMANDS[name], rest, f"{PROG} {name}")


if __name__ == "__main__":
    sys.exit(main())
