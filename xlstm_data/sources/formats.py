"""How raw bytes are read as text: compression, UTF-8 and JSON lines, in one place.

`prepare` (reading a corpus) and `TextFileSource` (reading the same files in
place) must agree byte for byte: the same compressed files refused or
decompressed, the same UTF-8 errors, the same JSON-lines field extraction and
error messages. Both import these from here, so `sources` needs nothing of
`prepare` (which is built on `sources`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping

from xlstm_data.errors import DataReadError

#: A file's first bytes and the compression they mean.
COMPRESSION_MAGIC = ((b"\x1f\x8b", "gzip"), (b"\x28\xb5\x2f\xfd", "zstd"))


def compression_of(head: bytes) -> str | None:
    """ "gzip", "zstd" or None, from a file's first bytes."""
    return next((name for magic, name in COMPRESSION_MAGIC if head.startswith(magic)), None)


def where_text(where: str | Callable[[], str]) -> str:
    """The record named by `where` (or by calling it: hot paths format no string)."""
    return where if isinstance(where, str) else where()


#: What `decode_utf8` suggests for a record a source reads that is not UTF-8.
RECORD_UTF8_ADVICE = (
    "the record may be token ids (record_format='tokens') or the file may use another encoding."
)


def decode_utf8(
    raw: bytes, where: str | Callable[[], str], advice: str = RECORD_UTF8_ADVICE
) -> str:
    """Decodes UTF-8 strictly, raising DataReadError naming `where` and what to do (`advice`)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataReadError(
            f"{where_text(where)}: is not valid UTF-8 text (byte {e.start}: {e.reason}); {advice}"
        ) from e


def jsonl_text(line: str, field: str, where: str | Callable[[], str]) -> str:
    """Extracts `field` from one JSONL line, raising DataReadError naming `where`."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise DataReadError(
            f"{where_text(where)}: is not valid JSON ({e.msg} at column {e.colno}); each line "
            "of a JSONL file must be one JSON object."
        ) from e
    if not isinstance(obj, Mapping):
        raise DataReadError(
            f"{where_text(where)}: is a JSON {type(obj).__name__}, not an object with a "
            f"{field!r} key."
        )
    if field not in obj:
        keys = sorted(obj)[:10]
        raise DataReadError(
            f"{where_text(where)}: JSON object has no {field!r} key (keys: {keys}); set "
            "jsonl_field to the key holding the document text."
        )
    value = obj[field]
    if not isinstance(value, str):
        raise DataReadError(
            f"{where_text(where)}: JSON field {field!r} is a {type(value).__name__}, not a string."
        )
    return value
