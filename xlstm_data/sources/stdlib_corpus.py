"""A corpus that is already on every machine with Python: the standard library.

The demo config trains on it so that it needs no download: the library's own
source files form a "code" dataset and their docstrings a "prose" dataset.
Files are listed in sorted order so every host sees the same documents.

Extracting the docstrings parses every file (5.4 s of a 14 s demo run on the
2-core CI machine, measured with cProfile), so the texts are kept in the
xlstm-data cache directory, keyed by the files' paths, sizes and mtimes and
the Python version; the next run on the machine reads them back.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import sys
import sysconfig
from pathlib import Path

from absl import logging

from xlstm_data.errors import DataConfigError
from xlstm_data.sources.in_memory import InMemorySource
from xlstm_data.sources.lengths_cache import (
    cache_dir,
    cache_key,
    file_signature,
    write_atomically,
)
from xlstm_data.sources.text_files import TextFileSource
from xlstm_data.sources.tokenizers import Tokenizer

PARTS = ("code", "docstrings")


def stdlib_files(max_files: int | None = None) -> list[str]:
    """Top-level `*.py` files of the standard library, sorted by name."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(str(p) for p in root.glob("*.py") if p.stat().st_size > 0)
    if not files:
        raise DataConfigError(f"no standard-library sources found under {root}")
    return files[:max_files] if max_files else files


def _docstrings(path: str) -> list[str]:
    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8", errors="replace"))
    except SyntaxError:
        return []
    nodes = [tree] + [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
    ]
    texts = (ast.get_docstring(n) for n in nodes)
    return [t for t in texts if t and len(t) >= 20]


def stdlib_source(
    part: str, tokenizer: Tokenizer | str | None = None, max_files: int | None = None
) -> TextFileSource | InMemorySource:
    """The standard library as a document source.

    Args:
      part: `"code"` (one document per source file) or `"docstrings"` (one
        document per module, class or function docstring).
      tokenizer: Tokenizer of the text; default the byte tokenizer.
      max_files: Use only the first files (sorted), for small runs.

    Returns:
      A random-access source of `{"tokens": ...}` documents.
    """
    if part not in PARTS:
        raise DataConfigError(f"python_stdlib part={part!r} is invalid; valid parts: {PARTS}")
    files = stdlib_files(max_files)
    if part == "code":
        return TextFileSource(files, tokenizer=tokenizer, unit="file")
    return InMemorySource(_cached_docstrings(files), tokenizer=tokenizer)


def _cached_docstrings(files: list[str]) -> list[str]:
    """The docstrings of `files`, from the cache when the files are unchanged."""
    key = cache_key(
        {"stdlib_docstrings": [file_signature(f) for f in files], "python": sys.version}
    )
    path = os.path.join(cache_dir(), "stdlib", f"{key}.json")
    with contextlib.suppress(OSError, ValueError), open(path, encoding="utf-8") as f:
        return json.load(f)
    texts = [text for file in files for text in _docstrings(file)]
    try:
        write_atomically(path, lambda f: f.write(json.dumps(texts).encode("utf-8")))
    except OSError as error:  # an optimisation only
        logging.warning("cannot cache the standard library's docstrings in %s: %s", path, error)
    return texts
