"""Local paths and URIs (gs://, s3://) behind one small set of file operations.

`prepare` and `index` read their inputs and write their shards wherever the
user's corpus lives. `etils.epath` routes a URI to the filesystem the user
has installed (gcsfs, s3fs) and a plain path to the local one, so the
preparation code is written once. Two things epath does not cover are kept
here: local modification times in nanoseconds (epath gives whole seconds,
too coarse to notice a file rewritten within a second), and ArrayRecord,
whose writer only writes local files: a shard for a URI is written to a
local temporary file and copied up when complete.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterable, Iterator
from typing import IO, Any

import numpy as np
from etils import epath

from xlstm_data.errors import DataConfigError


def is_uri(path: str) -> bool:
    """Whether `path` names a remote filesystem (`scheme://...`)."""
    return "://" in path


def absolute(path: str) -> str:
    """`path` made absolute when it is local; URIs are absolute already."""
    return path if is_uri(path) else os.path.abspath(path)


def parent(path: str) -> str:
    """The directory holding `path` (a URI keeps its scheme)."""
    if is_uri(path):
        return path.rstrip("/").rsplit("/", 1)[0]
    return os.path.dirname(os.path.abspath(path))


def basename(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1] if is_uri(path) else os.path.basename(path)


def has_wildcard(text: str) -> bool:
    return any(char in text for char in "*?[")


def glob_uri(pattern: str, arg: str) -> list[str]:
    """The files and directories a URI glob matches, sorted, each as `scheme://bucket/key`.

    Raises:
      DataConfigError: For a wildcard in the bucket name (`arg` names the flag).
    """
    scheme, rest = pattern.split("://", 1)
    words = rest.split("/")
    fixed = next(i for i, word in enumerate(words) if has_wildcard(word))
    if fixed == 0:
        raise DataConfigError(
            f"{arg}={pattern!r}: a wildcard in the bucket name is not supported; name the bucket."
        )
    base = f"{scheme}://" + "/".join(words[:fixed])
    return sorted({_as_uri(str(p), scheme) for p in epath.Path(base).glob("/".join(words[fixed:]))})


def _as_uri(found: str, scheme: str) -> str:
    """A glob result as `scheme://bucket/key`, whichever way the filesystem spelled it.

    gcsfs answers "bucket/key" (epath prefixes the scheme), other fsspec
    filesystems answer with their scheme, which epath then prefixes again.
    """
    rest = found.split("://", 1)[1] if "://" in found else found
    while rest.startswith(f"{scheme}:"):
        rest = rest[len(scheme) + 1 :]
    return f"{scheme}://{rest.lstrip('/')}"


def join(directory: str, *names: str) -> str:
    if is_uri(directory):
        return "/".join([directory.rstrip("/"), *names])
    return os.path.join(directory, *names)


def open_file(path: str, mode: str = "rb") -> IO[Any]:
    if is_uri(path):
        return epath.Path(path).open(mode)
    return open(path, mode)  # noqa: SIM115 (the caller closes it)


def exists(path: str) -> bool:
    return epath.Path(path).exists() if is_uri(path) else os.path.exists(path)


def makedirs(path: str) -> None:
    if is_uri(path):
        epath.Path(path).mkdir(parents=True, exist_ok=True)
    else:
        os.makedirs(path, exist_ok=True)


def listdir(path: str) -> list[str]:
    if not exists(path):
        return []
    if is_uri(path):
        return sorted(child.name for child in epath.Path(path).iterdir())
    return sorted(os.listdir(path))


def remove(path: str) -> None:
    if is_uri(path):
        epath.Path(path).unlink(missing_ok=True)
    elif os.path.exists(path):
        os.remove(path)


def replace(source: str, destination: str) -> None:
    if is_uri(source) or is_uri(destination):
        epath.Path(source).replace(destination)
    else:
        os.replace(source, destination)


def size(path: str) -> int | None:
    """The file's size in bytes, or None if it does not exist."""
    try:
        return stat(path)[0]
    except (OSError, FileNotFoundError):
        return None


def stat(path: str) -> tuple[int, int]:
    """(size in bytes, modification time in ns): what a finished step depends on."""
    if is_uri(path):
        result = epath.Path(path).stat()
        return int(result.length), int(result.mtime) * 10**9
    result = os.stat(path)
    return int(result.st_size), int(result.st_mtime_ns)


def read_json(path: str) -> Any:
    with open_file(path, "r") as f:
        return json.load(f)


def partial_name(path: str) -> str:
    """A temporary name for writing `path`, unique, so two workers redoing the same
    step (a retried Beam bundle) never write into one file; renaming is atomic."""
    return f"{path}.{uuid.uuid4().hex[:12]}.partial"


def write_bytes_atomically(path: str, data: bytes) -> None:
    """Writes under a partial name and renames, so a reader never sees half a file."""
    partial = partial_name(path)
    with open_file(partial, "wb") as f:
        f.write(data)
    replace(partial, path)


def write_npy_atomically(path: str, array: Any) -> None:
    partial = partial_name(path)
    with open_file(partial, "wb") as f:
        np.save(f, array)
    replace(partial, path)


def write_npy_in_pieces(path: str, pieces: Iterable[np.ndarray], count: int, dtype: Any) -> None:
    """Writes the `count` values of `pieces`, in order, as one 1-D `.npy` (the bytes
    `np.save` writes for their concatenation) without holding them all: a corpus of
    10^9 documents has 4 GB of lengths.

    Raises:
      ValueError: If the pieces do not hold `count` values.
    """
    dtype = np.dtype(dtype)
    header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False}
    partial = partial_name(path)
    written = 0
    with open_file(partial, "wb") as f:
        np.lib.format.write_array_header_1_0(f, {**header, "shape": (count,)})
        for piece in pieces:
            values = np.ascontiguousarray(piece, dtype=dtype)
            written += values.size
            if written > count:
                break
            f.write(memoryview(values))
    if written != count:
        remove(partial)
        raise ValueError(f"{path}: expected {count} values, the pieces held {written}")
    replace(partial, path)


def write_json_atomically(path: str, value: Any) -> None:
    write_bytes_atomically(path, json.dumps(value, indent=1).encode())


@contextlib.contextmanager
def local_copy_for_reading(path: str) -> Iterator[str]:
    """A local file holding `path`'s bytes, for readers that open only local files
    (ArrayRecord's); a URI is copied down to a temporary file, deleted afterwards."""
    if not is_uri(path):
        yield path
        return
    with _scratch_file(path) as local:
        _copy(path, local)
        yield local


@contextlib.contextmanager
def local_copy_for_writing(path: str) -> Iterator[str]:
    """A local file to write `path` through; a URI gets its content copied up on success."""
    if not is_uri(path):
        yield path
        return
    with _scratch_file(path) as local:
        yield local
        _copy(local, path)


@contextlib.contextmanager
def _scratch_file(path: str) -> Iterator[str]:
    """A local temporary file name ending like `path`'s; its directory is deleted after."""
    directory = tempfile.mkdtemp(prefix="xlstm-data-")
    try:
        yield os.path.join(directory, basename(path))
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _copy(source: str, destination: str) -> None:
    with open_file(source, "rb") as reader, open_file(destination, "wb") as writer:
        shutil.copyfileobj(reader, writer, 16 << 20)
