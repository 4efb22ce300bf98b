"""The index `xlstm-data prepare` writes next to its shards, and reading it back.

Knowing every document's length without reading the documents gives exact
epoch lengths and lets `inspect` plan a run in milliseconds. The index is
only trusted when it lists exactly the shard files being read with the
record counts they really have, so a stale or foreign index is ignored.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

import numpy as np

#: Version of `index.json`; bump on format changes.
PREPARE_FORMAT_VERSION = 1
INDEX_FILE = "index.json"
LENGTHS_FILE = "lengths.npy"


def read_index(directory: str) -> dict | None:
    """The `index.json` of a prepared directory, or None if absent or unreadable."""
    try:
        with open(os.path.join(directory, INDEX_FILE)) as f:
            index = json.load(f)
    except (OSError, ValueError):
        return None
    return index if index.get("format_version") == PREPARE_FORMAT_VERSION else None


def prepared_lengths(files: Sequence[str], record_counts: Sequence[int]) -> np.ndarray | None:
    """Document lengths of shard `files` (in order) from their directory's index.

    Args:
      files: ArrayRecord files, all in one prepared directory (any subset of
        its shards, in any order).
      record_counts: The number of records each file really holds.

    Returns:
      The lengths, or None if the index is missing or does not match.
    """
    directories = {os.path.dirname(os.path.abspath(f)) for f in files}
    if len(directories) != 1:
        return None
    directory = directories.pop()
    index = read_index(directory)
    if index is None:
        return None
    try:
        all_lengths = np.load(os.path.join(directory, LENGTHS_FILE))
    except (OSError, ValueError):
        return None
    starts, offset = {}, 0
    for shard in index.get("shards", []):
        starts[shard["file"]] = (offset, int(shard["documents"]))
        offset += int(shard["documents"])
    if offset != all_lengths.size:
        return None
    pieces = []
    for path, count in zip(files, record_counts, strict=True):
        entry = starts.get(os.path.basename(path))
        if entry is None or entry[1] != count:
            return None
        pieces.append(all_lengths[entry[0] : entry[0] + count])
    return np.concatenate(pieces).astype(np.int64)
