"""A source paired with document lengths counted elsewhere.

ArrayRecord shards written by another pipeline (MaxText's text shards) have
no index, so their lengths are counted on first use. Where the shards'
directory is writable the count becomes an `index.json` beside them and the
source reads it like prepared shards; where it is not, the counts live in the
lengths cache and this wrapper hands them to the plan, reading documents
through the wrapped source unchanged (its batched `read_many` included).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import SupportsIndex

import numpy as np

from xlstm_data.errors import DataConfigError
from xlstm_data.sources.base import TokenSource


class WithLengths(TokenSource):
    """`source`'s documents, with `lengths` as their token counts.

    Args:
      source: The documents (a `TokenSource`).
      lengths: One count per document, as the source's tokenizer counts them.
    """

    def __init__(self, source: TokenSource, lengths: np.ndarray) -> None:
        lengths = np.asarray(lengths, dtype=np.int64)
        if lengths.shape != (len(source),):
            raise DataConfigError(
                f"{source!r}: {lengths.shape[0] if lengths.ndim else 0} lengths for "
                f"{len(source)} documents"
            )
        lengths.flags.writeable = False
        self._source = source
        self._lengths = lengths
        self._tokenizer = source.tokenizer
        self.vocab_size = source.vocab_size

    @property
    def files(self) -> Sequence[str]:
        """The wrapped source's files (the checkpoint's record of the data)."""
        return getattr(self._source, "files", ())

    def __len__(self) -> int:
        return len(self._source)

    def _read(self, index: int) -> np.ndarray:
        return self._source[index]["tokens"]

    def read_many(self, indices: Sequence[SupportsIndex] | np.ndarray) -> list[np.ndarray]:
        return self._source.read_many(indices)

    def lengths(self) -> np.ndarray:
        return self._lengths

    def __repr__(self) -> str:
        return f"WithLengths({self._source!r})"
