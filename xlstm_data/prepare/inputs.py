"""The inputs of `prepare`: finding them, telling their kind, and streaming their documents.

Corpora arrive as plain or compressed text and JSON lines, Parquet, the Arrow
files of a HuggingFace dataset, or token arrays. What a file is comes from its
first bytes (compression, then Parquet, Arrow, numpy) before its suffix, so a
`.jsonl` that is really gzip, or a gzip file without a suffix, is read right,
and a file that is none of these (an image, an archive, bzip2) is refused by
name instead of being tokenized as text.

Big inputs are split into parts that workers tokenize in parallel: an
uncompressed text or JSON-lines file into byte ranges (a line belongs to the
part its first byte is in), a Parquet file into runs of row groups. Reading
streams everywhere (chunk by chunk, row group by row group), so memory stays
bounded on multi-GB files.

Text is read exactly as `TextFileSource` reads it (the same lines, the same
blank-line rule, the same JSON-lines errors, both from
`xlstm_data.sources.formats`), so preparing a corpus yields the documents a
text source would.

Data cut short is never a short corpus: a truncated gzip stream is an error
from the gzip module, but the `zstandard` stream reader ends a zstd stream cut
inside a frame as if it were complete, and pyarrow ends an Arrow stream cut at
a message boundary the same way. Both are checked here (the zstd frame
structure is followed as the bytes go by, an Arrow stream must end with its
end-of-stream marker) and are errors naming the file and where it ends.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import json
import os
import zipfile
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent import futures
from typing import IO, Any

import numpy as np
from absl import logging

from xlstm_data.errors import DataConfigError, DataReadError
from xlstm_data.prepare import paths
from xlstm_data.sources.base import TEXT_UNITS, expand_files
from xlstm_data.sources.formats import compression_of, decode_utf8, jsonl_text

INPUT_FORMATS = ("auto", "text", "jsonl", "parquet", "arrow", "tokens")
_KINDS = INPUT_FORMATS[1:]
_BINARY_KINDS = ("parquet", "arrow", "tokens")
_SUPPORTED = (
    "supported: text and JSON lines (plain, gzip or zstd), Parquet, Arrow (a HuggingFace "
    "dataset directory written by save_to_disk, or .arrow files), .npy/.npz token arrays"
)
_KIND_NAMES = {
    "parquet": "a Parquet file",
    "arrow": "an Arrow file",
    "tokens": "a numpy token array",
}
_COMPRESSION_SUFFIXES = (".gz", ".zst", ".zstd")
_KIND_MAGIC = (
    (b"PAR1", "parquet"),
    (b"ARROW1", "arrow"),  # Arrow IPC file format
    (b"\xff\xff\xff\xff", "arrow"),  # Arrow IPC stream (continuation marker), as HF writes
    (b"\x93NUMPY", "tokens"),  # .npy
    (b"PK\x03\x04", "tokens"),  # .npz is a zip of .npy members (checked)
)
# Files that are plainly something else, refused saying what they look like.
_LOOKS_LIKE = (
    (b"\xfd7zXZ\x00", "xz-compressed data"),
    (b"\x04\x22\x4d\x18", "lz4-compressed data"),
    (b"7z\xbc\xaf\x27\x1c", "a 7-Zip archive"),
    (b"Rar!\x1a\x07", "a RAR archive"),
    (b"\x89PNG\r\n\x1a\n", "a PNG image"),
    (b"\xff\xd8\xff", "a JPEG image"),
    (b"GIF87a", "a GIF image"),
    (b"GIF89a", "a GIF image"),
    (b"%PDF-", "a PDF document"),
    (b"\x7fELF", "an executable (ELF)"),
    (b"SQLite format 3\x00", "an SQLite database"),
    (b"\x89HDF\r\n\x1a\n", "an HDF5 file"),
    (b"\xff\xfe", "UTF-16 text (convert it to UTF-8, e.g. with iconv -f UTF-16 -t UTF-8)"),
    (b"\xfe\xff", "UTF-16 text (convert it to UTF-8, e.g. with iconv -f UTF-16 -t UTF-8)"),
    (b"version https://git-lfs.github.com/spec/", "a Git LFS pointer, not the file (git lfs pull)"),
)
# Suffixes of formats that are not read, when the bytes did not already say what the file is.
_UNREAD_SUFFIXES = {
    ".bz2": "bzip2-compressed",
    ".xz": "xz-compressed",
    ".lz4": "lz4-compressed",
    ".lzma": "lzma-compressed",
    ".br": "brotli-compressed",
    ".zip": "a zip archive",
    ".tar": "a tar archive",
    ".tgz": "a gzip-compressed tar archive",
    ".7z": "a 7-Zip archive",
    ".rar": "a RAR archive",
}
_HEAD_BYTES = 4096  # what kind detection reads of each (decompressed) file
_CHUNK = 1 << 20
_BATCH_ROWS = 1024
_REMOTE_THREADS = 16
_ARROW_END = b"\xff\xff\xff\xff\x00\x00\x00\x00"  # end of an Arrow IPC stream
_MAX_EXAMPLES = 3
#: What a line or file `prepare` cannot decode as UTF-8 is answered with.
_UTF8_ADVICE = (
    "prepare reads UTF-8: convert the file (e.g. iconv -f LATIN1 -t UTF-8), or pass "
    "--skip_bad_lines to skip such lines."
)


@dataclasses.dataclass(frozen=True)
class InputPart:
    """One unit of work: a whole input file or a slice of one.

    Attributes:
      path: The file (a local path or a URI such as gs://...), as found.
      kind: "text", "jsonl", "parquet", "arrow" or "tokens".
      compression: "gzip", "zstd" or None, from the file's first bytes.
      part: This part's index in its file.
      parts: The number of parts of its file.
      start: Uncompressed text/JSON lines: first byte; Parquet: first row group; else 0.
      stop: End byte or row group (exclusive); -1: to the end of the file.
    """

    path: str
    kind: str
    compression: str | None
    part: int
    parts: int
    start: int
    stop: int


@dataclasses.dataclass(frozen=True)
class TokenBatch:
    """Documents of token ids read together: their ids back to back and their lengths.

    Prepared one by one, the 100,000 documents of a 51 M-token Parquet file
    cost a vocabulary check, a cast and a write call each (17 M tokens/s in
    all); as one batch they cost one of each per 64k rows.
    """

    tokens: np.ndarray
    lengths: np.ndarray


@dataclasses.dataclass
class SkippedLines:
    """Bad lines skipped under skip_bad_lines: how many, and up to 3 described.

    Each example names the file, the line or row, and what is wrong with it.
    """

    count: int = 0
    examples: list[str] = dataclasses.field(default_factory=list)


# ----------------------------------------------------------------------------
# Finding inputs.
# ----------------------------------------------------------------------------


def find_inputs(
    patterns: Sequence[str],
    input_format: str = "auto",
    *,
    unit: str = "line",
    part_bytes: int = 256 << 20,
) -> list[InputPart]:
    """The parts of every input, in the order the patterns give them.

    Every file is looked at here (its first bytes; a Parquet file's footer), so
    that an input that cannot be read is refused before any document is: a
    preparation that fails after hours on the last file wastes the hours.

    Args:
      patterns: Files, globs (local, or URIs such as gs://bucket/*.jsonl.gz)
        and HuggingFace dataset directories (written by `save_to_disk`). Each
        pattern's matches are sorted; a file matched twice is read once.
      input_format: "auto" (from the bytes, then the suffix) or the kind of
        every input; compression is detected either way.
      unit: "line" (a document per non-blank line) or "file" (a whole text
        file is one document).
      part_bytes: Uncompressed text and JSON-lines files bigger than this are
        split into parts of this many bytes, Parquet files into runs of row
        groups of about this many bytes.

    Returns:
      The parts, file by file, each file's parts in order.

    Raises:
      DataConfigError: On a bad argument, a pattern matching nothing, or an
        input that is not read (named, with what it looks like and the kinds
        that are read).
    """
    if not isinstance(input_format, str) or input_format not in INPUT_FORMATS:
        raise DataConfigError(
            f"--format={input_format!r} is not an input format; valid formats: "
            f"{', '.join(INPUT_FORMATS)}."
        )
    if not isinstance(unit, str) or unit not in TEXT_UNITS:
        raise DataConfigError(
            f"--unit={unit!r} is not a unit; valid units: {', '.join(TEXT_UNITS)}."
        )
    if isinstance(part_bytes, bool) or not isinstance(part_bytes, int) or part_bytes < 1:
        raise DataConfigError(
            f"--part_mb: part_bytes={part_bytes!r} is invalid; pass an integer number of bytes "
            ">= 1."
        )
    if isinstance(patterns, (str, os.PathLike)):
        patterns = [patterns]
    if not patterns:
        raise DataConfigError(
            "INPUT: no input given; pass at least one file, glob or dataset directory."
        )
    found: dict[str, tuple[str, str]] = {}  # identity -> (path as found, format)
    matched: dict[str, list[str]] = {}  # pattern -> identities of its matches
    for pattern in patterns:
        if not isinstance(pattern, (str, os.PathLike)):
            raise DataConfigError(
                f"INPUT entries must be path/glob strings; got {pattern!r} "
                f"({type(pattern).__name__})."
            )
        for path, forced in _expand(os.fspath(pattern)):
            if forced is not None and input_format not in ("auto", forced):
                raise DataConfigError(
                    f"INPUT={os.fspath(pattern)!r} is a HuggingFace dataset directory (Arrow "
                    f"files), but --format={input_format}; pass --format=auto or --format=arrow."
                )
            key = path if paths.is_uri(path) else os.path.abspath(path)
            found.setdefault(key, (path, forced or input_format))
            matched.setdefault(os.fspath(pattern), []).append(key)

    def inspect(entry: tuple[str, str]) -> list[InputPart]:
        return _inspect(entry[0], entry[1], unit, part_bytes)

    entries = list(found.values())
    if len(entries) > 1 and any(paths.is_uri(path) for path, _ in entries):
        # Each remote file costs a round trip or two: look at them side by side.
        with futures.ThreadPoolExecutor(min(_REMOTE_THREADS, len(entries))) as pool:
            per_file = list(pool.map(inspect, entries))
    else:
        per_file = [inspect(entry) for entry in entries]
    read = {key for key, file_parts in zip(found, per_file, strict=True) if file_parts}
    for pattern, keys in matched.items():
        if not read.intersection(keys):  # a remote glob that matched only directories
            raise DataConfigError(
                f"INPUT={pattern!r} matches no file, only directories; pass a glob of files "
                "or a dataset directory."
            )
    parts = [part for file_parts in per_file for part in file_parts]
    kinds: dict[str, int] = {}
    for file_parts in per_file:
        if file_parts:
            first = file_parts[0]
            kind = first.kind + (f" ({first.compression})" if first.compression else "")
            kinds[kind] = kinds.get(kind, 0) + 1
    logging.info(
        "prepare inputs: %d files (%s) in %d parts.",
        sum(1 for file_parts in per_file if file_parts),
        ", ".join(f"{count} {kind}" for kind, count in sorted(kinds.items())),
        len(parts),
    )
    return parts


def _expand(pattern: str) -> list[tuple[str, str | None]]:
    """A pattern's files, each with the format its place forces (Arrow in a dataset dir)."""
    if paths.is_uri(pattern):
        return _expand_uri(pattern)
    text = os.path.expanduser(pattern)
    if os.path.isdir(text):
        return [(path, "arrow") for path in _dataset_files(text, pattern)]
    return [(path, None) for path in expand_files(text, "INPUT")]


def _expand_uri(pattern: str) -> list[tuple[str, str | None]]:
    from etils import epath

    if not paths.has_wildcard(pattern.split("://", 1)[1]):
        path = epath.Path(pattern)
        if path.is_dir():
            return [(file, "arrow") for file in _dataset_files(pattern, pattern)]
        if not path.exists():
            raise DataConfigError(
                f"INPUT={pattern!r} matches no file; pass an existing file, glob or dataset "
                "directory."
            )
        return [(pattern, None)]
    matches = paths.glob_uri(pattern, "INPUT")
    if not matches:
        raise DataConfigError(
            f"INPUT={pattern!r} matches no file; pass an existing file, glob or dataset directory."
        )
    # A matched directory is dropped when it is looked at (as local globs drop them).
    return [(match, None) for match in matches]


def _dataset_files(directory: str, pattern: str) -> list[str]:
    """The Arrow files of a `save_to_disk` directory, in `state.json` order."""
    dataset_dict = paths.join(directory, "dataset_dict.json")
    if paths.exists(dataset_dict):
        splits = _read_json(dataset_dict, pattern).get("splits") or []
        examples = " or ".join(repr(paths.join(directory, str(s))) for s in splits[:3])
        raise DataConfigError(
            f"INPUT={pattern!r} is a HuggingFace DatasetDict with splits {splits}; pass one "
            f"split's directory, e.g. {examples or repr(paths.join(directory, 'train'))}."
        )
    state = paths.join(directory, "state.json")
    if not paths.exists(state):
        raise DataConfigError(
            f"INPUT={pattern!r} is a directory, and not a HuggingFace dataset written by "
            f"save_to_disk (it has no state.json); pass its files, e.g. "
            f"{paths.join(directory, '*')!r}."
        )
    entries = _read_json(state, pattern).get("_data_files")
    if not isinstance(entries, list) or not entries:
        raise DataConfigError(
            f"INPUT={pattern!r}: {state!r} lists no _data_files, so the dataset has no Arrow "
            "files to read; rewrite it with save_to_disk."
        )
    files = []
    for entry in entries:
        name = entry.get("filename") if isinstance(entry, dict) else None
        if not isinstance(name, str) or not name:
            raise DataConfigError(
                f"INPUT={pattern!r}: {state!r} has a _data_files entry {entry!r} without a "
                "'filename'; rewrite the dataset with save_to_disk."
            )
        path = paths.join(directory, name)
        if not paths.exists(path):
            raise DataConfigError(
                f"INPUT={pattern!r}: {state!r} lists {name!r}, which does not exist; the "
                "dataset is incomplete (copy it again, or rewrite it with save_to_disk)."
            )
        files.append(path)
    return files


def _read_json(path: str, pattern: str) -> dict[str, Any]:
    try:
        value = paths.read_json(path)
    except (OSError, ValueError) as error:
        raise DataConfigError(
            f"INPUT={pattern!r}: {path!r} is not readable JSON ({error})."
        ) from error
    if not isinstance(value, dict):
        raise DataConfigError(f"INPUT={pattern!r}: {path!r} holds {value!r}, not a JSON object.")
    return value


def _kind_magic(content: bytes) -> str | None:
    return next((kind for magic, kind in _KIND_MAGIC if content.startswith(magic)), None)


def _looks_like(content: bytes) -> str | None:
    """What a file that is not read looks like, from its (decompressed) first bytes."""
    if content[:3] == b"BZh" and content[4:10] in (b"1AY&SY", b"\x17rE8P\x90"):
        return "bzip2-compressed data"
    if content[257:262] == b"ustar":
        return "a tar archive"
    return next((name for magic, name in _LOOKS_LIKE if content.startswith(magic)), None)


def _inner_name(path: str) -> str:
    """The lower-case file name without its compression suffixes."""
    name = path.rstrip("/").rsplit("/", 1)[-1].lower()
    while name.endswith(_COMPRESSION_SUFFIXES):
        name = name.rsplit(".", 1)[0]
    return name


def _inspect(path: str, input_format: str, unit: str, part_bytes: int) -> list[InputPart]:
    """A file's kind, compression and parts; [] for a directory a remote glob matched."""
    try:
        with paths.open_file(path, "rb") as f:
            head = f.read(_HEAD_BYTES)
            compression = compression_of(head)
            content = head
            if compression is not None:
                f.seek(0)
                content = _decompressed_head(path, f, compression)
    except OSError as error:
        if paths.is_uri(path) and _is_dir(path):
            return []
        raise DataConfigError(f"INPUT {path!r} cannot be read: {error}") from error
    kind = _kind(path, input_format, compression, content)
    if unit == "file" and kind == "jsonl":
        raise DataConfigError(
            f"--unit=file cannot read {path!r}, JSON lines (one document per line); use "
            "--unit=line, or --format=text to take the whole file, braces and all, as one "
            "document."
        )
    if kind in ("text", "jsonl") and compression is None and unit == "line":
        size = paths.size(path) or 0
        count = max(1, -(-size // part_bytes))
        return [
            InputPart(path, kind, None, k, count, k * part_bytes, min(size, (k + 1) * part_bytes))
            for k in range(count)
        ]
    if kind == "parquet":
        runs = _row_group_runs(path, part_bytes)
        return [
            InputPart(path, kind, None, k, len(runs), start, stop)
            for k, (start, stop) in enumerate(runs)
        ]
    return [InputPart(path, kind, compression, 0, 1, 0, -1)]


def _is_dir(path: str) -> bool:
    from etils import epath

    try:
        return epath.Path(path).is_dir()
    except OSError:
        return False


def _decompressed_head(path: str, raw: IO[bytes], compression: str) -> bytes:
    """The first decompressed bytes; what a damaged stream gives (it is reported when read)."""
    stream = _Decompressed(path, raw, compression)
    pieces, size = [], 0
    try:
        while size < _HEAD_BYTES and (piece := stream.read(_HEAD_BYTES - size)):
            pieces.append(piece)
            size += len(piece)
    except _StreamError:
        pass
    return b"".join(pieces)


def _kind(path: str, input_format: str, compression: str | None, content: bytes) -> str:
    """The kind of a file from its (decompressed) first bytes, then its name."""
    packed = f"{compression}-compressed " if compression else ""
    looks = _looks_like(content)
    if looks is not None:
        raise DataConfigError(
            f"INPUT {path!r} is {packed}{looks}, which prepare does not read; {_SUPPORTED}."
        )
    magic = _kind_magic(content)
    if magic is not None and compression is not None:
        raise DataConfigError(
            f"INPUT {path!r} is {packed}{_KIND_NAMES[magic]}; decompress it first (prepare "
            f"reads gzip and zstd only for text and JSON lines); {_SUPPORTED}."
        )
    if magic == "tokens" and content.startswith(b"PK"):
        _check_npz_members(path)
    name = _inner_name(path)
    if input_format != "auto":
        if input_format in _BINARY_KINDS:
            if magic != input_format:
                raise DataConfigError(
                    f"--format={input_format}, but INPUT {path!r} is not "
                    f"{_KIND_NAMES[input_format]} (it starts with {content[:8]!r}); pass the "
                    f"right --format, or --format=auto; {_SUPPORTED}."
                )
        elif magic is not None:
            raise DataConfigError(
                f"--format={input_format}, but INPUT {path!r} is {_KIND_NAMES[magic]}; pass "
                "--format=auto to read it as one."
            )
        return input_format
    if magic is not None:
        return magic
    suffix = "." + name.rsplit(".", 1)[-1] if "." in name else ""
    if suffix in _UNREAD_SUFFIXES:
        raise DataConfigError(
            f"INPUT {path!r} is named like {_UNREAD_SUFFIXES[suffix]} file, which prepare does "
            f"not read (if it is text, pass --format=text); {_SUPPORTED}."
        )
    if suffix in (".parquet", ".arrow", ".feather", ".npy", ".npz"):
        raise DataConfigError(
            f"INPUT {path!r} is named like a {suffix[1:]} file, but its bytes are not one (it "
            f"starts with {content[:8]!r}); it may be damaged or only partly copied; "
            f"{_SUPPORTED}."
        )
    if suffix in (".jsonl", ".ndjson"):
        kind = "jsonl"
    elif suffix == ".json":
        kind = _sniff_json(path, compression)
    else:
        kind = "text"
    if b"\x00" in content:
        raise DataConfigError(
            f"INPUT {path!r} holds NUL bytes in its first {len(content)} "
            f"{'decompressed ' if compression else ''}bytes, so it is binary, not text (if it "
            f"is text nevertheless, pass --format={kind}); {_SUPPORTED}."
        )
    return kind


def _check_npz_members(path: str) -> None:
    """A zip file is a token archive only if every member is a .npy array."""
    try:
        with paths.open_file(path, "rb") as f, zipfile.ZipFile(f) as archive:
            names = archive.namelist()
    except (OSError, zipfile.BadZipFile) as error:
        raise DataConfigError(
            f"INPUT {path!r} is not a readable zip/.npz file ({error})."
        ) from error
    others = [name for name in names if not name.endswith(".npy")]
    if others:
        raise DataConfigError(
            f"INPUT {path!r} is a zip archive (members such as {others[:3]}), not a .npz of "
            f"token arrays; prepare does not unpack archives; {_SUPPORTED}."
        )


def _sniff_json(path: str, compression: str | None) -> str:
    """A `.json` file is JSON lines when its first non-blank line is a JSON object.

    A single JSON document (an array, a pretty-printed object) is refused: read
    as text it would train on its braces and keys, read as lines it fails at
    line 1 or 2 with a message about JSON syntax. A file without a non-blank
    line is taken as JSON lines holding no documents.
    """
    with paths.open_file(path, "rb") as raw:
        stream = _Decompressed(path, raw, compression) if compression else raw
        try:
            for line in _split_lines(lambda: stream.read(_CHUNK)):
                content = line.strip()
                if not content:
                    continue
                try:
                    if content.startswith(b"{") and isinstance(json.loads(content), dict):
                        return "jsonl"
                except ValueError:
                    pass
                break
            else:
                return "jsonl"
        except _StreamError:
            return "jsonl"  # the damage is reported, with its line, when read
    raise DataConfigError(
        f"INPUT {path!r} ends in .json but its first line is not a JSON object, so it is not "
        "JSON lines (one object per line); a single JSON document is not read. Convert it to "
        "JSON lines (e.g. jq -c '.[]'), or pass --format=text to tokenize its characters, "
        "braces and keys included."
    )


def _row_group_runs(path: str, part_bytes: int) -> list[tuple[int, int]]:
    """Runs of consecutive row groups of at most about `part_bytes` (uncompressed) each."""
    with _parquet(path) as parquet:
        metadata = parquet.metadata
    runs: list[tuple[int, int]] = []
    start, size = 0, 0
    for group in range(metadata.num_row_groups):
        row_group = metadata.row_group(group)
        group_bytes = row_group.total_byte_size or sum(
            row_group.column(c).total_compressed_size for c in range(row_group.num_columns)
        )
        if group > start and size + group_bytes > part_bytes:
            runs.append((start, group))
            start, size = group, 0
        size += group_bytes
    runs.append((start, metadata.num_row_groups))
    return runs


# ----------------------------------------------------------------------------
# Reading documents.
# ----------------------------------------------------------------------------


def read_documents(
    part: InputPart,
    *,
    field: str = "text",
    unit: str = "line",
    skip_bad_lines: bool = False,
    skipped: SkippedLines | None = None,
    batched: bool = False,
) -> Iterator[str | np.ndarray | TokenBatch]:
    """The part's documents: text as `str`, token ids as 1-D integer arrays.

    Text follows `TextFileSource`: with unit="line" every line that is not
    blank is a document (JSON lines: its `field`, which must be a string; an
    empty string is a document), with unit="file" every non-empty file is one.
    Parquet and Arrow rows are documents: a string column gives text, a list
    of integers token ids. A `.npy` array is one document (1-D) or one per row
    (2-D); a `.npz` holds such arrays, read in order.

    Args:
      part: From `find_inputs`.
      field: The JSON key or column holding the document.
      unit: As given to `find_inputs`.
      skip_bad_lines: Skip lines or rows that cannot be read (bad JSON, not
        UTF-8, not an object, no or a non-string `field`, null) instead of
        stopping; a truncated or damaged file still stops.
      skipped: Counts the skipped lines and keeps a few described.
      batched: A Parquet or Arrow batch of token lists without nulls comes as
        one `TokenBatch` (its documents' ids back to back and their lengths)
        instead of one array per document.

    Returns:
      An iterator of the documents, in file order; the arguments are checked
      when this is called, the data as it is read.

    Raises:
      DataConfigError: On a bad argument, or a column that is missing or of a
        type that is not read (raised when reading reaches the file).
      DataReadError: On a line or row that cannot be read (file and line or
        row named) unless `skip_bad_lines`; always on truncated or damaged data.
    """
    if not isinstance(part, InputPart) or part.kind not in _KINDS:
        raise DataConfigError(f"read_documents: part={part!r} is not an InputPart of find_inputs.")
    if not isinstance(field, str) or not field:
        raise DataConfigError(
            f"--field={field!r} is invalid; pass the JSON key or column holding the documents, "
            "e.g. 'text'."
        )
    if unit not in TEXT_UNITS:
        raise DataConfigError(
            f"--unit={unit!r} is not a unit; valid units: {', '.join(TEXT_UNITS)}."
        )
    if part.kind in ("text", "jsonl") and unit == "file":
        if part.kind == "jsonl":
            raise DataConfigError(
                f"--unit=file cannot read {part.path!r}, JSON lines (one document per line); "
                "use --unit=line."
            )
        if part.parts != 1 or part.start != 0:
            raise DataConfigError(
                f"--unit=file, but {part.path!r} was split into {part.parts} parts by "
                "find_inputs(unit='line'); find the inputs with the unit they are read with."
            )
    tally = skipped if skipped is not None else SkippedLines()

    def bad(error: DataReadError) -> None:
        if not skip_bad_lines:
            raise error
        tally.count += 1
        if len(tally.examples) < _MAX_EXAMPLES:
            tally.examples.append(str(error))

    if part.kind == "tokens":
        return _token_documents(part.path)
    if part.kind in ("parquet", "arrow"):
        return _table_documents(part, field, bad, batched)
    if unit == "file":
        return _whole_file(part)
    return _line_documents(part, field, bad)


class _StreamError(Exception):
    """A compressed stream that is cut short or damaged, at a decompressed byte offset."""

    def __init__(self, offset: int, truncated: bool, detail: str):
        super().__init__(detail)
        self.offset = offset
        self.truncated = truncated
        self.detail = detail


def _stream_error(
    path: str, compression: str, error: _StreamError, line: int | None
) -> DataReadError:
    where = f", in line {line}" if line is not None else ""
    what = "truncated" if error.truncated else "damaged"
    return DataReadError(
        f"{path!r} is a {what} {compression} stream: it ends after {error.offset} decompressed "
        f"bytes{where} ({error.detail}); what was read before is not the whole file. "
        "Re-download or recompress it."
    )


class _Decompressed:
    """A gzip or zstd file's decompressed bytes, read in bounded pieces.

    Cut-off and damaged streams raise `_StreamError` with the offset reached:
    gzip says so itself, zstd is followed frame by frame (`_ZstdFrames`).
    """

    def __init__(self, path: str, raw: IO[bytes], compression: str):
        self.offset = 0
        self._frames: _ZstdFrames | None = None
        if compression == "gzip":
            self._reader: Any = gzip.GzipFile(fileobj=raw, mode="rb")
            self._errors: tuple[type[BaseException], ...] = (OSError, EOFError, zlib.error)
        else:
            import zstandard

            self._frames = _ZstdFrames(raw)
            self._reader = zstandard.ZstdDecompressor().stream_reader(
                self._frames, read_across_frames=True, closefd=False
            )
            self._errors = (OSError, EOFError, zstandard.ZstdError)

    def read(self, size: int) -> bytes:
        try:
            # read1: a buffered read(size) of a cut gzip stream drops the bytes it had.
            data = self._reader.read1(size)
        except self._errors as error:
            raise _StreamError(self.offset, isinstance(error, EOFError), str(error)) from error
        if not data and self._frames is not None and not self._frames.at_frame_end:
            raise _StreamError(self.offset, True, "the data ends inside a zstd frame")
        self.offset += len(data)
        return data


class _ZstdFrames:
    """Passes a zstd file's bytes on, following its frames to tell whether it ends at one's end.

    The `zstandard` stream reader ends a stream cut inside a frame as quietly
    as a complete one, so the frame headers, block headers and sizes (not the
    content) are followed here as the decompressor reads: the data ends well
    only where a frame (or a skippable frame) ends.
    """

    _MAGIC = b"\x28\xb5\x2f\xfd"

    def __init__(self, raw: IO[bytes]):
        self._raw = raw
        self._need = 4
        self._header = b""
        self._skip = 0
        self._step: Callable[[bytes], None] = self._frame_start
        self._checksum = False
        self._lost = False  # not a zstd frame: the decompressor reports it

    def read(self, size: int = -1) -> bytes:
        data = self._raw.read(size)
        if data and not self._lost:
            self._follow(data)
        return data

    @property
    def at_frame_end(self) -> bool:
        return self._step == self._frame_start and not self._header and not self._skip

    def _expect(self, size: int, step: Callable[[bytes], None]) -> None:
        self._need, self._step = size, step

    def _follow(self, data: bytes) -> None:
        position, end = 0, len(data)
        while position < end and not self._lost:
            if self._skip:
                taken = min(self._skip, end - position)
                self._skip -= taken
                position += taken
                continue
            taken = min(self._need - len(self._header), end - position)
            self._header += data[position : position + taken]
            position += taken
            if len(self._header) == self._need:
                header, self._header = self._header, b""
                self._step(header)

    def _frame_start(self, magic: bytes) -> None:
        if magic == self._MAGIC:
            self._expect(1, self._descriptor)
        elif magic[0] & 0xF0 == 0x50 and magic[1:] == b"\x2a\x4d\x18":
            self._expect(4, self._skippable)
        else:
            self._lost = True

    def _descriptor(self, header: bytes) -> None:
        descriptor = header[0]
        single_segment = (descriptor >> 5) & 1
        self._checksum = bool(descriptor & 0x04)
        size = (
            (0 if single_segment else 1)  # window descriptor
            + (0, 1, 2, 4)[descriptor & 0x03]  # dictionary id
            + (single_segment, 2, 4, 8)[descriptor >> 6]  # frame content size
        )
        if size:
            self._expect(size, lambda _: self._expect(3, self._block))
        else:
            self._expect(3, self._block)

    def _block(self, header: bytes) -> None:
        value = int.from_bytes(header, "little")
        last, block_type, size = value & 1, (value >> 1) & 3, value >> 3
        self._skip = 1 if block_type == 1 else size  # an RLE block holds one byte
        if not last:
            self._expect(3, self._block)
        elif self._checksum:
            self._expect(4, lambda _: self._expect(4, self._frame_start))
        else:
            self._expect(4, self._frame_start)

    def _skippable(self, header: bytes) -> None:
        self._skip = int.from_bytes(header, "little")
        self._expect(4, self._frame_start)


def _split_lines(read: Callable[[], bytes]) -> Iterator[bytes]:
    """The lines of a byte stream read in chunks, without their b"\\n" (the last may lack one).

    A line longer than a chunk is joined once, not grown chunk by chunk.
    """
    pending: list[bytes] = []
    while chunk := read():
        pieces = chunk.split(b"\n")
        if len(pieces) == 1:
            pending.append(chunk)
            continue
        if pending:
            pending.append(pieces[0])
            pieces[0] = b"".join(pending)
            pending = []
        tail = pieces.pop()
        yield from pieces
        if tail:
            pending.append(tail)
    if pending:
        yield b"".join(pending)


class _Lines:
    """A text part's lines (without their newline), and their true line numbers.

    A byte-range part starts mid-file; the number of its first line is only
    needed to name a bad line, so the newlines before it are counted then.
    """

    def __init__(self, part: InputPart):
        self.part = part
        self.count = 0  # lines given so far
        self._first_offset = 0
        self._first_number: int | None = None if part.start > 0 else 1

    def number(self, index: int) -> int:
        """The line number of the part's line `index` (from 0)."""
        if self._first_number is None:
            newlines = 0
            with paths.open_file(self.part.path, "rb") as f:
                remaining = self._first_offset
                while remaining > 0 and (chunk := f.read(min(_CHUNK, remaining))):
                    newlines += chunk.count(b"\n")
                    remaining -= len(chunk)
            self._first_number = newlines + 1
        return self._first_number + index

    def __iter__(self) -> Iterator[bytes]:
        part = self.part
        with paths.open_file(part.path, "rb") as raw:
            if part.compression is not None:
                stream = _Decompressed(part.path, raw, part.compression)
                try:
                    for line in _split_lines(lambda: stream.read(_CHUNK)):
                        self.count += 1
                        yield line
                except _StreamError as error:
                    raise _stream_error(
                        part.path, part.compression, error, self.count + 1
                    ) from error
                return
            # Bytes [start - 1, ...): the first line read is the rest of the line under way
            # at `start` (it belongs to the part before), or empty if a line starts there.
            position = max(part.start - 1, 0)
            raw.seek(position)
            lines = _split_lines(lambda: raw.read(_CHUNK))
            if part.start > 0:
                position += len(next(lines, b"")) + 1
            stop = part.stop if part.stop >= 0 else None
            self._first_offset = position
            for line in lines:
                if stop is not None and position >= stop:
                    return
                self.count += 1
                yield line
                position += len(line) + 1


def _line_documents(
    part: InputPart, field: str, bad: Callable[[DataReadError], None]
) -> Iterator[str]:
    """The documents of a text or JSON-lines part, as `TextFileSource` reads its lines.

    Good lines take a short path (this loop runs once per document of the
    corpus); a bad line is handed to the same checks as `TextFileSource`'s, so
    the error is the same.
    """
    jsonl = part.kind == "jsonl"
    decode_json = json.JSONDecoder().decode  # what json.loads(str) calls
    lines = _Lines(part)
    for index, line in enumerate(lines):
        content = line.rstrip(b"\r\n")
        if not content.strip():
            continue
        try:
            text = content.decode("utf-8")
            if jsonl:
                try:
                    value = decode_json(text)[field]
                except (ValueError, KeyError, TypeError, IndexError):
                    value = None
                if type(value) is not str:
                    value = jsonl_text(text, field, _line_where(lines, index))
                if b"\\u" in content:
                    _check_encodable(value, field, _line_where(lines, index)())
                text = value
        except UnicodeDecodeError:
            try:
                decode_utf8(content, _line_where(lines, index), _UTF8_ADVICE)
            except DataReadError as error:
                bad(error)
            continue
        except DataReadError as error:
            bad(error)
            continue
        yield text


def _line_where(lines: _Lines, index: int) -> Callable[[], str]:
    """Names a bad line (formatted only when it is used)."""
    return lambda: f"line {lines.number(index)} of {lines.part.path!r}"


def _check_encodable(text: str, field: str, where: str) -> None:
    """JSON escapes can spell lone surrogates (\\ud800), which no tokenizer can encode."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise DataReadError(
            f"{where}: JSON field {field!r} holds an unpaired surrogate "
            f"({text[error.start]!r} at character {error.start}), which is not text."
        ) from error


def _whole_file(part: InputPart) -> Iterator[str]:
    with paths.open_file(part.path, "rb") as raw:
        if part.compression is None:
            content = raw.read()
        else:
            stream = _Decompressed(part.path, raw, part.compression)
            pieces = []
            try:
                while piece := stream.read(_CHUNK):
                    pieces.append(piece)
            except _StreamError as error:
                raise _stream_error(part.path, part.compression, error, None) from error
            content = b"".join(pieces)
    if content:
        yield decode_utf8(content, f"file {part.path!r}", _UTF8_ADVICE)


# ----------------------------------------------------------------------------
# Token arrays.
# ----------------------------------------------------------------------------


def _token_documents(path: str) -> Iterator[np.ndarray]:
    """A `.npy` (1-D: one document; 2-D: one per row) or every array of a `.npz`, in order."""
    local = not paths.is_uri(path)
    try:
        with paths.open_file(path, "rb") as f:
            if local and f.read(6) == b"\x93NUMPY":
                arrays: Iterable[tuple[str, np.ndarray]] = [
                    ("array", np.load(path, mmap_mode="r", allow_pickle=False))
                ]
            else:
                f.seek(0)
                loaded = np.load(f, allow_pickle=False)
                if isinstance(loaded, np.ndarray):
                    arrays = [("array", loaded)]
                else:
                    arrays = ((f"array {name!r}", loaded[name]) for name in loaded.files)
            for name, array in arrays:
                if array.dtype.kind not in "iu" or array.ndim not in (1, 2):
                    raise DataReadError(
                        f"{name} of {path!r} has dtype {array.dtype} and shape {array.shape}; "
                        "token files hold integer arrays, 1-D (one document) or 2-D (one per "
                        "row)."
                    )
                if array.ndim == 1:
                    yield array
                else:
                    yield from array
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as error:
        if isinstance(error, DataReadError):
            raise
        raise DataReadError(
            f"{path!r} is not a readable .npy/.npz token file ({error})."
        ) from error


# ----------------------------------------------------------------------------
# Parquet and Arrow columns.
# ----------------------------------------------------------------------------


@contextlib.contextmanager
def _parquet(path: str) -> Iterator[Any]:
    """A `pyarrow.parquet.ParquetFile` of a local path or URI, closed with its file."""
    import pyarrow.parquet as pq

    with contextlib.ExitStack() as stack:
        source = stack.enter_context(paths.open_file(path, "rb")) if paths.is_uri(path) else path
        try:
            parquet = pq.ParquetFile(source)
        except Exception as error:  # pyarrow raises ArrowInvalid or OSError
            raise DataReadError(f"{path!r} is not a readable Parquet file ({error}).") from error
        stack.callback(parquet.close)
        yield parquet


def _column_kind(path: str, schema: Any, field: str) -> str:
    """ "text" or "tokens" for the column `field`, else an error naming the columns or its type."""
    import pyarrow as pa

    if field not in schema.names:
        raise DataConfigError(
            f"--field={field!r} is not a column of {path!r}; its columns: {schema.names}."
        )
    kind = schema.field(field).type
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind):
        return "text"
    if (pa.types.is_list(kind) or pa.types.is_large_list(kind)) and pa.types.is_integer(
        kind.value_type
    ):
        return "tokens"
    raise DataConfigError(
        f"--field={field!r} of {path!r} has type {schema.field(field).type}; prepare reads a "
        "string column (string or large_string: text) or a list of integers (list or "
        "large_list of int8..uint64: token ids)."
    )


def _table_documents(
    part: InputPart, field: str, bad: Callable[[DataReadError], None], batched: bool
) -> Iterator[str | np.ndarray | TokenBatch]:
    """The rows of a Parquet part or Arrow file, batch by batch."""
    import pyarrow as pa

    where = f"{part.path!r}"
    row = 0
    try:
        if part.kind == "parquet":
            with _parquet(part.path) as parquet:
                kind = _column_kind(part.path, parquet.schema_arrow, field)
                groups = parquet.num_row_groups
                stop = groups if part.stop < 0 else part.stop
                if stop > groups:
                    raise DataReadError(
                        f"{where} has {groups} row groups, but this part reads row groups "
                        f"{part.start}..{stop - 1}; the file changed after find_inputs."
                    )
                metadata = parquet.metadata
                row = sum(metadata.row_group(g).num_rows for g in range(part.start))
                if part.start < stop:
                    batches = parquet.iter_batches(
                        batch_size=_BATCH_ROWS,
                        row_groups=list(range(part.start, stop)),
                        columns=[field],
                        use_threads=False,
                    )
                    for batch in batches:
                        yield from _column_documents(
                            batch.column(field), kind, row, where, field, bad, batched
                        )
                        row += batch.num_rows
            return
        with _arrow_source(part.path) as source:
            file_format = source.read(6) == b"ARROW1"
            source.seek(0)
            if file_format:
                reader = pa.ipc.open_file(source)
                batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
            else:
                reader = pa.ipc.open_stream(source)
                batches = iter(reader)
            kind = _column_kind(part.path, reader.schema, field)
            end = source.tell()  # where the last message read ends
            for batch in batches:
                end = source.tell()
                yield from _column_documents(
                    batch.column(field), kind, row, where, field, bad, batched
                )
                row += batch.num_rows
            if not file_format:
                _check_stream_end(part.path, source, end, row)
    except (OSError, pa.ArrowException) as error:
        raise DataReadError(
            f"{where} cannot be read after row {row} (counting from 0) ({error}); it is damaged "
            "or truncated."
        ) from error


@contextlib.contextmanager
def _arrow_source(path: str) -> Iterator[Any]:
    """A local Arrow file memory-mapped (HF files can be GBs), or a remote one as a file object."""
    import pyarrow as pa

    source = paths.open_file(path, "rb") if paths.is_uri(path) else pa.memory_map(path, "r")
    with source:
        yield source


def _check_stream_end(path: str, source: Any, end: int, rows: int) -> None:
    """Checks the end-of-stream marker follows the last message read.

    pyarrow reads a stream cut at a message boundary as a complete one.
    """
    source.seek(end)
    if source.read(len(_ARROW_END)) != _ARROW_END:
        raise DataReadError(
            f"{path!r} is a truncated Arrow stream: it ends after row {rows} without the "
            "end-of-stream marker, so later rows may be missing. Copy or write it again."
        )


def _column_documents(
    column: Any,
    kind: str,
    first_row: int,
    where: str,
    field: str,
    bad: Callable[[DataReadError], None],
    batched: bool = False,
) -> Iterator[str | np.ndarray | TokenBatch]:
    """A batch's values of the column: `str`, or integer arrays without a Python int per id."""

    def null(row: int, what: str) -> None:
        bad(DataReadError(f"row {row} (counting from 0) of {where}: --field={field!r} {what}."))

    if kind == "text":
        for offset, value in enumerate(column.to_pylist()):
            if value is None:
                null(first_row + offset, "is null")
            else:
                yield value
        return
    offsets = column.offsets.to_numpy()
    values = column.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
    offsets = offsets - offsets[0]
    inner_nulls = values.null_count > 0
    if inner_nulls:
        import pyarrow.compute as pc

        value_valid = values.is_valid().to_numpy(zero_copy_only=False)
        values = pc.fill_null(values, 0)
    flat = values.to_numpy(zero_copy_only=False)
    if batched and not inner_nulls and not column.null_count:
        yield TokenBatch(flat, np.diff(offsets))
        return
    valid = column.is_valid().to_numpy(zero_copy_only=False) if column.null_count else None
    for index in range(len(column)):
        if valid is not None and not valid[index]:
            null(first_row + index, "is null")
            continue
        begin, end = int(offsets[index]), int(offsets[index + 1])
        if inner_nulls and not value_valid[begin:end].all():
            null(first_row + index, "holds a null token id")
            continue
        yield flat[begin:end]
