"""Documents held in memory (lists, arrays, strings), and coercion of any input to a source."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from xlstm_data.errors import DataConfigError
from xlstm_data.sources.base import (
    TokenizerSpec,
    TokenSource,
    _check_vocab_size,
    _checked_int32,
)
from xlstm_data.sources.tokenizers import Tokenizer, get_tokenizer

# ----------------------------------------------------------------------------
# In memory.
# ----------------------------------------------------------------------------


class InMemorySource(TokenSource):
    """Documents held in a Python sequence or a 2-D array, for tests and small data.

    Elements may be dicts with a "tokens" key, 1-D integer arrays or lists, or
    str (tokenized on read). The sequence is referenced, not copied; each read
    returns a fresh int32 copy. `lengths()` reads every document once and keeps
    the counts, so the sequence must not change after that.
    """

    def __init__(
        self,
        data: Sequence[Any] | np.ndarray,
        tokenizer: TokenizerSpec = None,
        vocab_size: int | None = None,
    ) -> None:
        """Validates the container and its first element.

        Args:
          data: A sequence of documents or a 2-D integer array (one row each).
          tokenizer: Tokenizer or spec for `get_tokenizer`, used for str
            elements (default byte-level).
          vocab_size: Exclusive bound checked for every token id. Defaults to
            the tokenizer's vocab_size when a tokenizer is given, else only the
            int32 range is checked.

        Raises:
          DataConfigError: If `data` is empty, not a sequence, or its first
            element has an unsupported type.
        """
        if isinstance(data, np.ndarray):
            if data.ndim == 2 and data.dtype.kind in "iu":
                pass
            elif not (data.ndim == 1 and data.dtype == object):
                raise DataConfigError(
                    f"InMemorySource: data is an array of shape {data.shape} dtype {data.dtype}; "
                    "pass a 2-D integer array (one document per row), or a list of 1-D arrays "
                    "(for a single document use [tokens])."
                )
        elif isinstance(data, (str, bytes, Mapping)) or not isinstance(data, Sequence):
            raise DataConfigError(
                f"InMemorySource: data of type {type(data).__name__} is not supported; pass a "
                "list of documents (dicts with 'tokens', 1-D int arrays/lists, or str) or a 2-D "
                "int array."
            )
        if len(data) == 0:
            raise DataConfigError("InMemorySource: data is empty; pass at least one document.")
        self._data = data
        self._tokenizer: Tokenizer | None = None if tokenizer is None else get_tokenizer(tokenizer)
        vocab = _check_vocab_size(vocab_size, "InMemorySource: vocab_size")
        if vocab is None and self._tokenizer is not None:
            vocab = int(self._tokenizer.vocab_size)
        self.vocab_size = vocab
        self._token_lengths: np.ndarray | None = None
        self._read(0)  # Validates the element type before any pipeline runs.

    def __len__(self) -> int:
        return len(self._data)

    def lengths(self) -> np.ndarray:
        """Every document's token count, computed once by reading each document.

        Returns:
          A read-only 1-D int64 array; entry i equals `len(self[i]["tokens"])`.

        Raises:
          DataConfigError: If a document has an unsupported type.
          DataReadError: If a document holds ids outside the vocabulary.
        """
        if self._token_lengths is None:
            data = self._data
            if isinstance(data, np.ndarray) and data.ndim == 2:
                lengths = np.full(len(data), data.shape[1], np.int64)
            else:
                lengths = np.fromiter(
                    (len(self._read(i)) for i in range(len(data))), np.int64, len(data)
                )
            lengths.flags.writeable = False
            self._token_lengths = lengths
        return self._token_lengths

    def _read(self, index: int) -> np.ndarray:
        element = self._data[index]
        where = f"InMemorySource: document {index}"
        if isinstance(element, Mapping):
            if "tokens" not in element:
                raise DataConfigError(
                    f"{where} is a dict without a 'tokens' key (keys: {sorted(element)[:10]}); "
                    "pass {'tokens': ids}."
                )
            element = element["tokens"]
        if isinstance(element, str):
            if self._tokenizer is None:
                self._tokenizer = get_tokenizer(None)
            values = self._tokenizer.encode(element)
            vocab = self.vocab_size if self.vocab_size is not None else self._tokenizer.vocab_size
            return _checked_int32(values, vocab, where)
        if not isinstance(element, (np.ndarray, list, tuple)):
            raise DataConfigError(
                f"{where} has unsupported type {type(element).__name__}; pass a dict with "
                "'tokens', a 1-D integer array/list, or a str."
            )
        values = np.asarray(element)
        if values.size == 0:
            return np.zeros((0,), np.int32)
        if values.ndim != 1 or values.dtype.kind not in "iu":
            raise DataConfigError(
                f"{where} is an array of shape {values.shape} dtype {values.dtype}; pass a 1-D "
                "integer array/list of token ids."
            )
        return _checked_int32(values, self.vocab_size, where)

    def __repr__(self) -> str:
        return (
            f"InMemorySource(documents={len(self)}, data={type(self._data).__name__}, "
            f"vocab_size={self.vocab_size})"
        )


# ----------------------------------------------------------------------------
# Coercion.
# ----------------------------------------------------------------------------


def as_token_source(obj: Any, tokenizer: TokenizerSpec = None) -> Any:
    """Returns `obj` if it already yields token documents, else an InMemorySource.

    Args:
      obj: A `TokenSource`; any other random-access source (returned
        unchanged, expected to yield dicts with "tokens"); or data accepted by
        `InMemorySource` (lists, tuples, arrays).
      tokenizer: Used only when wrapping str data.

    Returns:
      A random-access source of `{"tokens": ...}` documents.

    Raises:
      DataConfigError: If `obj` cannot be wrapped.
    """
    if isinstance(obj, TokenSource):
        return obj
    if (
        not isinstance(obj, (list, tuple, np.ndarray, str, bytes))
        and hasattr(obj, "__len__")
        and hasattr(obj, "__getitem__")
    ):
        # A custom random-access source is not read here; the pipeline checks
        # each document's format when it reads it.
        return obj
    return InMemorySource(obj, tokenizer=tokenizer)
