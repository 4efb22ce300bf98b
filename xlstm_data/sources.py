"""Random-access document sources: where token ids enter the pipeline.

Every source here is a grain random-access data source (`__len__`,
`__getitem__`) whose elements are documents `{"tokens": int32 1-D array}`.
Global shuffling, sharding and checkpointing in grain rely only on indices, so a
source must return the same document for the same index in every process and in
any access order.

Sources are built in the launcher process and pickled into grain worker
processes; they therefore validate their arguments (and peek at the first
record) at construction, keep only picklable state, and open file handles
lazily in the process that reads. Corrupt or mismatched data raises
`DataReadError` naming the file and record, so a bad shard can be found without
reading our code.

Every source also reports every document's token count through `lengths()`
without the pipeline reading documents: a global data plan (and an exact epoch
length) is fixed before training starts. Synthetic lengths are drawn from the
seed, prepared shards carry `lengths.npy`, in-memory documents are counted
once, and text/JSONL files are tokenized once per machine with the counts kept
in the on-disk cache of `xlstm_data.lengths_cache`. ArrayRecord files that
`xlstm-data prepare` did not write have no lengths: `lengths()` raises naming
the command, and `has_lengths()` lets a caller ask first.
"""

from __future__ import annotations

import abc
import bisect
import contextlib
import functools
import glob
import json
import math
import mmap
import numbers
import operator
import os
import threading
from array import array
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, SupportsIndex

import grain
import numpy as np
from absl import logging

from xlstm_data import lengths_cache
from xlstm_data.checks import check_int
from xlstm_data.corpus_index import INDEX_FILE, PreparedCorpus, prepared_corpus
from xlstm_data.errors import DataConfigError, DataReadError
from xlstm_data.tokenizers import Tokenizer, get_tokenizer

__all__ = [
    "ArrayRecordSource",
    "InMemorySource",
    "SyntheticSource",
    "TextFileSource",
    "TokenSource",
    "as_token_source",
    "write_array_record",
]

Document = dict[str, np.ndarray]
PathPattern = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]
TokenizerSpec = Tokenizer | str | None

_INT32_MAX = int(np.iinfo(np.int32).max)
_RECORD_FORMATS = ("tokens", "text")
TEXT_UNITS = ("line", "file")


class TokenSource(abc.ABC):
    """Base class of the sources in this module.

    Subclasses implement `__len__` and `_read`; this class handles index
    normalisation and wraps the token array in a document dict.

    Attributes:
      vocab_size: Exclusive upper bound that every token id is checked against
        when read, or None when the source does not know its vocabulary.
    """

    vocab_size: int | None = None
    _tokenizer: Tokenizer | None = None

    @property
    def tokenizer(self) -> Tokenizer | None:
        """The tokenizer this source's ids come from, or None when it has none.

        Its `eod_id` is the end-of-document id the source's documents expect
        (`iterators_from_config` checks `data.eod_token_id` against it).
        Synthetic ids and bare token arrays have no tokenizer.
        """
        return self._tokenizer

    @abc.abstractmethod
    def __len__(self) -> int:
        """Returns the number of documents."""

    @abc.abstractmethod
    def _read(self, index: int) -> np.ndarray:
        """Returns the int32 tokens of document `index` (already in range)."""

    def lengths(self) -> np.ndarray:
        """Every document's token count, without the pipeline reading the documents.

        Returns:
          A 1-D int64 array with `len(self)` entries; entry i equals
          `len(self[i]["tokens"])`. It may be read-only and shared: copy it
          before changing it.

        Raises:
          DataConfigError: If this source cannot know its lengths (see
            `has_lengths`).
        """
        raise DataConfigError(
            f"{type(self).__name__} does not report its document lengths; implement "
            "lengths() returning one int64 token count per document."
        )

    def has_lengths(self) -> bool:
        """Whether `lengths()` answers rather than raising DataConfigError.

        It may still take a while (a text source tokenizes its files once per
        machine) and raise DataReadError on bad data.
        """
        return type(self).lengths is not TokenSource.lengths

    def __getitem__(self, index: SupportsIndex) -> Document:
        """Reads one document.

        Args:
          index: Document index in [-len, len).

        Returns:
          `{"tokens": np.ndarray}` with a 1-D int32 array.

        Raises:
          IndexError: If `index` is out of range.
          DataReadError: If the stored document cannot be decoded.
        """
        i = operator.index(index)
        n = len(self)
        if not 0 <= i < n:  # in range is the hot path: the pipeline reads in order
            if not -n <= i < 0:
                raise IndexError(
                    f"{type(self).__name__}: index {i} is out of range; "
                    f"valid indices are 0..{n - 1}."
                )
            i += n
        return {"tokens": self._read(i)}


# ----------------------------------------------------------------------------
# Helpers shared by the sources.
# ----------------------------------------------------------------------------


def expand_files(pattern: PathPattern, arg: str = "pattern") -> list[str]:
    """Expands a glob, a path, or a list of them into a sorted list of files.

    Args:
      pattern: A glob/path or a sequence of globs/paths. `**` recurses.
      arg: Argument name used in error messages.

    Returns:
      Sorted, de-duplicated file paths.

    Raises:
      DataConfigError: If `pattern` has a wrong type, is empty, or one of its
        entries matches no file.
    """
    if isinstance(pattern, (str, os.PathLike)):
        patterns = [pattern]
    elif isinstance(pattern, Sequence) and not isinstance(pattern, (bytes, bytearray)):
        patterns = list(pattern)
    else:
        raise DataConfigError(
            f"{arg}={pattern!r} must be a path/glob string or a list of them, "
            f"not {type(pattern).__name__}."
        )
    if not patterns:
        raise DataConfigError(f"{arg}=[] is empty; pass at least one path or glob.")
    files: set[str] = set()
    for p in patterns:
        if not isinstance(p, (str, os.PathLike)):
            raise DataConfigError(
                f"{arg} entries must be path/glob strings; got {p!r} ({type(p).__name__})."
            )
        text = os.path.expanduser(os.fspath(p))
        if os.path.isfile(text):
            matches = [text]
        else:
            matches = [m for m in glob.glob(text, recursive=True) if os.path.isfile(m)]
        if not matches:
            hint = (
                f" It is a directory; use {os.path.join(text, '*')!r}."
                if os.path.isdir(text)
                else ""
            )
            raise DataConfigError(
                f"{arg}={os.fspath(p)!r} matches no file (relative paths are resolved against "
                f"{os.getcwd()!r}).{hint} Pass an existing file path or a glob such as "
                "'data/train-*.arrayrecord'."
            )
        files.update(matches)
    return sorted(files)


def _check_vocab_size(vocab_size: Any, arg: str = "vocab_size") -> int | None:
    """Validates an optional vocabulary size argument.

    Args:
      vocab_size: None or a positive integer that fits in int32 + 1.
      arg: Argument name used in error messages.

    Returns:
      The vocabulary size as int, or None.
    """
    if vocab_size is None:
        return None
    if (
        isinstance(vocab_size, bool)
        or not isinstance(vocab_size, numbers.Integral)
        or not 1 <= int(vocab_size) <= _INT32_MAX + 1
    ):
        raise DataConfigError(
            f"{arg}={vocab_size!r} is invalid; pass None or an integer in [1, 2**31]."
        )
    return int(vocab_size)


def _checked_int32(
    values: np.ndarray, vocab_size: int | None, where: str | Callable[[], str]
) -> np.ndarray:
    """Checks token ids are valid and returns them as a fresh int32 array.

    Args:
      values: 1-D integer array of token ids, any integer dtype.
      vocab_size: Exclusive upper bound, or None to check only the int32 range.
      where: Names the source and record for the error message (or makes the
        name, so that the hot path formats no string).

    Returns:
      A 1-D int32 array that does not share memory with cached state.

    Raises:
      DataReadError: If an id is negative, >= vocab_size, or overflows int32.
    """
    upper = _INT32_MAX + 1 if vocab_size is None else vocab_size
    if values.size and not _in_range(values, upper):
        bad = np.flatnonzero((values < 0) | (values >= upper))[0]
        bad_id = int(values[bad])
        if vocab_size is None:
            detail = (
                f"token id {bad_id} at position {bad} is not a valid token id "
                "(ids must be in [0, 2**31))"
            )
        else:
            detail = (
                f"token id {bad_id} at position {bad} is outside [0, {vocab_size}) "
                f"for vocab_size={vocab_size}; the data was tokenized with a different "
                "vocabulary, or vocab_size/tokenizer is wrong"
            )
        raise DataReadError(f"{_where_text(where)}: {detail}.")
    return np.array(values, dtype=np.int32, copy=True)


def _in_range(values: np.ndarray, upper: int) -> bool:
    """Whether every id is in [0, upper), in one pass for int32 (upper <= 2**31)."""
    if values.dtype == np.int32:
        # Negative int32 ids read as unsigned are >= 2**31 >= upper.
        return int(values.view(np.uint32).max()) < upper
    return int(values.min()) >= 0 and int(values.max()) < upper


def _spec_repr(spec: TokenizerSpec) -> str:
    """A tokenizer argument as an error message shows it."""
    if isinstance(spec, os.PathLike):
        return repr(os.fspath(spec))
    if spec is None or isinstance(spec, str):
        return repr(spec)
    return type(spec).__name__


def _where_text(where: str | Callable[[], str]) -> str:
    """The record named by `where` (or by calling it: hot paths format no string)."""
    return where if isinstance(where, str) else where()


def _decode_utf8(raw: bytes, where: str | Callable[[], str]) -> str:
    """Decodes UTF-8 strictly, raising DataReadError naming `where`."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataReadError(
            f"{_where_text(where)}: is not valid UTF-8 text (byte {e.start}: {e.reason}); the "
            "record may be token ids (record_format='tokens') or the file may use another encoding."
        ) from e


# ----------------------------------------------------------------------------
# ArrayRecord.
# ----------------------------------------------------------------------------


class ArrayRecordSource(TokenSource):
    """Documents stored one per record in ArrayRecord files.

    Records are either raw little-endian int32 token ids (`record_format=
    "tokens"`, what `write_array_record` writes for arrays) or UTF-8 text
    (`"text"`), tokenized on read. One grain `ArrayRecordDataSource` per file
    keeps the file of every global index known, so read errors name the file
    and the record index inside it.

    Token shards made by `xlstm-data prepare` carry an `index.json`: its
    vocabulary bounds every id read (unless `vocab_size` is given), its
    tokenizer is the default one, and a tokenizer that is not the one the
    shards were made with is refused, so the run's end-of-document id and the
    model's vocabulary follow the data rather than a default.
    """

    def __init__(
        self,
        pattern: PathPattern,
        record_format: str = "tokens",
        tokenizer: TokenizerSpec = None,
        vocab_size: int | None = None,
        *,
        unprepared_tokenizer: TokenizerSpec = None,
    ) -> None:
        """Opens the files, counts their records and decodes the first record.

        Args:
          pattern: Glob or path, or a list of them; matched files are sorted.
          record_format: "tokens" (int32 bytes) or "text" (UTF-8).
          tokenizer: Tokenizer or spec for `get_tokenizer`. Encodes text records
            (default byte tokenizer); for "tokens" it names where the ids come
            from (vocab_size, end-of-document id). For prepared shards None
            means the tokenizer recorded in their `index.json`, and any other
            must match it.
          vocab_size: Exclusive bound checked for every token id. Defaults to
            the prepared index's vocab_size, else the tokenizer's; unchecked
            for "tokens" with none of them.
          unprepared_tokenizer: For "tokens" shards without a prepare index
            when neither `tokenizer` nor `vocab_size` is given: the tokenizer
            their ids are taken to come from (the config path passes "byte",
            so such ids are still checked).

        Raises:
          DataConfigError: On a bad argument, a pattern matching no file, a file
            that is not ArrayRecord, no records at all, or a tokenizer that is
            not the one prepared shards were made with.
          DataReadError: If the first record does not decode in `record_format`,
            or a prepare index disagrees with the files.
        """
        if record_format not in _RECORD_FORMATS:
            raise DataConfigError(
                f"ArrayRecordSource: record_format={record_format!r} is not valid; use one of "
                f"{list(_RECORD_FORMATS)}."
            )
        self._record_format = record_format
        explicit_vocab = _check_vocab_size(vocab_size, "ArrayRecordSource: vocab_size")
        if tokenizer is not None:
            self._tokenizer = get_tokenizer(tokenizer)
        self._files = expand_files(pattern, "ArrayRecordSource: pattern")
        self._sources: list[Any] = []
        lengths: list[int] = []
        for path in self._files:
            try:
                src = grain.sources.ArrayRecordDataSource(path)
            except Exception as e:  # The reader raises plain RuntimeError/ValueError.
                raise DataConfigError(
                    f"ArrayRecordSource: file {path!r} matched by pattern={pattern!r} is not a "
                    f"readable ArrayRecord file ({type(e).__name__}: {e}); narrow the pattern "
                    "to ArrayRecord files only."
                ) from e
            self._sources.append(src)
            lengths.append(len(src))
        self._ends = list(np.cumsum(lengths, dtype=np.int64).tolist())
        self._num_records = int(self._ends[-1])
        if self._num_records == 0:
            raise DataConfigError(
                f"ArrayRecordSource: pattern={pattern!r} matched {len(self._files)} file(s) but "
                "they hold no records; point it at non-empty ArrayRecord files."
            )
        self._prepared: PreparedCorpus | None = None
        if record_format == "tokens":
            self._prepared = prepared_corpus(self._files, lengths)
            if self._prepared is not None:
                self._tokenizer = self._prepared_tokenizer(self._prepared, tokenizer)
            elif tokenizer is None and explicit_vocab is None and unprepared_tokenizer:
                self._tokenizer = get_tokenizer(unprepared_tokenizer)
        elif self._tokenizer is None:
            self._tokenizer = get_tokenizer(None)
        vocab = explicit_vocab
        if vocab is None and self._prepared is not None:
            vocab = self._prepared.vocab_size
        if vocab is None and self._tokenizer is not None:
            vocab = int(self._tokenizer.vocab_size)
        self.vocab_size = vocab
        # Decode the first record now so a wrong record_format fails at launch.
        first_file = next(i for i, n in enumerate(lengths) if n > 0)
        self._read_local(first_file, 0, self._ends[first_file - 1] if first_file else 0)
        logging.info(
            "ArrayRecordSource: %d records in %d files (%s ... %s), record_format=%s, "
            "vocab_size=%s.",
            self._num_records,
            len(self._files),
            self._files[0],
            self._files[-1],
            record_format,
            vocab,
        )

    def _prepared_tokenizer(
        self, prepared: PreparedCorpus, tokenizer: TokenizerSpec
    ) -> Tokenizer | None:
        """The tokenizer of prepared shards: the index's, or `tokenizer` if it is the same.

        Token arrays prepared with a `vocab_size` beyond the recorded
        tokenizer's hold ids that tokenizer did not make (another tokenizer's,
        e.g. GPT-2's): they have no tokenizer unless one is named that covers
        their vocabulary, so its end-of-document id is not forced on them.

        Raises:
          DataConfigError: If `tokenizer` differs from the one the shards were
            made with (vocabulary size or end-of-document id), or is None and the
            index's tokenizer file is not on this machine.
        """
        index_file = prepared.index_files[0]
        if prepared.vocab_size > prepared.tokenizer_vocab_size:
            if tokenizer is None:
                return None
            named = self._tokenizer
            assert named is not None
            if int(named.vocab_size) < prepared.vocab_size:
                raise DataConfigError(
                    f"ArrayRecordSource: tokenizer={_spec_repr(tokenizer)} has "
                    f"{named.vocab_size} ids, fewer than the shards' vocab_size "
                    f"{prepared.vocab_size} (recorded in {index_file}); name the tokenizer "
                    "that made the ids, or None"
                )
            return named
        made_with = (
            f"tokenizer={prepared.tokenizer!r} (vocab_size {prepared.tokenizer_vocab_size}, "
            f"eod_id {prepared.eod_id}, recorded in {index_file})"
        )
        if tokenizer is None:
            if prepared.tokenizer != "byte" and not os.path.isfile(prepared.tokenizer):
                raise DataConfigError(
                    f"ArrayRecordSource: the shards were prepared with {made_with}, which is "
                    "not a file on this machine; pass tokenizer= the path of a copy of it."
                )
            found = get_tokenizer(prepared.tokenizer)
        else:
            found = self._tokenizer
            assert found is not None
        if (int(found.vocab_size), int(found.eod_id)) != (
            prepared.tokenizer_vocab_size,
            prepared.eod_id,
        ):
            raise DataConfigError(
                f"ArrayRecordSource: tokenizer={_spec_repr(tokenizer)} (vocab_size "
                f"{found.vocab_size}, eod_id {found.eod_id}) is not the tokenizer the shards "
                f"were prepared with: {made_with}; pass that tokenizer, or None to use it."
            )
        return found

    @property
    def files(self) -> list[str]:
        """The sorted list of files read."""
        return list(self._files)

    @property
    def prepared(self) -> PreparedCorpus | None:
        """What the `xlstm-data prepare` index says about the files, if they have one."""
        return self._prepared

    @property
    def record_format(self) -> str:
        """ "tokens" or "text"."""
        return self._record_format

    def __len__(self) -> int:
        return self._num_records

    def has_lengths(self) -> bool:
        """Whether every file read is a token shard listed in an `xlstm-data prepare` index."""
        return self._prepared is not None and self._prepared.slices is not None

    def lengths(self) -> np.ndarray:
        """Every document's token count from the `xlstm-data prepare` index.

        Read from the `lengths.npy` beside the shards, without reading any
        record.

        Returns:
          A 1-D int64 array with one entry per record, in source order.

        Raises:
          DataConfigError: If the files are not all token shards written by
            `xlstm-data prepare` (text records, or a directory without
            `index.json`); the message names the files and the command.
          DataReadError: If `lengths.npy` disagrees with `index.json`.
        """
        if not self.has_lengths():
            raise DataConfigError(self._no_lengths_message())
        assert self._prepared is not None
        lengths = self._prepared.lengths()
        assert lengths is not None
        return lengths

    def _no_lengths_message(self) -> str:
        """Why `lengths()` cannot answer, naming the files and the prepare command."""
        files = self._files_text()
        command = (
            "`xlstm-data prepare INPUT... --output=DIR` (INPUT: the raw text, JSONL or "
            ".npy/.npz token files the records came from; it writes token shards with "
            f"{INDEX_FILE} and lengths.npy), then read path='DIR/*.array_record'"
        )
        if self._record_format == "text":
            return (
                f"ArrayRecordSource({files}): the document lengths of record_format='text' "
                "records are not known without tokenizing every record; write token shards "
                f"with {command}."
            )
        directories = sorted({os.path.dirname(os.path.abspath(path)) for path in self._files})
        unprepared = [
            d for d in directories if not os.path.exists(os.path.join(d, INDEX_FILE))
        ] or directories
        return (
            f"ArrayRecordSource({files}): the document lengths are not known: there is no "
            f"{INDEX_FILE} with lengths.npy in {', '.join(map(repr, unprepared))} (the files "
            f"were not written by `xlstm-data prepare`); write token shards with {command}."
        )

    def _files_text(self) -> str:
        """The files read, as messages and repr show them."""
        if len(self._files) == 1:
            return repr(self._files[0])
        return f"{len(self._files)} files {self._files[0]!r}..{self._files[-1]!r}"

    def locate(self, index: int) -> tuple[str, int]:
        """Maps a global record index to (file path, record index in that file).

        Args:
          index: Global index in [0, len).

        Returns:
          The file and the record index within it.
        """
        file_idx = bisect.bisect_right(self._ends, index)
        start = self._ends[file_idx - 1] if file_idx else 0
        return self._files[file_idx], index - start

    def _read(self, index: int) -> np.ndarray:
        if len(self._ends) == 1:
            return self._read_local(0, index, index)
        file_idx = bisect.bisect_right(self._ends, index)
        start = self._ends[file_idx - 1] if file_idx else 0
        return self._read_local(file_idx, index - start, index)

    def _read_local(self, file_idx: int, local: int, global_index: int) -> np.ndarray:
        """Reads and decodes record `local` of file `file_idx`."""

        def where() -> str:
            path = self._files[file_idx]
            return (
                f"ArrayRecordSource: record {local} of file {path!r} (global index {global_index})"
            )

        try:
            raw = self._sources[file_idx][local]
        except Exception as e:
            raise DataReadError(f"{where()}: could not be read ({type(e).__name__}: {e}).") from e
        if self._record_format == "tokens":
            if len(raw) % 4:
                raise DataReadError(
                    f"{where()}: has {len(raw)} bytes, not a multiple of 4, so it is not valid "
                    "int32 token bytes (record_format='tokens'); if the records hold UTF-8 text "
                    "use record_format='text'."
                )
            values = np.frombuffer(raw, dtype="<i4")
        else:
            assert self._tokenizer is not None
            values = self._tokenizer.encode(_decode_utf8(raw, where()))
        return _checked_int32(values, self.vocab_size, where)

    def __repr__(self) -> str:
        return (
            f"ArrayRecordSource({self._files_text()}, records={self._num_records}, "
            f"record_format={self._record_format!r}, vocab_size={self.vocab_size})"
        )


def write_array_record(
    path: str | os.PathLike[str], records: Iterable[bytes | np.ndarray | str | Sequence[int]]
) -> int:
    """Writes records to an ArrayRecord file with group size 1 (for random access).

    Args:
      path: Output file; parent directories are created. Overwritten if present.
      records: bytes are written as is, str as UTF-8, integer arrays or lists
        as little-endian int32 bytes (the "tokens" record format).

    Returns:
      The number of records written.

    Raises:
      DataConfigError: If a record has an unsupported type or values that do
        not fit in int32. The partially written file is removed.
    """
    from array_record.python.array_record_module import ArrayRecordWriter

    out = os.fspath(path)
    parent = os.path.dirname(out)
    if parent:
        os.makedirs(parent, exist_ok=True)
    writer = ArrayRecordWriter(out, "group_size:1")
    count = 0
    ok = False
    try:
        for i, record in enumerate(records):
            writer.write(_record_bytes(record, i))
            count += 1
        ok = True
    finally:
        writer.close()
        if not ok and os.path.exists(out):
            os.remove(out)
    logging.info("write_array_record: wrote %d records to %s.", count, out)
    return count


def _record_bytes(record: Any, index: int) -> bytes:
    """Serialises one record for `write_array_record`."""
    if isinstance(record, (bytes, bytearray, memoryview)):
        return bytes(record)
    if isinstance(record, str):
        return record.encode("utf-8")
    if isinstance(record, (np.ndarray, list, tuple)):
        arr = np.asarray(record)
        if arr.size == 0:
            return b""
        if arr.ndim == 1 and arr.dtype.kind in "iu":
            if int(arr.min()) < -_INT32_MAX - 1 or int(arr.max()) > _INT32_MAX:
                raise DataConfigError(
                    f"write_array_record: record {index} has values outside the int32 range "
                    f"[{int(arr.min())}, {int(arr.max())}]; token ids must fit in int32."
                )
            return arr.astype("<i4").tobytes()
        raise DataConfigError(
            f"write_array_record: record {index} is an array of shape {arr.shape} dtype "
            f"{arr.dtype}; pass a 1-D integer array (token ids)."
        )
    raise DataConfigError(
        f"write_array_record: record {index} has type {type(record).__name__}; pass bytes, "
        "str, or a 1-D integer array/list."
    )


# ----------------------------------------------------------------------------
# Text / JSONL files.
# ----------------------------------------------------------------------------


class TextFileSource(TokenSource):
    """Documents from plain-text or JSONL files, tokenized on read.

    With `unit="line"` every non-blank line is a document; an index of
    (file, byte offset, length, line number) is built by one sequential scan at
    construction so reads are O(1) positioned reads. Lines of `.jsonl` files
    (or of all files when `jsonl_field` is set) are JSON objects whose
    `jsonl_field` (default "text") holds the document text. With
    `unit="file"` every non-empty file is one document.

    A file named `*.json` is refused unless `jsonl_field` says it is JSON lines
    or `json_as_text` says to tokenize its characters: such files are usually
    JSON lines under another suffix, and reading them as text would train on
    their braces, keys and escapes without any error.

    `lengths()` tokenizes every document once (on first call, not at
    construction) and keeps the counts on the instance and in the on-disk
    cache of `xlstm_data.lengths_cache`, keyed by the files' paths, sizes and
    mtimes (as found at construction) and the tokenization, so later sources
    on the same unchanged files read them back.
    """

    def __init__(
        self,
        pattern: PathPattern,
        tokenizer: TokenizerSpec = None,
        unit: str = "line",
        jsonl_field: str | None = None,
        json_as_text: bool = False,
    ) -> None:
        """Finds the files and indexes their documents.

        Args:
          pattern: Glob or path, or a list of them; matched files are sorted.
          tokenizer: Tokenizer or spec for `get_tokenizer`; default byte-level.
          unit: "line" (one document per non-blank line) or "file".
          jsonl_field: If set, every file is JSONL and this key holds the text;
            otherwise only files ending in ".jsonl" are JSONL, with key "text".
          json_as_text: Read files ending in ".json" or ".jsonl" as plain text,
            braces and all (for a corpus of JSON text; ignored with
            `jsonl_field`).

        Raises:
          DataConfigError: On a bad argument, a pattern matching no file, JSONL
            with unit="file", a ".json" file without `jsonl_field` or
            `json_as_text`, or no documents at all.
        """
        if unit not in TEXT_UNITS:
            raise DataConfigError(
                f"TextFileSource: unit={unit!r} is not valid; use one of {list(TEXT_UNITS)}."
            )
        if jsonl_field is not None and (not isinstance(jsonl_field, str) or not jsonl_field):
            raise DataConfigError(
                f"TextFileSource: jsonl_field={jsonl_field!r} is not valid; pass None or a "
                "non-empty key name such as 'text'."
            )
        self._unit = unit
        self._tokenizer = get_tokenizer(tokenizer)
        self.vocab_size = int(self._tokenizer.vocab_size)
        self._files = expand_files(pattern, "TextFileSource: pattern")
        if jsonl_field is None and not json_as_text:
            json_files = [f for f in self._files if f.lower().endswith(".json")]
            if json_files:
                raise DataConfigError(
                    f"TextFileSource: pattern={pattern!r} matches {json_files[0]!r}, a .json "
                    "file, which is not read as plain text (its braces and keys would become "
                    "tokens); if it holds one JSON object per line use kind='jsonl' "
                    "(jsonl_field='text', or the key holding the text), or narrow the pattern "
                    "to text files."
                )
        self._fields: list[str | None] = [
            jsonl_field
            if jsonl_field is not None
            else ("text" if f.lower().endswith(".jsonl") and not json_as_text else None)
            for f in self._files
        ]
        if unit == "file":
            jsonl = [f for f, fld in zip(self._files, self._fields, strict=True) if fld]
            if jsonl:
                raise DataConfigError(
                    f"TextFileSource: unit='file' cannot read JSONL file {jsonl[0]!r} (a JSONL "
                    "file holds one document per line); use unit='line'."
                )
        file_ids, offsets, lengths, line_numbers = array("i"), array("q"), array("q"), array("q")
        # The files as indexed: the lengths cache key, and what a later scan checks.
        self._signatures: list[list[Any]] = []
        for fi, path in enumerate(self._files):
            if unit == "file":
                self._signatures.append(lengths_cache.file_signature(path))
                size = self._signatures[-1][1]
                if size:
                    file_ids.append(fi)
                    offsets.append(0)
                    lengths.append(size)
                    line_numbers.append(1)
                continue
            offset = 0
            with open(path, "rb") as f:
                stat = os.fstat(f.fileno())
                self._signatures.append(
                    [os.path.abspath(path), int(stat.st_size), int(stat.st_mtime_ns)]
                )
                for line_number, line in enumerate(f, 1):
                    content = line.rstrip(b"\r\n")
                    if content.strip():
                        file_ids.append(fi)
                        offsets.append(offset)
                        lengths.append(len(content))
                        line_numbers.append(line_number)
                    offset += len(line)
        self._file_ids = np.frombuffer(file_ids, dtype=np.int32).copy()
        self._offsets = np.frombuffer(offsets, dtype=np.int64).copy()
        self._lengths = np.frombuffer(lengths, dtype=np.int64).copy()
        self._line_numbers = np.frombuffer(line_numbers, dtype=np.int64).copy()
        if not len(self._file_ids):
            raise DataConfigError(
                f"TextFileSource: pattern={pattern!r} matched {len(self._files)} file(s) but "
                f"they contain no documents (unit={unit!r}: all lines/files are blank)."
            )
        self._token_lengths: np.ndarray | None = None
        self._init_handles()
        logging.info(
            "TextFileSource: %d documents (unit=%s) in %d files (%s ... %s).",
            len(self._file_ids),
            unit,
            len(self._files),
            self._files[0],
            self._files[-1],
        )

    def _init_handles(self) -> None:
        """Creates the per-process (unpicklable) file handle cache."""
        self._fds: dict[int, int] = {}
        self._lock = threading.Lock()

    @property
    def files(self) -> list[str]:
        """The sorted list of files read."""
        return list(self._files)

    def __len__(self) -> int:
        return len(self._file_ids)

    def _fd(self, file_idx: int) -> int:
        """Returns this process's read-only descriptor for a file, opening it once."""
        fd = self._fds.get(file_idx)
        if fd is None:
            with self._lock:
                fd = self._fds.get(file_idx)
                if fd is None:
                    fd = os.open(self._files[file_idx], os.O_RDONLY)
                    self._fds[file_idx] = fd
        return fd

    def _where(self, index: int) -> str:
        """Names document `index` (its file, and line) for error messages."""
        path = self._files[int(self._file_ids[index])]
        if self._unit == "file":
            return f"TextFileSource: file {path!r} (document {index})"
        return (
            f"TextFileSource: line {int(self._line_numbers[index])} of file {path!r} "
            f"(document {index})"
        )

    def _read(self, index: int) -> np.ndarray:
        file_idx = int(self._file_ids[index])
        offset, length = int(self._offsets[index]), int(self._lengths[index])
        if self._unit == "file":
            with open(self._files[file_idx], "rb") as f:
                raw = f.read()
        else:
            raw = os.pread(self._fd(file_idx), length, offset)
        return self._tokens(raw, index)

    def _tokens(self, raw: bytes, index: int) -> np.ndarray:
        """Decodes and tokenizes the bytes of document `index`: reads and `lengths()` share it.

        Raises:
          DataReadError: If `raw` is not the document's length (the file
            changed), not UTF-8, not the expected JSON, or holds ids outside
            the vocabulary.
        """
        where = functools.partial(self._where, index)
        length = int(self._lengths[index])
        if len(raw) != length:
            raise DataReadError(
                f"{where()}: expected {length} bytes at offset {int(self._offsets[index])} but "
                f"read {len(raw)}; the file changed after the source was built. Rebuild the "
                "source."
            )
        text = _decode_utf8(raw, where)
        field = self._fields[int(self._file_ids[index])]
        if field is not None:
            text = _jsonl_text(text, field, where)
        return _checked_int32(self._tokenizer.encode(text), self.vocab_size, where)

    def lengths(self) -> np.ndarray:
        """Every document's token count: its tokens as read, counted once per machine.

        The first call on a machine tokenizes every document (one sequential
        pass per file); the counts are kept on this instance and in the
        lengths cache (`xlstm_data.lengths_cache`), so later calls and later
        sources on the same unchanged files with the same tokenization do not
        rescan. A custom tokenizer object (not "byte" or a HuggingFace file)
        has no identity to key the cache with: its counts stay in memory.

        Returns:
          A read-only 1-D int64 array; entry i equals `len(self[i]["tokens"])`.

        Raises:
          DataReadError: If a file changed since the source was built, or a
            document cannot be decoded or tokenized (naming file and line).
        """
        if self._token_lengths is None:
            self._token_lengths = lengths_cache.cached_lengths(
                self._lengths_cache_parts(), len(self), self._scan_lengths, repr(self)
            )
        return self._token_lengths

    def _lengths_cache_parts(self) -> dict[str, Any] | None:
        """What the token counts depend on, or None when the tokenizer cannot be identified."""
        tokenizer = lengths_cache.tokenizer_identity(self._tokenizer)
        if tokenizer is None:
            return None
        return {
            "source": "TextFileSource",
            "files": self._signatures,
            "tokenizer": tokenizer,
            "vocab_size": self.vocab_size,
            "unit": self._unit,
            "jsonl_fields": self._fields,
            "documents": len(self),
        }

    def _scan_lengths(self) -> np.ndarray:
        """Tokenizes every document, file by file, and returns the counts."""
        out = np.zeros(len(self), np.int64)
        starts = np.searchsorted(self._file_ids, np.arange(len(self._files) + 1))
        for file_idx, path in enumerate(self._files):
            first, end = int(starts[file_idx]), int(starts[file_idx + 1])
            if first == end:
                continue
            with open(path, "rb") as f:
                stat = os.fstat(f.fileno())
                if [int(stat.st_size), int(stat.st_mtime_ns)] != self._signatures[file_idx][1:]:
                    raise DataReadError(
                        f"TextFileSource: file {path!r} changed after the source was built "
                        f"(size/mtime {self._signatures[file_idx][1:]} then, "
                        f"{[int(stat.st_size), int(stat.st_mtime_ns)]} now); rebuild the source."
                    )
                with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
                    for index in range(first, end):
                        offset = int(self._offsets[index])
                        raw = data[offset : offset + int(self._lengths[index])]
                        out[index] = len(self._tokens(raw, index))
        return out

    def close(self) -> None:
        """Closes the file descriptors opened by this process."""
        with self._lock:
            fds, self._fds = self._fds, {}
        for fd in fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)

    def __del__(self) -> None:
        if getattr(self, "_fds", None):
            with contextlib.suppress(Exception):  # Interpreter shutdown may have torn down os.
                self.close()

    def __getstate__(self) -> dict[str, Any]:
        """Drops the open file descriptors and lock (per process) and the token counts.

        The counts (8 bytes a document) would be copied into every grain
        worker, which never needs them; `lengths()` reads them back from the
        cache if asked.
        """
        state = self.__dict__.copy()
        del state["_fds"], state["_lock"]
        state["_token_lengths"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Restores state; files are reopened lazily on first read."""
        self.__dict__.update(state)
        self._init_handles()

    def __repr__(self) -> str:
        files = (
            repr(self._files[0])
            if len(self._files) == 1
            else f"{len(self._files)} files {self._files[0]!r}..{self._files[-1]!r}"
        )
        fields = sorted({f for f in self._fields if f is not None})
        return (
            f"TextFileSource({files}, documents={len(self)}, unit={self._unit!r}, "
            f"jsonl_fields={fields}, tokenizer={self._tokenizer!r})"
        )


def _jsonl_text(line: str, field: str, where: str | Callable[[], str]) -> str:
    """Extracts `field` from one JSONL line, raising DataReadError naming `where`."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise DataReadError(
            f"{_where_text(where)}: is not valid JSON ({e.msg} at column {e.colno}); each line "
            "of a JSONL file must be one JSON object."
        ) from e
    if not isinstance(obj, Mapping):
        raise DataReadError(
            f"{_where_text(where)}: is a JSON {type(obj).__name__}, not an object with a "
            f"{field!r} key."
        )
    if field not in obj:
        keys = sorted(obj)[:10]
        raise DataReadError(
            f"{_where_text(where)}: JSON object has no {field!r} key (keys: {keys}); set "
            "jsonl_field to the key holding the document text."
        )
    value = obj[field]
    if not isinstance(value, str):
        raise DataReadError(
            f"{_where_text(where)}: JSON field {field!r} is a {type(value).__name__}, not a string."
        )
    return value


# ----------------------------------------------------------------------------
# In memory.
# ----------------------------------------------------------------------------


class InMemorySource(TokenSource):
    """Documents held in a Python sequence or a 2-D array, for tests and small data.

    Elements may be dicts with a "tokens" key, 1-D integer arrays or lists, or
    str (tokenized on read). The sequence is referenced, not copied; each read
    returns a fresh int32 copy. `lengths()` reads every document once and keeps
    the counts, so the sequence must not change after that.
    """

    def __init__(
        self,
        data: Sequence[Any] | np.ndarray,
        tokenizer: TokenizerSpec = None,
        vocab_size: int | None = None,
    ) -> None:
        """Validates the container and its first element.

        Args:
          data: A sequence of documents or a 2-D integer array (one row each).
          tokenizer: Tokenizer or spec for `get_tokenizer`, used for str
            elements (default byte-level).
          vocab_size: Exclusive bound checked for every token id. Defaults to
            the tokenizer's vocab_size when a tokenizer is given, else only the
            int32 range is checked.

        Raises:
          DataConfigError: If `data` is empty, not a sequence, or its first
            element has an unsupported type.
        """
        if isinstance(data, np.ndarray):
            if data.ndim == 2 and data.dtype.kind in "iu":
                pass
            elif not (data.ndim == 1 and data.dtype == object):
                raise DataConfigError(
                    f"InMemorySource: data is an array of shape {data.shape} dtype {data.dtype}; "
                    "pass a 2-D integer array (one document per row), or a list of 1-D arrays "
                    "(for a single document use [tokens])."
                )
        elif isinstance(data, (str, bytes, Mapping)) or not isinstance(data, Sequence):
            raise DataConfigError(
                f"InMemorySource: data of type {type(data).__name__} is not supported; pass a "
                "list of documents (dicts with 'tokens', 1-D int arrays/lists, or str) or a 2-D "
                "int array."
            )
        if len(data) == 0:
            raise DataConfigError("InMemorySource: data is empty; pass at least one document.")
        self._data = data
        self._tokenizer: Tokenizer | None = None if tokenizer is None else get_tokenizer(tokenizer)
        vocab = _check_vocab_size(vocab_size, "InMemorySource: vocab_size")
        if vocab is None and self._tokenizer is not None:
            vocab = int(self._tokenizer.vocab_size)
        self.vocab_size = vocab
        self._token_lengths: np.ndarray | None = None
        self._read(0)  # Validates the element type before any pipeline runs.

    def __len__(self) -> int:
        return len(self._data)

    def lengths(self) -> np.ndarray:
        """Every document's token count, computed once by reading each document.

        Returns:
          A read-only 1-D int64 array; entry i equals `len(self[i]["tokens"])`.

        Raises:
          DataConfigError: If a document has an unsupported type.
          DataReadError: If a document holds ids outside the vocabulary.
        """
        if self._token_lengths is None:
            data = self._data
            if isinstance(data, np.ndarray) and data.ndim == 2:
                lengths = np.full(len(data), data.shape[1], np.int64)
            else:
                lengths = np.fromiter(
                    (len(self._read(i)) for i in range(len(data))), np.int64, len(data)
                )
            lengths.flags.writeable = False
            self._token_lengths = lengths
        return self._token_lengths

    def _read(self, index: int) -> np.ndarray:
        element = self._data[index]
        where = f"InMemorySource: document {index}"
        if isinstance(element, Mapping):
            if "tokens" not in element:
                raise DataConfigError(
                    f"{where} is a dict without a 'tokens' key (keys: {sorted(element)[:10]}); "
                    "pass {'tokens': ids}."
                )
            element = element["tokens"]
        if isinstance(element, str):
            if self._tokenizer is None:
                self._tokenizer = get_tokenizer(None)
            values = self._tokenizer.encode(element)
            vocab = self.vocab_size if self.vocab_size is not None else self._tokenizer.vocab_size
            return _checked_int32(values, vocab, where)
        if not isinstance(element, (np.ndarray, list, tuple)):
            raise DataConfigError(
                f"{where} has unsupported type {type(element).__name__}; pass a dict with "
                "'tokens', a 1-D integer array/list, or a str."
            )
        values = np.asarray(element)
        if values.size == 0:
            return np.zeros((0,), np.int32)
        if values.ndim != 1 or values.dtype.kind not in "iu":
            raise DataConfigError(
                f"{where} is an array of shape {values.shape} dtype {values.dtype}; pass a 1-D "
                "integer array/list of token ids."
            )
        return _checked_int32(values, self.vocab_size, where)

    def __repr__(self) -> str:
        return (
            f"InMemorySource(documents={len(self)}, data={type(self._data).__name__}, "
            f"vocab_size={self.vocab_size})"
        )


# ----------------------------------------------------------------------------
# Synthetic.
# ----------------------------------------------------------------------------

_LENGTH_BLOCK = 1024  # Documents whose lengths are drawn together.
_TOKENS_STREAM, _LENGTHS_STREAM = 0, 1  # Distinct seed words: independent streams.


@functools.lru_cache(maxsize=64)
def _synthetic_block(
    seed: int, block: int, mu: float, sigma: float, min_length: int, max_length: int
) -> np.ndarray:
    """Lengths of documents [block * B, (block + 1) * B) of a SyntheticSource.

    Drawn in one call from a generator keyed by (seed, block), so any index's
    length is O(1) to compute, independent of access order, and identical to
    the vectorised `SyntheticSource.lengths()`.
    """
    rng = np.random.default_rng([seed, _LENGTHS_STREAM, block])
    raw = rng.lognormal(mean=mu, sigma=sigma, size=_LENGTH_BLOCK)
    lengths = np.clip(np.rint(np.minimum(raw, max_length)), min_length, max_length)
    out = lengths.astype(np.int64)
    out.flags.writeable = False  # Shared through the cache.
    return out


class SyntheticSource(TokenSource):
    """Random documents with lognormal lengths, for benchmarks and tests.

    Document lengths follow a lognormal with mean `mean_length` (mu =
    log(mean_length) - sigma**2 / 2), rounded and clipped to [min_length,
    max_length]; tokens are uniform in [min_token_id, vocab_size). Every
    document is a pure function of (seed, index).
    """

    def __init__(
        self,
        num_documents: int,
        mean_length: float = 256,
        sigma: float = 1.0,
        vocab_size: int = 258,
        seed: int = 0,
        min_length: int = 1,
        max_length: int | None = None,
        min_token_id: int = 2,
    ) -> None:
        """Validates the arguments.

        Args:
          num_documents: Number of documents, >= 1.
          mean_length: Mean of the lognormal length distribution, > 0.
          sigma: Standard deviation of log-length, >= 0 (0: all equal).
          vocab_size: Token ids are < vocab_size.
          seed: Non-negative integer seed.
          min_length: Shortest document, >= 1.
          max_length: Longest document (>= min_length), or None for no limit
            beyond int32.
          min_token_id: Smallest token id, in [0, vocab_size); the default 2
            skips the byte tokenizer's pad and eod ids.

        Raises:
          DataConfigError: If an argument is out of range.
        """
        self._num_documents = check_int("SyntheticSource: num_documents", num_documents, 1)
        if (
            isinstance(mean_length, bool)
            or not isinstance(mean_length, numbers.Real)
            or not math.isfinite(mean_length)
            or mean_length <= 0
        ):
            raise DataConfigError(
                f"SyntheticSource: mean_length={mean_length!r} is invalid; pass a finite "
                "number > 0."
            )
        if (
            isinstance(sigma, bool)
            or not isinstance(sigma, numbers.Real)
            or not math.isfinite(sigma)
            or sigma < 0
        ):
            raise DataConfigError(
                f"SyntheticSource: sigma={sigma!r} is invalid; pass a finite number >= 0."
            )
        vocab = _check_vocab_size(vocab_size, "SyntheticSource: vocab_size")
        if vocab is None:
            raise DataConfigError(
                "SyntheticSource: vocab_size=None is invalid; pass an integer in [1, 2**31]."
            )
        self._seed = check_int("SyntheticSource: seed", seed, 0)
        self._min_length = check_int("SyntheticSource: min_length", min_length, 1)
        if max_length is None:
            self._max_length = _INT32_MAX
        else:
            self._max_length = check_int(
                "SyntheticSource: max_length", max_length, self._min_length
            )
        if (
            isinstance(min_token_id, bool)
            or not isinstance(min_token_id, numbers.Integral)
            or not 0 <= min_token_id < vocab
        ):
            raise DataConfigError(
                f"SyntheticSource: min_token_id={min_token_id!r} is invalid; pass an integer in "
                f"[0, vocab_size={vocab})."
            )
        self._min_token_id = int(min_token_id)
        self._mean_length = float(mean_length)
        self._sigma = float(sigma)
        self._mu = math.log(self._mean_length) - self._sigma**2 / 2
        self.vocab_size = vocab

    def __len__(self) -> int:
        return self._num_documents

    def _block(self, block: int) -> np.ndarray:
        return _synthetic_block(
            self._seed, block, self._mu, self._sigma, self._min_length, self._max_length
        )

    def length(self, index: int) -> int:
        """Returns the length of document `index` without generating its tokens.

        Args:
          index: Document index in [0, len).

        Returns:
          The number of tokens of that document.
        """
        return int(self._block(index // _LENGTH_BLOCK)[index % _LENGTH_BLOCK])

    def lengths(self) -> np.ndarray:
        """Returns the lengths of all documents.

        Returns:
          An int64 array of shape (num_documents,), equal to the per-index
          lengths of the documents.
        """
        num_blocks = -(-self._num_documents // _LENGTH_BLOCK)
        return np.concatenate([self._block(b) for b in range(num_blocks)])[
            : self._num_documents
        ].copy()

    def _read(self, index: int) -> np.ndarray:
        rng = np.random.default_rng([self._seed, _TOKENS_STREAM, index])
        return rng.integers(
            self._min_token_id, self.vocab_size, size=self.length(index), dtype=np.int32
        )

    def __repr__(self) -> str:
        max_length = None if self._max_length == _INT32_MAX else self._max_length
        return (
            f"SyntheticSource(num_documents={self._num_documents}, "
            f"mean_length={self._mean_length}, sigma={self._sigma}, "
            f"vocab_size={self.vocab_size}, seed={self._seed}, min_length={self._min_length}, "
            f"max_length={max_length}, min_token_id={self._min_token_id})"
        )


# ----------------------------------------------------------------------------
# Coercion.
# ----------------------------------------------------------------------------


def as_token_source(obj: Any, tokenizer: TokenizerSpec = None) -> Any:
    """Returns `obj` if it already yields token documents, else an InMemorySource.

    Args:
      obj: A `TokenSource`; any other random-access source (returned
        unchanged, expected to yield dicts with "tokens"); or data accepted by
        `InMemorySource` (lists, tuples, arrays).
      tokenizer: Used only when wrapping str data.

    Returns:
      A random-access source of `{"tokens": ...}` documents.

    Raises:
      DataConfigError: If `obj` cannot be wrapped.
    """
    if isinstance(obj, TokenSource):
        return obj
    if (
        not isinstance(obj, (list, tuple, np.ndarray, str, bytes))
        and hasattr(obj, "__len__")
        and hasattr(obj, "__getitem__")
    ):
        # A custom random-access source is not read here; the pipeline checks
        # each document's format when it reads it.
        return obj
    return InMemorySource(obj, tokenizer=tokenizer)
