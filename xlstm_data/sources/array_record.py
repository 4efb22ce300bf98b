"""ArrayRecord shards of token ids or UTF-8 text, as written by `xlstm-data prepare`."""

from __future__ import annotations

import bisect
import itertools
import os
import threading
from collections.abc import Iterable, Sequence
from typing import Any, SupportsIndex

import grain
import numpy as np
from absl import logging

from xlstm_data.errors import DataConfigError, DataReadError
from xlstm_data.sources.base import (
    _INT32_MAX,
    _RECORD_FORMATS,
    PathPattern,
    TokenizerSpec,
    TokenSource,
    _check_vocab_size,
    _checked_int32,
    _in_range,
    expand_files,
)
from xlstm_data.sources.corpus_index import (
    INDEX_FILE,
    PreparedCorpus,
    prepared_corpus,
    prepared_tokenizer,
)
from xlstm_data.sources.formats import decode_utf8
from xlstm_data.sources.tokenizers import get_tokenizer

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

    Shards made by `xlstm-data prepare`, or indexed by `xlstm-data index`,
    carry an `index.json`: its vocabulary bounds every id read (unless
    `vocab_size` is given), its tokenizer (with the special tokens it was told)
    is the default one, and a tokenizer that is not the one the shards were
    made with is refused, so the run's end-of-document id and the model's
    vocabulary follow the data rather than a default. Its `lengths.npy` gives
    every document's length without reading it, for text records too (their
    token counts under that tokenizer).
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
            that is not ArrayRecord, no records at all, a tokenizer that is
            not the one prepared shards were made with, or a `record_format`
            other than the one their index records.
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
        # Listed shards of prepared directories: counts from their index, nothing opened.
        self._prepared: PreparedCorpus | None = prepared_corpus(self._files)
        opened = self._prepared is None or self._prepared.documents is None
        if opened:
            self._sources = [self._open(path, pattern) for path in self._files]
            lengths = [len(src) for src in self._sources]
            self._prepared = prepared_corpus(self._files, lengths)
        else:
            assert self._prepared is not None and self._prepared.documents is not None
            lengths = list(self._prepared.documents)
            self._sources = [None] * len(self._files)
        if self._prepared is not None and self._prepared.layout != "array_record":
            directory = os.path.dirname(self._prepared.index_files[0])
            raise DataConfigError(
                f"ArrayRecordSource: {self._prepared.index_files[0]} says the shards are in the "
                f"{self._prepared.layout!r} layout, not ArrayRecord; read them with "
                f"FlatTokenSource, or kind='array_record', path={directory!r} in a config."
            )
        self._ends = list(np.cumsum(lengths, dtype=np.int64).tolist())
        self._init_readers()
        self._num_records = int(self._ends[-1])
        if self._num_records == 0:
            raise DataConfigError(
                f"ArrayRecordSource: pattern={pattern!r} matched {len(self._files)} file(s) but "
                "they hold no records; point it at non-empty ArrayRecord files."
            )
        if self._prepared is not None and self._prepared.record_format != record_format:
            raise DataConfigError(
                f"ArrayRecordSource: record_format={record_format!r}, but the shards' index "
                f"({self._prepared.index_files[0]}) says they hold "
                f"{self._prepared.record_format!r} records; pass "
                f"record_format={self._prepared.record_format!r}."
            )
        if self._prepared is not None:
            self._tokenizer = prepared_tokenizer(
                self._prepared, tokenizer, self._tokenizer, type(self).__name__
            )
        elif record_format == "text":
            if tokenizer is None:
                self._tokenizer = get_tokenizer(None)
        elif tokenizer is None and explicit_vocab is None and unprepared_tokenizer:
            self._tokenizer = get_tokenizer(unprepared_tokenizer)
        vocab = explicit_vocab
        if vocab is None and self._prepared is not None:
            vocab = self._prepared.vocab_size
        if vocab is None and self._tokenizer is not None:
            vocab = int(self._tokenizer.vocab_size)
        self.vocab_size = vocab
        if opened:  # prepared shards' record_format is in their index
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

    @staticmethod
    def _open(path: str, pattern: Any) -> Any:
        """grain's source of one file (reads its record index)."""
        try:
            return grain.sources.ArrayRecordDataSource(path)
        except Exception as e:  # The reader raises plain RuntimeError/ValueError.
            raise DataConfigError(
                f"ArrayRecordSource: file {path!r} matched by pattern={pattern!r} is not a "
                f"readable ArrayRecord file ({type(e).__name__}: {e}); narrow the pattern "
                "to ArrayRecord files only."
            ) from e

    def _source(self, file_idx: int) -> Any:
        """grain's source of file `file_idx`, opened on first use in this process."""
        source = self._sources[file_idx]
        if source is None:
            path = self._files[file_idx]
            try:
                source = grain.sources.ArrayRecordDataSource(path)
            except Exception as e:
                raise DataReadError(
                    f"ArrayRecordSource: file {path!r} (listed in its directory's index.json) "
                    f"cannot be opened as ArrayRecord ({type(e).__name__}: {e}); it is damaged: "
                    "rerun `xlstm-data prepare` (or `xlstm-data index`) to rewrite it."
                ) from e
            self._check_count(file_idx, len(source))
            self._sources[file_idx] = source
        return source

    def _check_count(self, file_idx: int, records: int) -> None:
        """A shard opened lazily must hold the records its index listed (else reads shift)."""
        listed = self._ends[file_idx] - (self._ends[file_idx - 1] if file_idx else 0)
        if records != listed:
            assert self._prepared is not None
            raise DataReadError(
                f"{self._files[file_idx]}: holds {records} records but "
                f"{self._prepared.index_files[0]} says it holds {listed} documents; the shard or "
                "the index is stale: rerun `xlstm-data prepare` with the same inputs and --output "
                "to rewrite it, or `xlstm-data index` on the shards if it made the index."
            )

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
        """Whether every file read is a shard listed in an `xlstm-data prepare`/`index` index."""
        return self._prepared is not None and self._prepared.slices is not None

    def lengths(self) -> np.ndarray:
        """Every document's token count from the `xlstm-data prepare`/`index` index.

        Read from the `lengths.npy` beside the shards, without reading any
        record.

        Returns:
          A 1-D integer array with one entry per record, in source order
          (the memory-mapped `lengths.npy` for a whole prepared directory).

        Raises:
          DataConfigError: If the files are not all shards listed in an
            `index.json` (`xlstm-data prepare` or `xlstm-data index`); the
            message names the files and the commands.
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
                "records are not known without tokenizing every record; count them once with "
                "`xlstm-data index 'DIR/*.array_record' --record_format=text --tokenizer=T`, "
                f"or write token shards with {command}."
            )
        directories = sorted({os.path.dirname(os.path.abspath(path)) for path in self._files})
        unprepared = [
            d for d in directories if not os.path.exists(os.path.join(d, INDEX_FILE))
        ] or directories
        return (
            f"ArrayRecordSource({files}): the document lengths are not known: there is no "
            f"{INDEX_FILE} with lengths.npy in {', '.join(map(repr, unprepared))} (the files "
            f"were not written by `xlstm-data prepare`); index them with `xlstm-data index "
            f"'DIR/*.array_record'`, or write token shards with {command}."
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

    def _where(self, file_idx: int, local: int, global_index: int) -> str:
        """Names a record in error messages."""
        path = self._files[file_idx]
        return f"ArrayRecordSource: record {local} of file {path!r} (global index {global_index})"

    def _read_local(self, file_idx: int, local: int, global_index: int) -> np.ndarray:
        """Reads and decodes record `local` of file `file_idx`."""

        def where() -> str:
            return self._where(file_idx, local, global_index)

        try:
            raw = self._source(file_idx)[local]
        except Exception as e:
            raise DataReadError(
                f"{where()}: could not be read ({type(e).__name__}: {e}); the file is damaged: "
                "write it again (`xlstm-data prepare` with the same inputs and --output rewrites "
                "prepared shards)."
            ) from e
        return self._decode(raw, where)

    def _decode(self, raw: bytes, where: Any) -> np.ndarray:
        """Decodes and checks one record (`where()` names it on error)."""
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
            values = self._tokenizer.encode(decode_utf8(raw, where()))
        return _checked_int32(values, self.vocab_size, where)

    # Batched reads ------------------------------------------------------------

    def _init_readers(self) -> None:
        """No batch reader is open yet: each process opens its own on first use."""
        self._readers: list[Any] = [None] * len(self._files)
        self._readers_lock = threading.Lock()
        self._ends_array = np.array(self._ends, dtype=np.int64)
        self._starts = np.array([0, *self._ends[:-1]], dtype=np.int64)

    def __getstate__(self) -> dict[str, Any]:
        """Drops the batch readers and their lock (opened again in the process that reads)."""
        state = self.__dict__.copy()
        del state["_readers"], state["_readers_lock"]
        state["_sources"] = [None] * len(self._files)  # opened again where read
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_readers()

    def _reader(self, file_idx: int) -> Any:
        """The batch reader of file `file_idx`, opened once per process (thread-safe)."""
        reader = self._readers[file_idx]
        if reader is None:
            from array_record.python.array_record_module import ArrayRecordReader

            with self._readers_lock:
                reader = self._readers[file_idx]
                if reader is None:
                    # The options grain's ArrayRecordDataSource opens its readers with.
                    reader = ArrayRecordReader(
                        self._files[file_idx],
                        options="readahead_buffer_size:0",
                        file_reader_buffer_size=32768,
                    )
                    self._check_count(file_idx, reader.num_records())
                    self._readers[file_idx] = reader
        return reader

    def read_many(self, indices: Sequence[SupportsIndex] | np.ndarray) -> list[np.ndarray]:
        """Reads several documents with one read per file, and checks their ids in one pass.

        Why not one record at a time: a single read costs ~40 us per record
        on the benchmark corpus (2 KB zstd records; the array_record reader
        starts a parallel read for every call), a list of 19 records from one
        file ~20 us per record: 5,700 records read 228 ms one by one, 98-127 ms
        as 300 lists (2-core machine, 2026-11-23). grain's
        `ArrayRecordDataSource.__getitems__` reads lists too but starts a thread
        pool on every call, which ate the gain (224 ms), so the file's
        array_record reader is called directly, as grain does inside it. The
        vocabulary check then runs once over the batch's ids instead of once per
        document (~10 us each). A bad record is found again one by one, so the
        error names its file and record as a single read's does.

        Args:
          indices: Document indices in [-len, len), repeats allowed.

        Returns:
          One fresh 1-D int32 array per index (views of one buffer per call).

        Raises:
          IndexError: If an index is out of range.
          DataReadError: If a record cannot be read or decoded, naming it.
        """
        index = np.asarray(indices, dtype=np.int64).reshape(-1)
        n = self._num_records
        if index.size == 0:
            return []
        if int(index.min()) < -n or int(index.max()) >= n:
            bad = int(index[(index < -n) | (index >= n)][0])
            raise IndexError(
                f"{type(self).__name__}: index {bad} is out of range; valid indices are 0..{n - 1}."
            )
        index = np.where(index < 0, index + n, index)
        if len(self._files) == 1:
            file_of = np.zeros(len(index), dtype=np.int64)
            raws = self._read_file(0, index, index)
        else:
            file_of = np.searchsorted(self._ends_array, index, side="right")
            local = index - self._starts[file_of]
            raws = [b""] * len(index)
            for file_idx in np.unique(file_of).tolist():
                chosen = np.flatnonzero(file_of == file_idx)
                records = self._read_file(file_idx, local[chosen], index[chosen])
                for j, raw in zip(chosen.tolist(), records, strict=True):
                    raws[j] = raw
        if self._record_format != "tokens" or any(len(raw) & 3 for raw in raws):
            # Text is tokenized record by record anyway; a bad size is named there.
            return [
                self._decode(raw, self._where_of(int(f), int(g)))
                for raw, f, g in zip(raws, file_of, index, strict=True)
            ]
        flat = np.frombuffer(b"".join(raws), dtype="<i4")
        upper = _INT32_MAX + 1 if self.vocab_size is None else self.vocab_size
        if flat.size and not _in_range(flat, upper):
            for raw, f, g in zip(raws, file_of, index, strict=True):
                self._decode(raw, self._where_of(int(f), int(g)))  # raises on the bad one
        flat = flat.astype(np.int32)  # fresh and writable
        ends = list(itertools.accumulate(len(raw) >> 2 for raw in raws))
        return [flat[a:b] for a, b in zip([0, *ends[:-1]], ends, strict=True)]

    def _where_of(self, file_idx: int, global_index: int) -> Any:
        """`where` of a record by file and global index, formatted only when called."""
        return lambda: self._where(
            file_idx, global_index - int(self._starts[file_idx]), global_index
        )

    def _read_file(self, file_idx: int, local: np.ndarray, global_index: np.ndarray) -> list:
        """The raw records `local` of file `file_idx`, in one read."""
        try:
            return self._reader(file_idx).read(local.tolist())
        except Exception as e:
            # Name the record: the same records one by one (only on this error path).
            for position, g in zip(local.tolist(), global_index.tolist(), strict=True):
                self._read_local(file_idx, position, g)
            raise DataReadError(
                f"ArrayRecordSource: {len(local)} records of file {self._files[file_idx]!r} "
                f"could not be read together ({type(e).__name__}: {e}), though each reads alone."
            ) from e

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
