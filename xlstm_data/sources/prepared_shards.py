"""Which reader a config's shard path needs: the layout recorded in `index.json` decides.

`xlstm-data prepare` writes flat token shards by default and ArrayRecord
shards on request (`--layout`), and ArrayRecord shards also come from other
pipelines (indexed by `xlstm-data index`). A config names all of them the same
way, `kind="array_record"` with a `path` that is the prepared directory or a
glob of its shards, so that a corpus prepared again in the other layout needs
no config change; this module maps that path to the files and the source class.
"""

from __future__ import annotations

import os
from typing import Any

from xlstm_data.errors import DataConfigError
from xlstm_data.sources.base import PathPattern, TokenizerSpec, TokenSource, expand_files
from xlstm_data.sources.corpus_index import INDEX_FILE, read_index
from xlstm_data.sources.flat_tokens import TOKENS_SUFFIX, FlatTokenSource


def shard_files(path: PathPattern, arg: str = "path") -> tuple[list[str], str]:
    """The shard files `path` names and their layout ("array_record" or "flat").

    Args:
      path: A prepared directory (its `index.json` lists the shards), or a
        glob/path of shard files, or a list of them.
      arg: The config key or argument named in errors.

    Raises:
      DataConfigError: If `path` matches no file, is a directory without an
        index, or mixes flat shards with other files.
      DataReadError: If a directory's `index.json` is not readable.
    """
    if isinstance(path, (str, os.PathLike)) and os.path.isdir(os.path.expanduser(path)):
        directory = os.path.expanduser(os.fspath(path))
        index = read_index(directory)
        if index is None:
            raise DataConfigError(
                f"{arg}={os.fspath(path)!r} is a directory without {INDEX_FILE}, so its shards "
                "are not known; pass the directory `xlstm-data prepare` wrote, a glob of the "
                f"shards such as {os.path.join(directory, '*.array_record')!r}, or index "
                "ArrayRecord shards first with `xlstm-data index`."
            )
        files = [os.path.join(directory, shard["file"]) for shard in index["shards"]]
        return files, index.get("layout", "array_record")
    try:
        files = expand_files(path, arg)
    except DataConfigError as error:
        hint = _flat_directory_hint(path)
        if hint is None:
            raise
        raise DataConfigError(f"{error} {hint}") from error
    flat = [name.endswith(TOKENS_SUFFIX) for name in files]
    if any(flat) and not all(flat):
        other = files[flat.index(False)]
        raise DataConfigError(
            f"{arg}={path!r} matches flat token shards (*{TOKENS_SUFFIX}) and {other!r}; pass "
            "the prepared directory, or a glob of one kind of shard."
        )
    return files, "flat" if all(flat) else "array_record"


def _flat_directory_hint(path: PathPattern) -> str | None:
    """Where a glob matched nothing in a directory of flat shards, the path to use instead."""
    if not isinstance(path, (str, os.PathLike)):
        return None
    directory = os.path.dirname(os.path.expanduser(os.fspath(path)))
    try:
        index = read_index(directory) if os.path.isdir(directory) else None
    except Exception:  # a broken index gives no hint; its own error comes on opening
        return None
    if index is None or index.get("layout", "array_record") != "flat":
        return None
    return (
        f"{directory} holds shards `xlstm-data prepare` wrote in the flat layout "
        f"(*{TOKENS_SUFFIX}, see its {INDEX_FILE}): pass path={directory!r}."
    )


def open_shards(
    path: PathPattern,
    record_format: str = "tokens",
    tokenizer: TokenizerSpec = None,
    vocab_size: int | None = None,
    *,
    unprepared_tokenizer: TokenizerSpec = None,
    arg: str = "path",
) -> TokenSource:
    """The source of the shards `path` names, in the layout their index records.

    Args:
      path: A prepared directory, or a glob/path (or list) of shard files.
      record_format: For ArrayRecord shards, "tokens" or "text"; flat shards
        hold token ids only.
      tokenizer: As `ArrayRecordSource` / `FlatTokenSource` take it.
      vocab_size: As they take it.
      unprepared_tokenizer: For ArrayRecord shards without an index (see
        `ArrayRecordSource`).
      arg: The config key named in errors.

    Returns:
      A `FlatTokenSource` or an `ArrayRecordSource`.

    Raises:
      DataConfigError: On a bad path or argument (see `shard_files`), or
        `record_format="text"` for flat shards.
    """
    from xlstm_data.sources.array_record import ArrayRecordSource

    files, layout = shard_files(path, arg)
    if layout == "flat":
        if record_format != "tokens":
            raise DataConfigError(
                f"{arg}={path!r} holds flat token shards, which store token ids, but "
                f"record_format={record_format!r}; leave record_format at 'tokens'."
            )
        return FlatTokenSource(files, tokenizer=tokenizer, vocab_size=vocab_size)
    given: Any = files if isinstance(path, (str, os.PathLike)) and os.path.isdir(path) else path
    return ArrayRecordSource(
        given,
        record_format,
        tokenizer=tokenizer,
        vocab_size=vocab_size,
        unprepared_tokenizer=unprepared_tokenizer,
    )
