"""`xlstm-data index PATH_GLOB`: the lengths index for ArrayRecord shards made elsewhere.

Kept apart from `main` (which registers it) so the dispatcher stays small;
`main` imports this module only when the command runs.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from absl import flags

from xlstm_data.errors import DataConfigError


def define_index(fv: flags.FlagValues, argv: Sequence[str]) -> None:
    """The flags of `index`, defined on `fv`."""
    del argv
    from xlstm_data.cli.common import define_tokenizer_flags
    from xlstm_data.sources.corpus_index import RECORD_FORMATS

    flags.DEFINE_string(
        "record_format",
        "tokens",
        f"what each record holds: {' or '.join(RECORD_FORMATS)} (raw little-endian int32 ids, "
        "or UTF-8 text counted with --tokenizer)",
        flag_values=fv,
    )
    define_tokenizer_flags(
        fv,
        tokenizer_help=(
            "byte, or a local HuggingFace tokenizer .json: encodes text records; for token "
            "records the tokenizer the ids come from"
        ),
        vocab_help="for ids the tokenizer does not make",
    )
    flags.DEFINE_integer("workers", 1, "processes reading shards in parallel", flag_values=fv)


def run_index(fv: flags.FlagValues, positional: list[str]) -> int:
    """Indexes the shards matched by the positional globs; prints the config to use."""
    from xlstm_data.cli.common import UsageError, progress_bar
    from xlstm_data.prepare import paths
    from xlstm_data.prepare.index_shards import index_shards
    from xlstm_data.sources.corpus_index import INDEX_FILE

    if not positional:
        raise UsageError(
            "no PATH_GLOB given; pass the shards' files or glob, e.g. 'data/shards/*.array_record'"
        )

    def progress(done: int, total: int, shard: dict[str, Any]) -> None:
        del shard
        progress_bar("shards", done, total)

    index = index_shards(
        positional,
        record_format=fv.record_format,
        tokenizer=fv.tokenizer,
        vocab_size=fv.vocab_size,
        eod_token=fv.eod_token,
        pad_token=fv.pad_token,
        workers=fv.workers,
        progress=progress,
    )
    directory = paths.parent(index["shards"][0]["source"])
    path = _config_path(positional, directory, [shard["source"] for shard in index["shards"]])
    print(
        f"indexed {index['documents']:,} documents, {index['tokens']:,} tokens in "
        f"{len(index['shards'])} shards: {paths.join(directory, INDEX_FILE)} "
        f"(use kind='array_record', path={path!r}, record_format={fv.record_format!r})"
    )
    return 0


def _config_path(patterns: list[str], directory: str, shards: list[str]) -> str | list[str]:
    """A `path` that matches exactly the indexed shards (a source reading any other file of
    the directory, such as index.json, is refused): the given glob, else DIR/*.array_record,
    else the shards themselves."""
    from xlstm_data.prepare import paths
    from xlstm_data.sources.base import expand_files

    if paths.is_uri(directory):  # read through a mount, at a path only the user knows
        return patterns[0] if len(patterns) == 1 else patterns
    candidates: list[str | list[str]] = [os.path.join(directory, "*.array_record")]
    candidates.insert(0, patterns[0] if len(patterns) == 1 else patterns)
    wanted = sorted(shards)
    for candidate in candidates:
        try:
            matched = [os.path.abspath(path) for path in expand_files(candidate, "path")]
        except DataConfigError:
            continue
        if sorted(matched) == wanted:
            return candidate
    return shards
