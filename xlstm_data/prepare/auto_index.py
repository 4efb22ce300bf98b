"""Lengths for ArrayRecord shards made elsewhere, counted on first use.

MaxText and others write ArrayRecord shards of UTF-8 text (or int32 ids)
without the `index.json` + `lengths.npy` that the plan reads its document
lengths from. Rather than refuse them until the user runs `xlstm-data index`,
the first run counts them itself, with the same code and checks as that
command (every shard in parallel processes, every id checked against the
vocabulary, progress logged):

- where the shards' directory is writable, it writes the index beside them,
  so every later start (and every other host on the same storage) reads it as
  it reads prepared shards;
- where it is not, the counts go to the lengths cache
  (`sources.lengths_cache`), keyed by the files and the tokenizer, so a
  second start on this machine reads them back.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from absl import logging

from xlstm_data.prepare import index_shards
from xlstm_data.sources import lengths_cache
from xlstm_data.sources.array_record import ArrayRecordSource
from xlstm_data.sources.mapped import MappedSource
from xlstm_data.sources.tokenizers import ByteTokenizer, HFTokenizer, Tokenizer
from xlstm_data.sources.with_lengths import WithLengths

#: A count that runs longer than this logs its progress, every this many seconds.
PROGRESS_SECONDS = 10.0


def tokenizer_spec(tokenizer: Tokenizer | None) -> str | None:
    """The `xlstm-data index --tokenizer` value that makes `tokenizer`, or None if none does.

    Token shards read without a tokenizer name no vocabulary to check their
    ids against, so no index can be written for them: None.
    """
    if tokenizer is None:
        return None
    if type(tokenizer) is ByteTokenizer:
        return "byte"
    if type(tokenizer) is HFTokenizer:
        return tokenizer.path
    return None


def with_lengths(
    what: str,
    source: ArrayRecordSource,
    reopen: Callable[[], ArrayRecordSource],
    *,
    workers: int | None = None,
) -> Any:
    """`source` if it knows its lengths, else the same shards with their lengths counted.

    Args:
      what: Names the dataset in logs (e.g. "data.train.web").
      source: The opened shards.
      reopen: Opens the shards again (after an index was written beside them).
      workers: Processes counting shards (default: one per core).

    Returns:
      A source that knows its lengths, or `source` itself when no tokenizer
      can be named for the counting processes (none, or a custom object):
      the factories then count its lengths with `MappedSource` in this process.
    """
    if source.has_lengths():
        return source
    spec = tokenizer_spec(source.tokenizer)
    if spec is None:
        return source
    files = list(source.files)
    workers = workers or os.cpu_count() or 1
    directory = os.path.dirname(os.path.abspath(files[0]))
    one_directory = all(os.path.dirname(os.path.abspath(f)) == directory for f in files)
    arguments = dict(
        record_format=source.record_format,
        tokenizer=spec,
        vocab_size=source.vocab_size,
        workers=workers,
        progress=_progress(what, len(files)),
    )
    if one_directory and os.access(directory, os.W_OK):
        logging.info(
            "%s: %d ArrayRecord shards have no index; counting their documents' tokens once "
            "and writing index.json and lengths.npy to %s",
            what,
            len(files),
            directory,
        )
        index_shards.index_shards(files, **arguments)
        return reopen()
    return _with_cached_lengths(
        what, source, lambda: index_shards.count_lengths(files, **arguments)
    )


def with_lengths_counted_here(what: str, source: ArrayRecordSource) -> Any:
    """Token-id shards without a tokenizer, their lengths counted in this process once per machine.

    No index is written for them (no vocabulary names what their ids may be),
    but their counts depend on the files alone, so the lengths cache keeps
    them. The factories used to count such shards on every start: 5.4 s per
    start for `bench/resume`'s 3-source corpus (2 x 10^5 documents), and the
    documents were then read one by one instead of in one `read_many`.

    Args:
      what: Names the dataset in logs.
      source: ArrayRecord shards of int32 token ids, no tokenizer, no index.
    """
    # Ids are checked against `source.vocab_size` as they are counted.
    return _with_cached_lengths(what, source, lambda: MappedSource(source, (), name=what).lengths())


def _with_cached_lengths(
    what: str, source: ArrayRecordSource, count: Callable[[], np.ndarray]
) -> WithLengths:
    """`source` with the lengths cache's entry for its files, made by `count` on a miss."""
    parts = {
        "source": "ArrayRecordSource",
        "files": [lengths_cache.file_signature(f) for f in source.files],
        "record_format": source.record_format,
        "tokenizer": lengths_cache.tokenizer_identity(source.tokenizer),
        "vocab_size": source.vocab_size,
    }
    return WithLengths(source, lengths_cache.cached_lengths(parts, len(source), count, what))


def _progress(what: str, total: int) -> index_shards.Progress:
    started = time.monotonic()
    last = [started]

    def report(done: int, _: int, __: dict[str, Any]) -> None:
        now = time.monotonic()
        if now - last[0] >= PROGRESS_SECONDS or (done == total and now - started >= 1):
            last[0] = now
            logging.info(
                "%s: counted %d of %d shards (%.0f%%) in %.0f s",
                what,
                done,
                total,
                100 * done / total,
                now - started,
            )

    return report
