"""What every document source is, and the checks the sources share.

A source is a grain random-access data source (`__len__`, `__getitem__`) of
documents `{"tokens": int32 1-D array}` that also reports every document's
token count (`lengths()`) without reading the documents.
"""

from __future__ import annotations

import abc
import glob
import numbers
import operator
import os
from collections.abc import Callable, Sequence
from typing import Any, SupportsIndex

import numpy as np

from xlstm_data.errors import DataConfigError, DataReadError
from xlstm_data.sources.formats import where_text
from xlstm_data.sources.tokenizers import Tokenizer

Document = dict[str, np.ndarray]
PathPattern = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]
TokenizerSpec = Tokenizer | str | None

_INT32_MAX = int(np.iinfo(np.int32).max)
_RECORD_FORMATS = ("tokens", "text")
TEXT_UNITS = ("line", "file")


class TokenSource(abc.ABC):
    """Base class of the sources in this module.

    Subclasses implement `__len__` and `_read`; this class handles index
    normalisation and wraps the token array in a document dict.

    Attributes:
      vocab_size: Exclusive upper bound that every token id is checked against
        when read, or None when the source does not know its vocabulary.
    """

    vocab_size: int | None = None
    _tokenizer: Tokenizer | None = None

    @property
    def tokenizer(self) -> Tokenizer | None:
        """The tokenizer this source's ids come from, or None when it has none.

        Its `eod_id` is the end-of-document id the source's documents expect
        (`iterators_from_config` checks `data.eod_token_id` against it).
        Synthetic ids and bare token arrays have no tokenizer.
        """
        return self._tokenizer

    @abc.abstractmethod
    def __len__(self) -> int:
        """Returns the number of documents."""

    @abc.abstractmethod
    def _read(self, index: int) -> np.ndarray:
        """Returns the int32 tokens of document `index` (already in range)."""

    def lengths(self) -> np.ndarray:
        """Every document's token count, without the pipeline reading the documents.

        Returns:
          A 1-D integer array (int64, or int32 when memory-mapped from a
          prepared index) with `len(self)` entries; entry i equals
          `len(self[i]["tokens"])`. It may be read-only and shared: copy it
          before changing it.

        Raises:
          DataConfigError: If this source cannot know its lengths (see
            `has_lengths`).
        """
        raise DataConfigError(
            f"{type(self).__name__} does not report its document lengths; implement "
            "lengths() returning one int64 token count per document."
        )

    def has_lengths(self) -> bool:
        """Whether `lengths()` answers rather than raising DataConfigError.

        It may still take a while (a text source tokenizes its files once per
        machine) and raise DataReadError on bad data.
        """
        return type(self).lengths is not TokenSource.lengths

    def __getitem__(self, index: SupportsIndex) -> Document:
        """Reads one document.

        Args:
          index: Document index in [-len, len).

        Returns:
          `{"tokens": np.ndarray}` with a 1-D int32 array.

        Raises:
          IndexError: If `index` is out of range.
          DataReadError: If the stored document cannot be decoded.
        """
        i = operator.index(index)
        n = len(self)
        if not 0 <= i < n:  # in range is the hot path: the pipeline reads in order
            if not -n <= i < 0:
                raise IndexError(
                    f"{type(self).__name__}: index {i} is out of range; "
                    f"valid indices are 0..{n - 1}."
                )
            i += n
        return {"tokens": self._read(i)}

    def read_many(self, indices: Sequence[SupportsIndex] | np.ndarray) -> list[np.ndarray]:
        """Reads several documents' tokens at once, in the order given.

        A caller that knows all the documents of a batch in advance (the
        planned pipeline) asks for them in one call, so that a source whose
        storage serves a batch faster than single reads (ArrayRecord: one
        parallel read per file, see `ArrayRecordSource.read_many`) can
        override this, and check all the ids of the batch in one pass. This
        default reads them one by one, as `self[i]["tokens"]` would.

        Args:
          indices: Document indices in [-len, len), repeats allowed.

        Returns:
          One 1-D int32 array per index, as `self[i]["tokens"]`.

        Raises:
          IndexError: If an index is out of range.
          DataReadError: If a stored document cannot be decoded (naming it).
        """
        return [self[i]["tokens"] for i in np.asarray(indices, dtype=np.int64).tolist()]


# ----------------------------------------------------------------------------
# Helpers shared by the sources.
# ----------------------------------------------------------------------------


def expand_files(pattern: PathPattern, arg: str = "pattern") -> list[str]:
    """Expands a glob, a path, or a list of them into a sorted list of files.

    Args:
      pattern: A glob/path or a sequence of globs/paths. `**` recurses.
      arg: Argument name used in error messages.

    Returns:
      Sorted, de-duplicated file paths.

    Raises:
      DataConfigError: If `pattern` has a wrong type, is empty, or one of its
        entries matches no file.
    """
    if isinstance(pattern, (str, os.PathLike)):
        patterns = [pattern]
    elif isinstance(pattern, Sequence) and not isinstance(pattern, (bytes, bytearray)):
        patterns = list(pattern)
    else:
        raise DataConfigError(
            f"{arg}={pattern!r} must be a path/glob string or a list of them, "
            f"not {type(pattern).__name__}."
        )
    if not patterns:
        raise DataConfigError(f"{arg}=[] is empty; pass at least one path or glob.")
    files: set[str] = set()
    for p in patterns:
        if not isinstance(p, (str, os.PathLike)):
            raise DataConfigError(
                f"{arg} entries must be path/glob strings; got {p!r} ({type(p).__name__})."
            )
        text = os.path.expanduser(os.fspath(p))
        if os.path.isfile(text):
            matches = [text]
        else:
            matches = [m for m in glob.glob(text, recursive=True) if os.path.isfile(m)]
        if not matches:
            hint = (
                f" It is a directory; use {os.path.join(text, '*')!r}."
                if os.path.isdir(text)
                else ""
            )
            raise DataConfigError(
                f"{arg}={os.fspath(p)!r} matches no file (relative paths are resolved against "
                f"{os.getcwd()!r}).{hint} Pass an existing file path or a glob such as "
                "'data/train-*.arrayrecord'."
            )
        files.update(matches)
    return sorted(files)


def _check_vocab_size(vocab_size: Any, arg: str = "vocab_size") -> int | None:
    """Validates an optional vocabulary size argument.

    Args:
      vocab_size: None or a positive integer that fits in int32 + 1.
      arg: Argument name used in error messages.

    Returns:
      The vocabulary size as int, or None.
    """
    if vocab_size is None:
        return None
    if (
        isinstance(vocab_size, bool)
        or not isinstance(vocab_size, numbers.Integral)
        or not 1 <= int(vocab_size) <= _INT32_MAX + 1
    ):
        raise DataConfigError(
            f"{arg}={vocab_size!r} is invalid; pass None or an integer in [1, 2**31]."
        )
    return int(vocab_size)


def _checked_int32(
    values: np.ndarray, vocab_size: int | None, where: str | Callable[[], str]
) -> np.ndarray:
    """Checks token ids are valid and returns them as a fresh int32 array.

    Args:
      values: 1-D integer array of token ids, any integer dtype.
      vocab_size: Exclusive upper bound, or None to check only the int32 range.
      where: Names the source and record for the error message (or makes the
        name, so that the hot path formats no string).

    Returns:
      A 1-D int32 array that does not share memory with cached state.

    Raises:
      DataReadError: If an id is negative, >= vocab_size, or overflows int32.
    """
    upper = _INT32_MAX + 1 if vocab_size is None else vocab_size
    if values.size and not _in_range(values, upper):
        bad = np.flatnonzero((values < 0) | (values >= upper))[0]
        bad_id = int(values[bad])
        if vocab_size is None:
            detail = (
                f"token id {bad_id} at position {bad} is not a valid token id "
                "(ids must be in [0, 2**31))"
            )
        else:
            detail = (
                f"token id {bad_id} at position {bad} is outside [0, {vocab_size}) "
                f"for vocab_size={vocab_size}; the data was tokenized with a different "
                "vocabulary, or vocab_size/tokenizer is wrong"
            )
        raise DataReadError(f"{where_text(where)}: {detail}.")
    return np.array(values, dtype=np.int32, copy=True)


def _in_range(values: np.ndarray, upper: int) -> bool:
    """Whether every id is in [0, upper), in one pass for int32 (upper <= 2**31)."""
    if values.dtype == np.int32:
        # Negative int32 ids read as unsigned are >= 2**31 >= upper.
        return int(values.view(np.uint32).max()) < upper
    return int(values.min()) >= 0 and int(values.max()) < upper


def _spec_repr(spec: TokenizerSpec) -> str:
    """A tokenizer argument as an error message shows it."""
    if isinstance(spec, os.PathLike):
        return repr(os.fspath(spec))
    if spec is None or isinstance(spec, str):
        return repr(spec)
    return type(spec).__name__
