"""A document source as a grain `MapDataset`, without per-read metrics.

`grain.MapDataset.source` records the bytes and latency of every read in its
Prometheus metrics, walking each document dict to size it. On our sources,
which already decode and check every record, that bookkeeping cost more than
the decode (about 15 us per document, `bench/README.md`). This leaf dataset
reads the source directly; slicing, shuffling and worker sharding work as
for any `MapDataset`.
"""

from __future__ import annotations

from typing import Any

import grain


class SourceDataset(grain.MapDataset):
    """Random access to a source's documents (`len` and `source[i]`)."""

    def __init__(self, source: Any):
        super().__init__()
        self._source = source
        self._length = len(source)

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self.slice(index)
        return self._source[index % self._length]

    def __str__(self) -> str:
        return f"SourceDataset({type(self._source).__name__})"
