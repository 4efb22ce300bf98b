"""The lengths index for ArrayRecord shards another pipeline wrote (`xlstm-data index`).

Shards of int32 token ids, or of UTF-8 text, made elsewhere read fine without
an index, but then nothing knows their documents' lengths without reading
every record: the epoch length is an estimate and `inspect` and the planner
must scan the data. Reading every shard once, in parallel, gives the same
`index.json` + `lengths.npy` that `prepare` writes beside its own shards, so
such shards are then read exactly like prepared ones. Every token id is
checked against the vocabulary on the way, as `prepare` does, so a wrong
tokenizer or vocabulary fails here, naming the shard and record, rather than
mid-training.

Text shards are counted with the tokenizer they will be read with: the index
records it (and `record_format: "text"`), and a reader that names another
tokenizer is refused, because the lengths would be wrong for it.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import multiprocessing
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
from absl import logging

from xlstm_data.checks import check_int
from xlstm_data.errors import DataConfigError, DataReadError
from xlstm_data.prepare import paths
from xlstm_data.prepare.settings import PrepareSettings, load_tokenizer
from xlstm_data.sources.base import expand_files
from xlstm_data.sources.corpus_index import (
    INDEX_FILE,
    LENGTHS_FILE,
    RECORD_FORMATS,
)
from xlstm_data.sources.tokenizers import ByteTokenizer, Tokenizer

#: Records read at once: bounds memory on shards of long documents.
_BATCH = 512

Progress = Callable[[int, int, dict[str, Any]], None]


@dataclasses.dataclass(frozen=True)
class _Job:
    """One shard to count, with everything a worker needs (pickles cheaply)."""

    path: str
    record_format: str
    tokenizer: str
    eod_token: str | None
    pad_token: str | None
    vocab_size: int


def index_shards(
    patterns: str | Sequence[str],
    *,
    record_format: str = "tokens",
    tokenizer: str = "byte",
    vocab_size: int | None = None,
    eod_token: str | None = None,
    pad_token: str | None = None,
    workers: int = 1,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Writes `index.json` and `lengths.npy` beside existing ArrayRecord shards.

    Args:
      patterns: Files or globs of the shards (sorted after expansion), all in
        one directory. That directory's own `index.json` and `lengths.npy` are
        skipped, so `DIR/*` works on a rerun.
      record_format: "tokens" (raw little-endian int32 ids, one document per
        record) or "text" (UTF-8, one document per record).
      tokenizer: "byte" or a local HuggingFace tokenizer `.json`: encodes text
        records, and for token records names where the ids come from (the
        end-of-document id readers use).
      vocab_size: The vocabulary every id is checked against, recorded in the
        index; default the tokenizer's. Larger only for ids the tokenizer does
        not make (another tokenizer's, or a padded model vocabulary).
      eod_token: The tokenizer's end-of-document token by name (default:
        detected); recorded, so readers rebuild the tokenizer with it.
      pad_token: Its padding token by name (default: detected); recorded.
      workers: Shards read in parallel (processes, each loading the
        tokenizer once).
      progress: Called as `progress(done, total, shard_entry)` per shard.

    Returns:
      The index (also written to `index.json`).

    Raises:
      DataConfigError: On a bad argument, a pattern matching nothing, shards in
        several directories, or a file that is not ArrayRecord (all before any
        record is read).
      DataReadError: On a record that is not what `record_format` says or holds
        an id outside the vocabulary (shard and record named).
    """
    files, jobs, settings = _jobs(
        patterns, record_format, tokenizer, vocab_size, eod_token, pad_token, workers
    )
    directory = paths.parent(files[0])
    entries: list[dict[str, Any]] = [{}] * len(jobs)
    # Each shard's lengths wait on local disk, not in memory: 4 GB at 10^9 documents.
    with tempfile.TemporaryDirectory(prefix="xlstm-data-index-") as scratch:
        for done, (number, counted) in enumerate(_counted(jobs, workers), 1):
            np.save(os.path.join(scratch, f"{number}.npy"), counted.astype(np.int32))
            entries[number] = entry = {
                "file": paths.basename(jobs[number].path),
                "source": jobs[number].path,
                "documents": int(counted.size),
                "tokens": int(counted.sum(dtype=np.int64)),
                "bytes": paths.size(jobs[number].path),
            }
            if progress:
                progress(done, len(jobs), entry)
        documents = sum(entry["documents"] for entry in entries)
        index = settings.index_header(documents, sum(entry["tokens"] for entry in entries))
        if record_format != "tokens":  # absent means tokens, as in `prepare`'s indexes
            index["record_format"] = record_format
        index["shards"] = entries
        index_file = paths.join(directory, INDEX_FILE)
        # A reader must never pair the old index with the new lengths: drop it first.
        paths.remove(index_file)
        paths.write_npy_in_pieces(
            paths.join(directory, LENGTHS_FILE),
            (np.load(os.path.join(scratch, f"{number}.npy")) for number in range(len(jobs))),
            documents,
            np.int32,
        )
    paths.write_json_atomically(index_file, index)
    logging.info(
        "index: %d documents, %d tokens in %d shards under %s",
        index["documents"],
        index["tokens"],
        len(jobs),
        directory,
    )
    return index


def _jobs(
    patterns: str | Sequence[str],
    record_format: str,
    tokenizer: str,
    vocab_size: int | None,
    eod_token: str | None,
    pad_token: str | None,
    workers: int,
) -> tuple[list[str], list[_Job], PrepareSettings]:
    """The shard files, one counting job each and the settings, checked before any read."""
    if record_format not in RECORD_FORMATS:
        raise DataConfigError(
            f"--record_format={record_format!r} is invalid; valid formats: {list(RECORD_FORMATS)}"
        )
    check_int("--workers", workers, 1)
    settings = PrepareSettings.create(
        tokenizer=tokenizer, eod_token=eod_token, pad_token=pad_token, vocab_size=vocab_size
    )
    files = _shard_files(patterns)
    for path in files:
        if not paths.is_uri(path):  # a remote shard is checked where it is copied down
            _check_array_record(path, path)
    jobs = [
        _Job(
            path=paths.absolute(path),
            record_format=record_format,
            tokenizer=settings.tokenizer,
            eod_token=settings.eod_token,
            pad_token=settings.pad_token,
            vocab_size=settings.vocab_size,
        )
        for path in files
    ]
    return files, jobs, settings


def count_lengths(
    patterns: str | Sequence[str],
    *,
    record_format: str = "tokens",
    tokenizer: str = "byte",
    vocab_size: int | None = None,
    eod_token: str | None = None,
    pad_token: str | None = None,
    workers: int = 1,
    progress: Progress | None = None,
) -> np.ndarray:
    """Every document's length in the shards, as `index_shards` counts them, writing nothing.

    For shards whose directory cannot be written (see `auto_index`); the
    arguments are `index_shards`'.
    """
    files, jobs, _ = _jobs(
        patterns, record_format, tokenizer, vocab_size, eod_token, pad_token, workers
    )
    counted: list[np.ndarray] = [np.zeros(0, np.int64)] * len(jobs)
    for done, (number, lengths) in enumerate(_counted(jobs, workers), 1):
        counted[number] = lengths.astype(np.int64)
        if progress:
            progress(done, len(jobs), {"file": paths.basename(files[number])})
    return np.concatenate(counted)


def _shard_files(patterns: str | Sequence[str]) -> list[str]:
    """The matched shards, all in one directory, without that directory's own index files."""
    listed = [patterns] if isinstance(patterns, (str, os.PathLike)) else patterns
    remote = []
    if isinstance(listed, Sequence) and not isinstance(listed, (bytes, bytearray)):
        remote = [p for p in listed if isinstance(p, str) and paths.is_uri(p)]
    local = [p for p in listed if p not in remote] if remote else patterns
    files = expand_files(local, "PATH_GLOB") if local else []
    files += [path for pattern in remote for path in _remote_files(pattern)]
    directories = sorted({paths.parent(path) for path in files})
    if len(directories) > 1:
        raise DataConfigError(
            f"PATH_GLOB={_shown(patterns)} matches shards in {len(directories)} directories, "
            f"e.g. {directories[0]!r} and {directories[1]!r}; an index describes the shards of "
            "one directory: run `xlstm-data index` once per directory"
        )
    shards = [path for path in files if paths.basename(path) not in (INDEX_FILE, LENGTHS_FILE)]
    if not shards:
        raise DataConfigError(
            f"PATH_GLOB={_shown(patterns)} matches only {INDEX_FILE}/{LENGTHS_FILE}; pass the "
            "shards, e.g. 'DIR/*.array_record'"
        )
    return shards


def _remote_files(pattern: str) -> list[str]:
    """A URI or URI glob's files (directories dropped), e.g. gs://bucket/corpus/*.array_record."""
    from etils import epath

    if not paths.has_wildcard(pattern.split("://", 1)[1]):
        matches = [pattern] if epath.Path(pattern).is_file() else []
    else:
        matches = [m for m in paths.glob_uri(pattern, "PATH_GLOB") if epath.Path(m).is_file()]
    if not matches:
        raise DataConfigError(
            f"PATH_GLOB={pattern!r} matches no file; pass existing shards, e.g. "
            "'gs://bucket/corpus/*.array_record'"
        )
    return matches


def _shown(patterns: str | Sequence[str]) -> str:
    if isinstance(patterns, (str, os.PathLike)):
        return repr(os.fspath(patterns))
    return repr(list(patterns)) if len(patterns) != 1 else repr(patterns[0])


def _check_array_record(path: str, local: str) -> None:
    """Refuses a matched file that is not ArrayRecord (only the footer of `local`, the
    file or its local copy, is read)."""
    from array_record.python.array_record_module import ArrayRecordReader

    try:
        reader = ArrayRecordReader(local)
        ok = reader.ok()
        reader.close()
    except Exception as error:  # the reader raises plain RuntimeError/ValueError
        ok = False
        logging.info("index: %s does not open as ArrayRecord: %s", path, error)
    if not ok:
        raise DataConfigError(
            f"PATH_GLOB matches {path!r}, which is not an ArrayRecord file; narrow the glob to "
            "the shards, e.g. 'DIR/*.array_record'"
        )


def _counted(jobs: Sequence[_Job], workers: int) -> Iterator[tuple[int, np.ndarray]]:
    """(job number, lengths) per shard as it finishes, here or in `workers` processes."""
    workers = min(workers, len(jobs))
    if workers == 1:
        for number, job in enumerate(jobs):
            yield number, shard_lengths(job)
        return
    first = jobs[0]
    context = multiprocessing.get_context("spawn")  # the caller may hold threads
    pool = concurrent.futures.ProcessPoolExecutor(
        workers,
        mp_context=context,
        initializer=_load_worker_tokenizer,
        initargs=(first.tokenizer, first.eod_token, first.pad_token),
    )
    try:
        futures = {pool.submit(shard_lengths, job): number for number, job in enumerate(jobs)}
        for future in concurrent.futures.as_completed(futures):
            yield futures[future], future.result()
    finally:
        pool.shutdown(cancel_futures=True)


def _load_worker_tokenizer(tokenizer: str, eod_token: str | None, pad_token: str | None) -> None:
    """Loads the tokenizer once per worker; `load_tokenizer` caches it for every shard."""
    load_tokenizer(tokenizer, eod_token, pad_token)


def shard_lengths(job: _Job) -> np.ndarray:
    """Every record's length in tokens (int32), each id checked against the vocabulary.

    Raises:
      DataReadError: Naming the shard and record: a token record whose size is
        not a multiple of 4, a text record that is not UTF-8, or an id outside
        [0, vocab_size).
    """
    tokenizer = load_tokenizer(job.tokenizer, job.eod_token, job.pad_token)
    with paths.local_copy_for_reading(job.path) as local:
        if local != job.path:
            _check_array_record(job.path, local)
        return _read_lengths(job, local, tokenizer)


def _read_lengths(job: _Job, local: str, tokenizer: Tokenizer) -> np.ndarray:
    from array_record.python.array_record_module import ArrayRecordReader

    reader = ArrayRecordReader(local)
    try:
        count = reader.num_records()
        lengths = np.zeros(count, dtype=np.int32)
        for first in range(0, count, _BATCH):
            records = reader.read(first, min(first + _BATCH, count))
            if job.record_format == "tokens":
                lengths[first : first + len(records)] = _token_lengths(job, first, records)
            else:
                lengths[first : first + len(records)] = _text_lengths(
                    job, first, records, tokenizer
                )
    finally:
        reader.close()
    return lengths


def _token_lengths(job: _Job, first: int, records: list[bytes]) -> np.ndarray:
    """Lengths of int32 records, checked in one pass per batch."""
    sizes = np.fromiter((len(raw) for raw in records), dtype=np.int64, count=len(records))
    if (sizes & 3).any():
        number = int(np.flatnonzero(sizes & 3)[0])
        raise DataReadError(
            f"record {first + number} of shard {job.path!r} is {int(sizes[number])} bytes, not "
            "a multiple of 4, so it is not int32 token ids (--record_format=tokens); if the "
            "shards hold UTF-8 text pass --record_format=text"
        )
    ids = np.frombuffer(b"".join(records), dtype="<i4")
    # Negative ids read as unsigned are >= 2**31 >= vocab_size.
    if ids.size and int(ids.view(np.uint32).max()) >= job.vocab_size:
        ends = np.cumsum(sizes >> 2)
        position = int(np.flatnonzero((ids < 0) | (ids >= job.vocab_size))[0])
        number = int(np.searchsorted(ends, position, side="right"))
        raise _bad_id(job, first + number, int(ids[position]))
    return sizes >> 2


def _text_lengths(job: _Job, first: int, records: list[bytes], tokenizer: Tokenizer) -> list[int]:
    """Token counts of UTF-8 records: the ids `ArrayRecordSource(record_format="text")` reads."""
    lengths = []
    for offset, raw in enumerate(records):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise DataReadError(
                f"record {first + offset} of shard {job.path!r} is not valid UTF-8 text (byte "
                f"{error.start}: {error.reason}); if the shards hold int32 token ids pass "
                "--record_format=tokens"
            ) from error
        if isinstance(tokenizer, ByteTokenizer):
            lengths.append(len(raw))  # one id per UTF-8 byte, all in range
            continue
        ids = np.asarray(tokenizer.encode(text))
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= job.vocab_size):
            bad = int(ids[(ids < 0) | (ids >= job.vocab_size)][0])
            raise _bad_id(job, first + offset, bad)
        lengths.append(int(ids.size))
    return lengths


def _bad_id(job: _Job, number: int, bad: int) -> DataReadError:
    return DataReadError(
        f"record {number} of shard {job.path!r} holds token id {bad}, outside the vocabulary "
        f"[0, {job.vocab_size}) of --tokenizer={job.tokenizer!r}; pass the tokenizer the ids "
        "come from (--tokenizer) or their vocabulary size (--vocab_size)"
    )
