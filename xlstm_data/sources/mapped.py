"""Any random-access documents, with per-document maps, as a source whose lengths are known.

The plan needs every document's token count before the first batch. Sources
of this package know theirs; a user's own random-access dataset (a grain
`MapDataset`, a `Sequence` of dicts) and the reference factories'
`operations` do not: the counts are those of the documents *after* the maps.
`MappedSource` reads every document once, in threads, to count them, and keeps
the counts for the life of the source.

Only maps that are a pure function of the document (and its index) can be
planned: a filter, a random map or a batching would change which documents
exist, or their tokens between the count and the read. They are refused by
position and type.
"""

from __future__ import annotations

import concurrent.futures
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import grain
import numpy as np
from absl import logging

from xlstm_data.errors import DataConfigError
from xlstm_data.sources.base import TokenSource, _checked_int32

#: Documents read per counting task.
_COUNT_CHUNK = 1024
#: A count that runs longer than this logs its progress, every this many seconds.
PROGRESS_SECONDS = 10.0


def per_document_maps(operations: Sequence[Any] | None, arg: str = "operations") -> tuple[Any, ...]:
    """Validates `operations`: each a `grain.transforms.Map` or `MapWithIndex`.

    Anything else (filters, random maps, batching, FlatMaps, callables) is
    refused naming its position, since the plan counts and orders documents
    before any is read.
    """
    if operations is None:
        return ()
    if isinstance(operations, (str, bytes, Mapping)) or not isinstance(operations, Sequence):
        raise DataConfigError(
            f"{arg}={operations!r} is invalid; expected a list of grain.transforms.Map or "
            "grain.transforms.MapWithIndex transformations"
        )
    for index, op in enumerate(operations):
        if not isinstance(op, (grain.transforms.Map, grain.transforms.MapWithIndex)):
            raise DataConfigError(
                f"{arg}[{index}] is a {type(op).__name__}, which the data plan cannot honour: the "
                "plan counts every document's tokens before reading, so only per-document maps "
                "(grain.transforms.Map, grain.transforms.MapWithIndex) are allowed. Filter "
                "documents beforehand; randomness belongs in a map seeded by the document index"
            )
    return tuple(operations)


def _tokens_of(element: Any, where: Callable[[], str]) -> Any:
    if isinstance(element, Mapping):
        if "tokens" not in element:
            raise DataConfigError(
                f"{where()} is a dict without a 'tokens' key (keys: {sorted(element)[:10]}); "
                "each document must be {'tokens': ids} or an array of ids"
            )
        return element["tokens"]
    return element


class MappedSource(TokenSource):
    """Documents of any random-access dataset after per-document maps.

    Args:
      documents: Anything with `__len__` and `__getitem__` whose elements are
        `{"tokens": ids}` dicts or 1-D id arrays (after `maps`).
      maps: From `per_document_maps`.
      vocab_size: Exclusive bound every id is checked against (default: the
        wrapped source's, else the int32 range only).
      name: How errors and logs name the dataset.
    """

    def __init__(
        self,
        documents: Any,
        maps: Sequence[Any] = (),
        *,
        vocab_size: int | None = None,
        name: str = "dataset",
    ) -> None:
        if not (hasattr(documents, "__len__") and hasattr(documents, "__getitem__")):
            raise DataConfigError(
                f"{name} of type {type(documents).__name__} is not random-access; pass a grain "
                "MapDataset, a source of xlstm_data.sources or a Sequence of documents"
            )
        if len(documents) == 0:
            raise DataConfigError(f"{name} is empty; it must hold at least one document")
        self._documents = documents
        self._maps = tuple(maps)
        self._name = name
        self._tokenizer = getattr(documents, "tokenizer", None)
        self.vocab_size = (
            vocab_size if vocab_size is not None else getattr(documents, "vocab_size", None)
        )
        self._token_lengths: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self._documents)

    def _read(self, index: int) -> np.ndarray:
        element = self._documents[index]
        for op in self._maps:
            if isinstance(op, grain.transforms.MapWithIndex):
                element = op.map_with_index(index, element)
            else:
                element = op.map(element)

        def where() -> str:
            return f"{self._name}: document {index}" + (" after operations" if self._maps else "")

        values = np.asarray(_tokens_of(element, where))
        if values.ndim != 1 or (values.size and values.dtype.kind not in "iu"):
            raise DataConfigError(
                f"{where()} is an array of shape {values.shape} dtype {values.dtype}; each "
                "document must be a 1-D integer array of token ids"
            )
        return _checked_int32(values, self.vocab_size, where())

    def lengths(self) -> np.ndarray:
        """Every document's token count after the maps, counted once (in threads).

        Without maps, a wrapped source that knows its lengths answers instead.
        A user's own dataset has no identity that outlives the process (its
        contents may be anything), so the counts are kept in memory, not in
        the on-disk lengths cache.
        """
        if self._token_lengths is None:
            known = getattr(self._documents, "lengths", None)
            if (
                not self._maps
                and callable(known)
                and getattr(self._documents, "has_lengths", lambda: True)()
            ):
                counts = np.asarray(known(), dtype=np.int64)
            else:
                counts = self._count()
            counts.flags.writeable = False
            self._token_lengths = counts
        return self._token_lengths

    def _count(self) -> np.ndarray:
        total = len(self)
        counts = np.zeros(total, np.int64)
        starts = range(0, total, _COUNT_CHUNK)
        threads = max(1, min(os.cpu_count() or 1, len(starts)))
        started = last_report = time.monotonic()
        done = 0

        def count(first: int) -> int:
            end = min(first + _COUNT_CHUNK, total)
            for i in range(first, end):
                counts[i] = len(self._read(i))
            return end - first

        logging.info("%s: counting the tokens of %d documents", self._name, total)
        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            for finished in pool.map(count, starts):
                done += finished
                now = time.monotonic()
                if now - last_report >= PROGRESS_SECONDS:
                    last_report = now
                    rate = done / (now - started)
                    logging.info(
                        "%s: counted %d of %d documents (%.0f%%), about %.0f s left",
                        self._name,
                        done,
                        total,
                        100 * done / total,
                        (total - done) / rate,
                    )
        logging.info(
            "%s: counted %d documents in %.1f s", self._name, total, time.monotonic() - started
        )
        return counts

    def __repr__(self) -> str:
        return (
            f"MappedSource({self._name}, documents={len(self)}, maps={len(self._maps)}, "
            f"vocab_size={self.vocab_size})"
        )
