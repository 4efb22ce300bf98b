"""An on-disk cache of document token lengths for sources that tokenize on read.

A global data plan needs every document's token count before any document is
read for training. Prepared shards carry `lengths.npy`; text and JSONL files
do not, and counting their tokens means tokenizing the whole corpus. That is
done once per machine: the result is stored under the cache directory keyed
by everything the counts depend on (each file's absolute path, size and
mtime, the tokenizer, the document unit and JSONL fields, and this module's
format version), so the next source built on the same files reads the counts
back instead of rescanning, and any change to a file or to the tokenization
makes a new key rather than a stale answer.

The directory is `$XLSTM_DATA_CACHE_DIR`, else `$XDG_CACHE_HOME/xlstm-data`,
else `~/.cache/xlstm-data`; entries are `lengths/<sha256>.npy`, written to a
temporary file and renamed, so concurrent writers (hosts sharing a home
directory, tests in parallel) never leave a half-written entry. The cache is
an optimisation only: an unwritable directory costs a warning and keeps the
counts in memory, and an unreadable or mismatched entry is recomputed.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import os
import tempfile
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from absl import logging

from xlstm_data.sources.tokenizers import ByteTokenizer, HFTokenizer, Tokenizer

__all__ = [
    "CACHE_DIR_ENV",
    "LENGTHS_CACHE_VERSION",
    "cache_dir",
    "cache_key",
    "cached_lengths",
    "file_signature",
    "lengths_path",
    "tokenizer_identity",
    "write_atomically",
]

#: Environment variable naming the cache directory.
CACHE_DIR_ENV = "XLSTM_DATA_CACHE_DIR"
#: Part of every key; bump when the meaning or layout of an entry changes.
LENGTHS_CACHE_VERSION = 1


def cache_dir() -> str:
    """The xlstm-data cache directory (not created here).

    Returns:
      `$XLSTM_DATA_CACHE_DIR` if set, else `$XDG_CACHE_HOME/xlstm-data`, else
      `~/.cache/xlstm-data`.
    """
    explicit = os.environ.get(CACHE_DIR_ENV)
    if explicit:
        return os.path.abspath(os.path.expanduser(explicit))
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(os.path.abspath(base), "xlstm-data")


def lengths_path(key: str) -> str:
    """Where the lengths stored under `key` live."""
    return os.path.join(cache_dir(), "lengths", f"{key}.npy")


def file_signature(path: str) -> list[Any]:
    """`[absolute path, size, mtime_ns]` of a file: what its cached counts depend on."""
    stat = os.stat(path)
    return [os.path.abspath(path), int(stat.st_size), int(stat.st_mtime_ns)]


def tokenizer_identity(tokenizer: Tokenizer) -> dict[str, Any] | None:
    """What makes two tokenizers encode alike, or None when that cannot be told.

    The byte tokenizer is fixed. A HuggingFace tokenizer is its file (path,
    size and mtime: a replaced file is another tokenizer), whether it adds
    special tokens, its vocabulary size and the `tokenizers` version. Any
    other object (subclasses of these included: they may encode otherwise) has
    no identity that survives the process, so its counts are kept in memory
    only.
    """
    if type(tokenizer) is ByteTokenizer:
        return {"kind": "byte", "vocab_size": int(tokenizer.vocab_size)}
    if type(tokenizer) is HFTokenizer:
        try:
            version = importlib.metadata.version("tokenizers")
        except importlib.metadata.PackageNotFoundError:
            version = None
        return {
            "kind": "hf",
            "file": file_signature(tokenizer.path),
            "add_special_tokens": bool(getattr(tokenizer, "_add_special_tokens", False)),
            "vocab_size": int(tokenizer.vocab_size),
            "tokenizers_version": version,
        }
    return None


def cache_key(parts: Mapping[str, Any]) -> str:
    """The sha256 (hex) of `parts` and the cache format version, as canonical JSON."""
    payload = {"lengths_cache_version": LENGTHS_CACHE_VERSION, **parts}
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _load(path: str, count: int, dtype: np.dtype) -> np.ndarray | None:
    """The entry at `path` if it is `count` lengths of `dtype`, else None (a miss)."""
    if not os.path.exists(path):
        return None
    try:
        lengths = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError, EOFError) as error:  # EOFError: an empty file
        logging.warning("lengths cache: ignoring unreadable entry %s (%s).", path, error)
        return None
    if lengths.ndim != 1 or lengths.dtype != dtype or lengths.shape[0] != count:
        logging.warning(
            "lengths cache: ignoring entry %s: shape %s dtype %s, expected (%d,) %s.",
            path,
            lengths.shape,
            lengths.dtype,
            count,
            dtype.name,
        )
        return None
    return np.asarray(lengths)  # A plain read-only array over the mapped file.


def write_atomically(path: str, write: Callable[[Any], None]) -> None:
    """Writes a cache entry (`write` fills a binary file) via a temporary file renamed into place.

    Concurrent writers (hosts sharing a home directory, tests in parallel)
    therefore never leave a half-written entry. Raises OSError, after removing
    the temporary file, when the directory cannot be written.
    """
    directory = os.path.dirname(path)
    partial = None
    try:
        os.makedirs(directory, exist_ok=True)
        fd, partial = tempfile.mkstemp(prefix=".partial-", suffix=".tmp", dir=directory)
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())  # a crash after the rename must not leave an empty entry
        os.replace(partial, path)
    except OSError:
        if partial is not None:
            with contextlib.suppress(OSError):
                os.remove(partial)
        raise


def _store(path: str, lengths: np.ndarray) -> bool:
    """Writes `lengths` to `path` atomically; False (after a warning) if it cannot."""
    try:
        write_atomically(path, lambda f: np.save(f, lengths, allow_pickle=False))
        return True
    except OSError as error:
        logging.warning(
            "lengths cache: cannot write %s (%s: %s); keeping the document lengths in memory "
            "only, so the next process rescans the files. Set %s to a writable directory to "
            "keep them.",
            path,
            type(error).__name__,
            error,
            CACHE_DIR_ENV,
        )
        return False


def cached_lengths(
    parts: Mapping[str, Any] | None,
    count: int,
    compute: Callable[[], np.ndarray],
    what: str,
    dtype: np.dtype | type = np.int64,
    check: Callable[[np.ndarray], bool] | None = None,
) -> np.ndarray:
    """Document lengths from the cache, or computed by `compute` and then stored.

    Args:
      parts: Everything the lengths depend on (JSON-serialisable), or None to
        compute without the disk cache.
      count: The number of documents; an entry of another size is a miss.
      compute: Returns the lengths (1-D, `count` entries) when not cached.
      what: Names the source in log messages.
      dtype: The entry's integer dtype; an entry of another is a miss. int32
        halves what a start maps (400 MB at 10^8 documents, not 800).
      check: Looks at an entry found (a sample of it against the files): one
        it refuses is counted again and replaced, with a warning.

    Returns:
      A read-only 1-D array of `count` lengths of `dtype` (memory-mapped when
      read from the cache).
    """
    dtype = np.dtype(dtype)
    path = None if parts is None else lengths_path(cache_key(parts))
    if path is not None:
        found = _load(path, count, dtype)
        if found is not None and check is not None and not check(found):
            logging.warning(
                "%s: the cached lengths in %s do not match the files; counting them again.",
                what,
                path,
            )
            found = None
        if found is not None:
            logging.info("%s: read %d document lengths from %s.", what, count, path)
            return found
    logging.info("%s: counting the tokens of %d documents (done once per machine).", what, count)
    computed = np.asarray(compute())
    if computed.size and not np.can_cast(computed.dtype, dtype):  # a pass only when narrowing
        bounds = np.iinfo(dtype)
        if int(computed.max()) > bounds.max or int(computed.min()) < bounds.min:
            raise ValueError(f"{what}: a document length does not fit {dtype.name}.")
    lengths = np.ascontiguousarray(computed, dtype=dtype)
    if lengths.shape != (count,):
        raise ValueError(f"{what}: computed {lengths.shape} lengths for {count} documents.")
    if path is not None and _store(path, lengths):
        logging.info("%s: stored the document lengths in %s.", what, path)
    lengths.flags.writeable = False
    return lengths
