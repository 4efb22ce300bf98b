"""Plain text and JSON-lines files, tokenized when read (lengths cached once per machine)."""

from __future__ import annotations

import contextlib
import functools
import mmap
import os
import threading
from array import array
from typing import Any

import numpy as np
from absl import logging

from xlstm_data.errors import DataConfigError, DataReadError
from xlstm_data.sources.base import (
    TEXT_UNITS,
    PathPattern,
    TokenizerSpec,
    TokenSource,
    _checked_int32,
    expand_files,
)
from xlstm_data.sources.formats import compression_of, decode_utf8, jsonl_text
from xlstm_data.sources.lengths_cache import cached_lengths, file_signature, tokenizer_identity
from xlstm_data.sources.tokenizers import get_tokenizer

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
    cache of `xlstm_data.sources.lengths_cache`, keyed by the files' paths, sizes and
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
        _refuse_compressed(self._files)
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
                self._signatures.append(file_signature(path))
                size = self._signatures[-1][1]
                if size:
                    file_ids.append(fi)
                    offsets.append(0)
                    lengths.append(size)
                    line_numbers.append(1)
                continue
            offset = 0
            blank = 0
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
                    else:
                        blank += 1
                    offset += len(line)
            if blank:
                logging.warning(
                    "TextFileSource: %s: %d blank line(s) skipped (unit='line': a document is a "
                    "non-blank line; unit='file' keeps each file whole)",
                    path,
                    blank,
                )
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
        text = decode_utf8(raw, where)
        field = self._fields[int(self._file_ids[index])]
        if field is not None:
            text = jsonl_text(text, field, where)
        return _checked_int32(self._tokenizer.encode(text), self.vocab_size, where)

    def lengths(self) -> np.ndarray:
        """Every document's token count: its tokens as read, counted once per machine.

        The first call on a machine tokenizes every document (one sequential
        pass per file); the counts are kept on this instance and in the
        lengths cache (`xlstm_data.sources.lengths_cache`), so later calls and later
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
            self._token_lengths = cached_lengths(
                self._lengths_cache_parts(), len(self), self._scan_lengths, repr(self)
            )
        return self._token_lengths

    def _lengths_cache_parts(self) -> dict[str, Any] | None:
        """What the token counts depend on, or None when the tokenizer cannot be identified."""
        tokenizer = tokenizer_identity(self._tokenizer)
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


def _refuse_compressed(files: list[str]) -> None:
    """Compressed files cannot be read by byte offset: name them and the way to read them."""
    for path in files:
        with open(path, "rb") as f:
            compression = compression_of(f.read(4))
        if compression:
            raise DataConfigError(
                f"TextFileSource: file {path!r} is {compression}-compressed, and text sources "
                "(kind='text'/'jsonl') read documents by byte offset in uncompressed files; run "
                f"`xlstm-data prepare {path} --output=DIR` on it and read the output with "
                "kind='array_record', path='DIR/*.array_record'."
            )
