"""The inputs of `prepare`: finding them, telling their kind, and streaming their documents.

Corpora arrive as plain or compressed text and JSON lines, Parquet, Arrow
files of a HuggingFace dataset, or token arrays. What a file is comes from
its first bytes (compression, Parquet, Arrow, numpy) before its suffix, so a
`.jsonl` that is really gzip, or a `.gz` without an inner suffix, is read
right; a file that is none of these is refused by name instead of being
tokenized as text.

Big inputs are split into parts that workers tokenize in parallel: an
uncompressed text or JSON-lines file into line-aligned byte ranges (a line
belongs to the part its first byte is in), a Parquet file into runs of row
groups. Reading is streaming everywhere (row group by row group, line by
line, chunk by chunk of a compressed stream), so memory stays bounded on
multi-GB files.

A zstd stream cut short reads back as a clean end of data with the
`zstandard` package's stream reader, which would lose the rest of the file
silently. Frames are therefore decompressed here and a stream that ends
inside a frame is an error naming the file and the line reached.
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import os
import zlib
from collections.abc import Callable, Iterator, Sequence
from typing import IO, Any

import numpy as np

from xlstm_data.errors import DataConfigError, DataReadError
from xlstm_data.prepare import paths
from xlstm_data.sources.base import TEXT_UNITS, expand_files

INPUT_FORMATS = ("auto", "text", "jsonl", "parquet", "arrow", "tokens")
_KINDS = INPUT_FORMATS[1:]
_SUPPORTED = (
    "text and JSON lines (plain, .gz or .zst), Parquet, Arrow (a HuggingFace dataset "
    "directory written by save_to_disk), .npy/.npz token arrays"
)
_COMPRESSION_SUFFIXES = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}
_MAGIC = (
    (b"\x1f\x8b", "gzip"),
    (b"\x28\xb5\x2f\xfd", "zstd"),
    (b"PAR1", "parquet"),
    (b"ARROW1", "arrow"),
    (b"\xff\xff\xff\xff", "arrow"),
    (b"\x93NUMPY", "npy"),
    (b"PK\x03\x04", "npz"),
)
_FOREIGN = (
    (b"BZh", "bzip2-compressed"),
    (b"\xfd7zXZ\x00", "xz-compressed"),
    (b"\x89PNG", "a PNG image"),
    (b"%PDF", "a PDF document"),
    (b"7z\xbc\xaf", "a 7-zip archive"),
)
_CHUNK = 1 << 20


@dataclasses.dataclass(frozen=True)
class InputPart:
    """One unit of work: a whole input file, or a slice of one.

    Attributes:
      path: The file (a local path or a URI).
      kind: "text", "jsonl", "parquet", "arrow" or "tokens".
      compression: "gzip", "zstd" or None, from the file's first bytes.
      part: This part's number in its file.
      parts: The file's number of parts.
      start: First byte (uncompressed text) or row group (Parquet); else 0.
      stop: End byte or row group (exclusive); -1: the end of the file.
    """

    path: str
    kind: str
    compression: str | None
    part: int
    parts: int
    start: int
    stop: int


@dataclasses.dataclass
class SkippedLines:
    """Bad lines or rows skipped under `skip_bad_lines`: how many, and a few described."""

    count: int = 0
    examples: list[str] = dataclasses.field(default_factory=list)

    def add(self, description: str) -> None:
        self.count += 1
        if len(self.examples) < 3:
            self.examples.append(description)


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

    Args:
      patterns: Files, globs (local or URI) or HuggingFace dataset directories.
        Each pattern's matches are sorted; a file matched twice is read once.
      input_format: "auto" (from the bytes, then the suffix) or a kind.
      unit: "line" or "file" (a whole text file is one document).
      part_bytes: Uncompressed text and Parquet inputs bigger than this are
        split into parts of about this size.

    Raises:
      DataConfigError: On a bad argument, a pattern matching nothing, or an
        input of a kind that is not read (named, with the kinds that are).
    """
    if input_format not in INPUT_FORMATS:
        raise DataConfigError(
            f"--format={input_format!r} is invalid; valid formats: {list(INPUT_FORMATS)}"
        )
    if unit not in TEXT_UNITS:
        raise DataConfigError(f"--unit={unit!r} is invalid; valid units: {list(TEXT_UNITS)}")
    if isinstance(part_bytes, bool) or not isinstance(part_bytes, int) or part_bytes < 1:
        raise DataConfigError(f"--part_mb: part_bytes={part_bytes!r} must be an integer >= 1")
    files: dict[str, None] = {}
    for pattern in patterns:
        for path in _expand(os.fspath(pattern)):
            files.setdefault(path, None)
    parts = []
    for path in files:
        compression, kind = _kind_of(path, input_format)
        if unit == "file" and kind == "jsonl":
            raise DataConfigError(
                f"--unit=file cannot read {path!r}, JSON lines (one document per line); use "
                "--unit=line, or --format=text to take the whole file as one document"
            )
        parts += _parts(path, kind, compression, unit, part_bytes)
    return parts


def _expand(pattern: str) -> list[str]:
    """A pattern's files; a HuggingFace dataset directory becomes its Arrow files."""
    if paths.is_uri(pattern):
        return _expand_uri(pattern)
    text = os.path.expanduser(pattern)
    if os.path.isdir(text):
        return _dataset_files(text)
    return expand_files(text, "INPUT")


def _expand_uri(pattern: str) -> list[str]:
    from etils import epath

    if not any(char in pattern for char in "*?["):
        path = epath.Path(pattern)
        if path.is_dir():
            return _dataset_files(pattern)
        if path.exists():
            return [pattern]
        raise DataConfigError(f"INPUT={pattern!r} does not exist")
    scheme, rest = pattern.split("://", 1)
    words = rest.split("/")
    fixed = next(i for i, word in enumerate(words) if any(c in word for c in "*?["))
    base = f"{scheme}://" + "/".join(words[:fixed])
    matches = sorted(str(p) for p in epath.Path(base).glob("/".join(words[fixed:])))
    matches = [m if "://" in m else f"{scheme}://{m.lstrip('/')}" for m in matches]
    if not matches:
        raise DataConfigError(f"INPUT={pattern!r} matches no file; pass an existing URI or glob")
    return matches


def _dataset_files(directory: str) -> list[str]:
    """The Arrow files of a `save_to_disk` directory, in `state.json` order."""
    if paths.exists(paths.join(directory, "dataset_dict.json")):
        splits = paths.read_json(paths.join(directory, "dataset_dict.json")).get("splits", [])
        examples = ", ".join(repr(paths.join(directory, s)) for s in splits)
        raise DataConfigError(
            f"INPUT={directory!r} is a HuggingFace DatasetDict with splits {splits}; pass one "
            f"split's directory, e.g. {examples}"
        )
    state = paths.join(directory, "state.json")
    if not paths.exists(state):
        raise DataConfigError(
            f"INPUT={directory!r} is a directory, and not a HuggingFace dataset written by "
            f"save_to_disk (it has no state.json); pass its files, e.g. "
            f"{paths.join(directory, '*')!r}"
        )
    names = [entry["filename"] for entry in paths.read_json(state).get("_data_files", [])]
    if not names:
        raise DataConfigError(f"INPUT={directory!r}: its state.json lists no _data_files")
    return [paths.join(directory, name) for name in names]


def _head(path: str, size: int = 8) -> bytes:
    with paths.open_file(path, "rb") as f:
        return f.read(size)


def _magic(head: bytes) -> str | None:
    return next((name for magic, name in _MAGIC if head.startswith(magic)), None)


def _kind_of(path: str, input_format: str) -> tuple[str | None, str]:
    """(compression, kind) of an input, from its first bytes, then its suffix."""
    head = _head(path)
    magic = _magic(head)
    compression = magic if magic in ("gzip", "zstd") else None
    if compression is None:
        foreign = next((name for m, name in _FOREIGN if head.startswith(m)), None)
        if foreign is not None:
            raise DataConfigError(
                f"INPUT {path!r} is {foreign}, which prepare does not read; supported: {_SUPPORTED}"
            )
    name = path.lower()
    for suffix in _COMPRESSION_SUFFIXES:
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    binary = {"parquet": "parquet", "arrow": "arrow", "npy": "tokens", "npz": "tokens"}
    if input_format != "auto":
        kind = input_format
        if kind in ("parquet", "arrow", "tokens") and binary.get(magic or "") != kind:
            raise DataConfigError(
                f"--format={kind} but INPUT {path!r} is not a {kind} file (it starts with "
                f"{head[:8]!r}); supported: {_SUPPORTED}"
            )
    elif magic in binary:
        kind = binary[magic]
    elif name.endswith(".jsonl"):
        kind = "jsonl"
    elif name.endswith(".json"):
        kind = _sniff_json(path, compression)
    elif name.endswith((".parquet", ".arrow", ".npy", ".npz")):
        raise DataConfigError(
            f"INPUT {path!r} is named like a {name.rsplit('.', 1)[1]} file but its bytes are "
            f"not one (it starts with {head[:8]!r}); supported: {_SUPPORTED}"
        )
    else:
        kind = "text"
    if compression and kind in ("parquet", "arrow", "tokens"):
        raise DataConfigError(
            f"INPUT {path!r} is a {compression}-compressed {kind} file; decompress it first "
            f"(prepare reads compressed text and JSON lines only)"
        )
    if kind in ("text", "jsonl"):
        _check_not_binary(path, compression)
    return compression, kind


def _check_not_binary(path: str, compression: str | None) -> None:
    with _open_stream(path, compression) as stream:
        try:
            head = stream.read(4096)
        except (EOFError, OSError, DataReadError):
            return  # a damaged stream is reported, with its line, when read
    if b"\x00" in head:
        raise DataConfigError(
            f"INPUT {path!r} holds NUL bytes, so it is binary, not text; supported: {_SUPPORTED}"
        )


def _sniff_json(path: str, compression: str | None) -> str:
    """A `.json` file is JSON lines when its first non-blank line is a JSON object."""
    with _open_stream(path, compression) as stream:
        for line in _split_lines(_chunks(stream)):
            if line.strip():
                try:
                    if isinstance(json.loads(line), dict):
                        return "jsonl"
                except ValueError:
                    pass
                break
    raise DataConfigError(
        f"INPUT {path!r} ends in .json but does not hold one JSON object per line (a single "
        "JSON document is not read); pass --format=text to tokenize its characters, braces "
        "included, or convert it to JSON lines"
    )


def _parts(
    path: str, kind: str, compression: str | None, unit: str, part_bytes: int
) -> list[InputPart]:
    if kind in ("text", "jsonl") and compression is None and unit == "line":
        size = paths.size(path) or 0
        count = max(1, -(-size // part_bytes))
        return [
            InputPart(path, kind, None, k, count, k * part_bytes, min(size, (k + 1) * part_bytes))
            for k in range(count)
        ]
    if kind == "parquet":
        groups = _parquet_group_runs(path, part_bytes)
        return [
            InputPart(path, kind, None, k, len(groups), start, stop)
            for k, (start, stop) in enumerate(groups)
        ]
    return [InputPart(path, kind, compression, 0, 1, 0, -1)]


def _parquet_group_runs(path: str, part_bytes: int) -> list[tuple[int, int]]:
    """Consecutive row groups of about `part_bytes` (uncompressed) each."""
    with paths.open_file(path, "rb") as f:
        metadata = _parquet_file(path, f).metadata
    runs, start, size = [], 0, 0
    for group in range(metadata.num_row_groups):
        size += metadata.row_group(group).total_byte_size
        if size >= part_bytes:
            runs.append((start, group + 1))
            start, size = group + 1, 0
    if start < metadata.num_row_groups or not runs:
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
) -> Iterator[str | np.ndarray]:
    """The part's documents: text as `str`, token ids as 1-D integer arrays.

    Text follows `TextFileSource`: with unit="line" every line that is not
    blank is a document (JSON lines: its `field`, which must be a string);
    with unit="file" every non-empty file is one.

    Raises:
      DataReadError: On a line or row that cannot be read (file and line or
        row named), unless `skip_bad_lines`; always on a truncated stream.
    """
    skipped = skipped if skipped is not None else SkippedLines()

    def bad(error: DataReadError) -> None:
        if not skip_bad_lines:
            raise error
        skipped.add(str(error))

    if part.kind == "tokens":
        yield from _token_documents(part.path)
    elif part.kind == "parquet" or part.kind == "arrow":
        yield from _table_documents(part, field, bad)
    elif unit == "file":
        yield from _whole_file(part)
    else:
        yield from _line_documents(part, field, bad)


def _line_documents(
    part: InputPart, field: str, bad: Callable[[DataReadError], None]
) -> Iterator[str]:
    from xlstm_data.sources.text_files import _jsonl_text

    for line_number, raw in _numbered_lines(part):
        content = raw.rstrip(b"\r\n")
        if not content.strip():
            continue
        where = f"line {line_number} of {part.path!r}"
        try:
            text = _utf8(content, where)
            yield _jsonl_text(text, field, where) if part.kind == "jsonl" else text
        except DataReadError as error:
            bad(error)


def _utf8(content: bytes, where: str) -> str:
    try:
        return content.decode("utf-8")
    except UnicodeDecodeError as error:
        raise DataReadError(
            f"{where}: is not valid UTF-8 (byte {error.start}); prepare reads UTF-8 text"
        ) from error


def _numbered_lines(part: InputPart) -> Iterator[tuple[int, bytes]]:
    """(line number, line) of the lines that start in the part's byte range."""
    if part.compression is not None:
        with _open_stream(part.path, part.compression) as stream:
            for number, line in enumerate(_split_lines(_chunks(stream)), 1):
                yield number, line
        return
    with paths.open_file(part.path, "rb") as f:
        position = part.start
        if part.start > 0:
            f.seek(part.start - 1)
            if f.read(1) != b"\n":  # the line under way belongs to the previous part
                position += len(f.readline())
        stop = part.stop if part.stop >= 0 else float("inf")
        first = None
        for line in _split_lines(_chunks(f)):
            if position >= stop:
                return
            if first is None:
                first = _line_number_at(part.path, position)
            yield first, line
            first += 1
            position += len(line)


def _line_number_at(path: str, offset: int) -> int:
    """The line number of the line starting at byte `offset` (newlines before it + 1)."""
    count, done = 0, 0
    with paths.open_file(path, "rb") as f:
        while done < offset:
            chunk = f.read(min(_CHUNK, offset - done))
            if not chunk:
                break
            count += chunk.count(b"\n")
            done += len(chunk)
    return count + 1


def _chunks(stream: IO[bytes]) -> Iterator[bytes]:
    while chunk := stream.read(_CHUNK):
        yield chunk


def _split_lines(chunks: Iterator[bytes]) -> Iterator[bytes]:
    """Lines (with their newline) of a byte stream given in chunks."""
    pending = b""
    for chunk in chunks:
        lines = (pending + chunk).split(b"\n")
        pending = lines.pop()
        for line in lines:
            yield line + b"\n"
    if pending:
        yield pending


def _whole_file(part: InputPart) -> Iterator[str]:
    with _open_stream(part.path, part.compression) as stream:
        content = b"".join(_chunks(stream))
    if content:
        yield _utf8(content, f"file {part.path!r}")


def _open_stream(path: str, compression: str | None) -> Any:
    """The file's decompressed bytes as a binary stream (closes the file with it)."""
    raw = paths.open_file(path, "rb")
    if compression == "gzip":
        return _GzipStream(path, raw)
    if compression == "zstd":
        return _ZstdStream(path, raw)
    return raw


class _GzipStream(io.RawIOBase):
    """gzip with truncation and corruption named by file and decompressed offset."""

    def __init__(self, path: str, raw: IO[bytes]):
        self._path = path
        self._raw = raw
        self._gzip = gzip.GzipFile(fileobj=raw)
        self._offset = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        try:
            data = self._gzip.read(len(buffer))
        except (EOFError, OSError, zlib.error) as error:
            raise DataReadError(
                f"{self._path!r} is a damaged or truncated gzip stream: it ends after "
                f"{self._offset} decompressed bytes ({error}); the lines read so far are not "
                "the whole file, re-download or recompress it"
            ) from error
        buffer[: len(data)] = data
        self._offset += len(data)
        return len(data)

    def close(self) -> None:
        self._gzip.close()
        self._raw.close()
        super().close()


class _ZstdStream(io.RawIOBase):
    """zstd frame by frame, refusing a stream that ends inside a frame."""

    def __init__(self, path: str, raw: IO[bytes]):
        import zstandard

        self._path = path
        self._raw = raw
        self._zstd = zstandard
        self._decompressor = zstandard.ZstdDecompressor()
        self._frame = self._decompressor.decompressobj()
        self._started = False
        self._pending = b""
        self._offset = 0

    def readable(self) -> bool:
        return True

    def _more(self) -> bytes:
        while True:
            compressed = self._raw.read(_CHUNK)
            if not compressed:
                if self._started and not self._frame.eof:
                    raise DataReadError(
                        f"{self._path!r} is a truncated zstd stream: it ends inside a frame "
                        f"after {self._offset} decompressed bytes; the lines read so far are "
                        "not the whole file, re-download or recompress it"
                    )
                return b""
            out = []
            while compressed:
                if self._frame.eof:
                    self._frame = self._decompressor.decompressobj()
                self._started = True
                try:
                    out.append(self._frame.decompress(compressed))
                except self._zstd.ZstdError as error:
                    raise DataReadError(
                        f"{self._path!r} is a damaged zstd stream after {self._offset} "
                        f"decompressed bytes ({error})"
                    ) from error
                compressed = self._frame.unused_data if self._frame.eof else b""
            data = b"".join(out)
            if data:
                return data

    def readinto(self, buffer: Any) -> int:
        if not self._pending:
            self._pending = self._more()
        size = min(len(buffer), len(self._pending))
        buffer[:size] = self._pending[:size]
        self._pending = self._pending[size:]
        self._offset += size
        return size

    def close(self) -> None:
        self._raw.close()
        super().close()


def _token_documents(path: str) -> Iterator[np.ndarray]:
    """Documents of a `.npy` (1-D: one document; 2-D: one per row) or `.npz` file."""
    try:
        with paths.open_file(path, "rb") as f:
            loaded = np.load(io.BytesIO(f.read()), allow_pickle=False)
    except (OSError, ValueError) as error:
        raise DataReadError(f"prepare: cannot read token file {path!r}: {error}") from error
    arrays = [loaded[k] for k in loaded.files] if hasattr(loaded, "files") else [loaded]
    for number, array in enumerate(arrays):
        if array.dtype.kind not in "iu" or array.ndim not in (1, 2):
            raise DataReadError(
                f"prepare: array {number} in {path!r} has dtype {array.dtype} and shape "
                f"{array.shape}; token files hold 1-D (one document) or 2-D (one per row) "
                "integer arrays"
            )
        yield from ([array] if array.ndim == 1 else list(array))


# ----------------------------------------------------------------------------
# Parquet and Arrow columns.
# ----------------------------------------------------------------------------


def _parquet_file(path: str, f: IO[bytes]) -> Any:
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(f)
    except Exception as error:  # pyarrow raises ArrowInvalid / OSError
        raise DataReadError(f"{path!r} is not a readable Parquet file ({error})") from error


def _column_kind(path: str, schema: Any, field: str) -> str:
    """ "text" or "tokens" for the column `field`, else an error naming the columns or type."""
    import pyarrow as pa

    if field not in schema.names:
        raise DataConfigError(
            f"--field={field!r} is not a column of {path!r}; its columns: {schema.names}"
        )
    kind = schema.field(field).type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return "text"
    if (pa.types.is_list(kind) or pa.types.is_large_list(kind)) and pa.types.is_integer(
        kind.value_type
    ):
        return "tokens"
    raise DataConfigError(
        f"--field={field!r} of {path!r} has type {kind}; prepare reads a string column (text) "
        "or a list of integers (token ids)"
    )


def _record_batches(part: InputPart, field: str, f: IO[bytes]) -> tuple[Any, Iterator[Any]]:
    """(schema, record batches of the column) of a Parquet part or Arrow file."""
    import pyarrow as pa

    if part.kind == "parquet":
        parquet = _parquet_file(part.path, f)
        schema = parquet.schema_arrow
        _column_kind(part.path, schema, field)
        groups = list(range(part.start, part.stop if part.stop >= 0 else parquet.num_row_groups))
        return schema, parquet.iter_batches(batch_size=4096, columns=[field], row_groups=groups)
    try:
        reader = pa.ipc.open_stream(f)
        batches: Iterator[Any] = iter(reader)
    except pa.ArrowInvalid:
        f.seek(0)
        try:
            file_reader = pa.ipc.open_file(f)
        except pa.ArrowInvalid as error:
            raise DataReadError(f"{part.path!r} is not a readable Arrow file ({error})") from error
        reader = file_reader
        batches = (file_reader.get_batch(i) for i in range(file_reader.num_record_batches))
    return reader.schema, batches


def _table_documents(
    part: InputPart, field: str, bad: Callable[[DataReadError], None]
) -> Iterator[str | np.ndarray]:
    with paths.open_file(part.path, "rb") as f:
        schema, batches = _record_batches(part, field, f)
        kind = _column_kind(part.path, schema, field)
        row = 0
        for batch in batches:
            column = batch.column(batch.schema.get_field_index(field))
            values = column.to_pylist() if kind == "text" else _token_lists(column)
            for value in values:
                row += 1
                if value is None:
                    bad(
                        DataReadError(
                            f"row {row} of {part.path!r} (part {part.part + 1} of "
                            f"{part.parts}): --field={field!r} is null"
                        )
                    )
                    continue
                yield value


def _token_lists(column: Any) -> list[np.ndarray | None]:
    """A list<int> column as arrays (None for nulls), without a Python int per token."""
    flat = column.flatten().to_numpy(zero_copy_only=False)
    offsets = column.offsets.to_numpy()
    offsets = offsets - offsets[0]
    valid = column.is_valid().to_numpy(zero_copy_only=False)
    return [flat[offsets[i] : offsets[i + 1]] if valid[i] else None for i in range(len(column))]
