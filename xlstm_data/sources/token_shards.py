"""Documents stored back to back in memory-mapped token files, read as zero-copy slices.

Two sources keep their documents this way: the flat shards `xlstm-data
prepare` writes (`flat_tokens`) and Megatron-LM's `.bin`/`.idx` pairs
(`megatron_indexed`). They differ only in where a document's span is
recorded (an offsets file, or the `.idx`'s sequence pointers and lengths),
so each opens a shard its own way and this module does the rest: one map per
shard and process, opened on first read (a source pickles to grain workers
as paths), the documents of a batch gathered with one lookup per shard, the
spans checked against the shard, and every id read checked against the
vocabulary in one pass.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence
from typing import Any, SupportsIndex

import numpy as np

from xlstm_data.errors import DataReadError
from xlstm_data.sources.base import _checked_int32, _in_range


@dataclasses.dataclass(frozen=True)
class MappedShard:
    """One opened shard: its ids and where each of its documents lies in them.

    Attributes:
      tokens: Every id of the shard, 1-D, read-only (over a memory map).
      spans: For documents `local` (an int64 array), the first position of
        each in `tokens` and one past its last id (a stored end-of-document
        id not included). Looked up per read, so opening a shard reads no
        per-document table whole.
    """

    tokens: np.ndarray
    spans: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]


@dataclasses.dataclass(frozen=True)
class ShardFiles:
    """How errors name a shard's files, and how to fix a damaged one.

    Attributes:
      owner: The source's name (e.g. "FlatTokenSource").
      tokens: Each shard's token file.
      spans: Each shard's file recording the documents' spans.
      remedy: What to do about a damaged file.
      first_documents: Each shard's first document's number in its file
        (a part of a split corpus starts inside it); empty: all 0.
    """

    owner: str
    tokens: Sequence[str]
    spans: Sequence[str]
    remedy: str
    first_documents: Sequence[int] = ()

    def document(self, k: int, local: int) -> int:
        """The number in its file of document `local` of shard `k`."""
        return local + (int(self.first_documents[k]) if self.first_documents else 0)


class TokenShards:
    """The documents of several memory-mapped token shards, by global index.

    Args:
      files: How errors name the shards' files.
      documents: Documents per shard.
      open_shard: Maps shard `k` and checks its files (run once per process
        and shard); raises `DataReadError` naming a damaged file.
      vocab_size: Every id read must be below it (and not negative).
      dtype: The ids' storage dtype; when it alone bounds them below
        `vocab_size` (uint16 under 65,536) they are not checked.
    """

    def __init__(
        self,
        files: ShardFiles,
        documents: np.ndarray,
        open_shard: Callable[[int], MappedShard],
        vocab_size: int,
        dtype: np.dtype,
    ):
        self._files = files
        self._open_shard = open_shard
        self._vocab_size = vocab_size
        self._check_ids = not (dtype.kind == "u" and int(np.iinfo(dtype).max) < vocab_size)
        self._ends = np.cumsum(np.asarray(documents, dtype=np.int64))
        self._starts = self._ends - np.asarray(documents, dtype=np.int64)
        self._init_maps()

    def __len__(self) -> int:
        return int(self._ends[-1]) if len(self._ends) else 0

    # Memory maps, one per shard and process ----------------------------------

    def _init_maps(self) -> None:
        self._maps: list[MappedShard | None] = [None] * len(self._ends)
        self._maps_lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        """Drops the maps and their lock (mapped again in the process that reads)."""
        state = self.__dict__.copy()
        del state["_maps"], state["_maps_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_maps()

    def shard(self, k: int) -> MappedShard:
        """Shard `k`, mapped on first use in this process (thread-safe)."""
        mapped = self._maps[k]
        if mapped is None:
            with self._maps_lock:
                mapped = self._maps[k]
                if mapped is None:
                    mapped = self._maps[k] = self._open_shard(k)
        return mapped

    def open_all(self) -> None:
        """Maps (and so checks) every shard now, before training reads any."""
        for k in range(len(self._ends)):
            self.shard(k)

    # Reading ------------------------------------------------------------------

    def read_many(self, indices: Sequence[SupportsIndex] | np.ndarray) -> list[np.ndarray]:
        """Documents `indices` (in [-len, len), repeats allowed) as read-only views of the maps.

        Raises:
          IndexError: If an index is out of range.
          DataReadError: If a shard is damaged or an id is outside the
            vocabulary, naming the file and document.
        """
        index = np.asarray(indices, dtype=np.int64).reshape(-1)
        n = len(self)
        if index.size == 0:
            return []
        low, high = int(index.min()), int(index.max())
        if low < -n or high >= n:
            bad = int(index[(index < -n) | (index >= n)][0])
            raise IndexError(
                f"{self._files.owner}: index {bad} is out of range; valid indices are 0..{n - 1}."
            )
        if low < 0:
            index = np.where(index < 0, index + n, index)
        if len(self._ends) == 1:
            views = self._read_shard(0, index, index)
        else:
            shard_of = np.searchsorted(self._ends, index, side="right")
            first = int(shard_of[0])
            if (shard_of == first).all():
                views = self._read_shard(first, index - self._starts[first], index)
            else:
                views = [None] * len(index)
                for k in np.unique(shard_of).tolist():
                    chosen = np.flatnonzero(shard_of == k)
                    read = self._read_shard(k, index[chosen] - self._starts[k], index[chosen])
                    for j, tokens in zip(chosen.tolist(), read, strict=True):
                        views[j] = tokens
        if self._check_ids:
            self._check_vocabulary(views, index)
        return views

    def _read_shard(self, k: int, local: np.ndarray, global_index: np.ndarray) -> list[np.ndarray]:
        """Documents `local` of shard `k`: slices of its map (spans checked)."""
        mapped = self.shard(k)
        tokens = mapped.tokens
        begin, end = mapped.spans(local)
        if not ((begin <= end).all() and int(begin.min()) >= 0 and int(end.max()) <= len(tokens)):
            bad = int(np.flatnonzero((begin > end) | (begin < 0) | (end > len(tokens)))[0])
            raise DataReadError(
                f"{self._files.owner}: {self._files.spans[k]}: document "
                f"{self._files.document(k, int(local[bad]))} "
                f"(global index {int(global_index[bad])}) spans ids {int(begin[bad])}.."
                f"{int(end[bad])}, outside its shard's {len(tokens)} ids or decreasing; "
                f"the file is damaged: {self._files.remedy}."
            )
        return [tokens[a:b] for a, b in zip(begin.tolist(), end.tolist(), strict=True)]

    def _check_vocabulary(self, views: list[np.ndarray], index: np.ndarray) -> None:
        """Every id read must be in [0, vocab_size): one pass over all of them.

        Only when that fails are the documents checked one by one, so the
        error names the file and the document.
        """
        joined = views[0] if len(views) == 1 else np.concatenate(views)
        if not joined.size:
            return
        if joined.dtype.kind == "u" and int(joined.max()) < self._vocab_size:
            return  # one pass: unsigned ids are never negative
        if joined.dtype.kind != "u" and _in_range(joined, self._vocab_size):
            return
        for view, g in zip(views, index.tolist(), strict=True):
            k = int(np.searchsorted(self._ends, g, side="right"))
            local = self._files.document(k, g - int(self._starts[k]))
            _checked_int32(
                view,
                self._vocab_size,
                f"{self._files.owner}: document {local} of {self._files.tokens[k]!r} "
                f"(global index {g})",
            )
