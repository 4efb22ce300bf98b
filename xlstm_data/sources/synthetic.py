"""Seeded synthetic documents: a corpus of any size with no files, for tests and benchmarks."""

from __future__ import annotations

import functools
import math
import numbers

import numpy as np

from xlstm_data.checks import check_int
from xlstm_data.errors import DataConfigError
from xlstm_data.sources.base import (
    _INT32_MAX,
    TokenSource,
    _check_vocab_size,
)

# ----------------------------------------------------------------------------
# Synthetic.
# ----------------------------------------------------------------------------

_LENGTH_BLOCK = 1024  # Documents whose lengths are drawn together.
_TOKENS_STREAM, _LENGTHS_STREAM = 0, 1  # Distinct seed words: independent streams.


@functools.lru_cache(maxsize=64)
def _synthetic_block(
    seed: int, block: int, mu: float, sigma: float, min_length: int, max_length: int
) -> np.ndarray:
    """Lengths of documents [block * B, (block + 1) * B) of a SyntheticSource.

    Drawn in one call from a generator keyed by (seed, block), so any index's
    length is O(1) to compute, independent of access order, and identical to
    the vectorised `SyntheticSource.lengths()`.
    """
    rng = np.random.default_rng([seed, _LENGTHS_STREAM, block])
    raw = rng.lognormal(mean=mu, sigma=sigma, size=_LENGTH_BLOCK)
    lengths = np.clip(np.rint(np.minimum(raw, max_length)), min_length, max_length)
    out = lengths.astype(np.int64)
    out.flags.writeable = False  # Shared through the cache.
    return out


class SyntheticSource(TokenSource):
    """Random documents with lognormal lengths, for benchmarks and tests.

    Document lengths follow a lognormal with mean `mean_length` (mu =
    log(mean_length) - sigma**2 / 2), rounded and clipped to [min_length,
    max_length]; tokens are uniform in [min_token_id, vocab_size). Every
    document is a pure function of (seed, index).
    """

    def __init__(
        self,
        num_documents: int,
        mean_length: float = 256,
        sigma: float = 1.0,
        vocab_size: int = 258,
        seed: int = 0,
        min_length: int = 1,
        max_length: int | None = None,
        min_token_id: int = 2,
    ) -> None:
        """Validates the arguments.

        Args:
          num_documents: Number of documents, >= 1.
          mean_length: Mean of the lognormal length distribution, > 0.
          sigma: Standard deviation of log-length, >= 0 (0: all equal).
          vocab_size: Token ids are < vocab_size.
          seed: Non-negative integer seed.
          min_length: Shortest document, >= 1.
          max_length: Longest document (>= min_length), or None for no limit
            beyond int32.
          min_token_id: Smallest token id, in [0, vocab_size); the default 2
            skips the byte tokenizer's pad and eod ids.

        Raises:
          DataConfigError: If an argument is out of range.
        """
        self._num_documents = check_int("SyntheticSource: num_documents", num_documents, 1)
        if (
            isinstance(mean_length, bool)
            or not isinstance(mean_length, numbers.Real)
            or not math.isfinite(mean_length)
            or mean_length <= 0
        ):
            raise DataConfigError(
                f"SyntheticSource: mean_length={mean_length!r} is invalid; pass a finite "
                "number > 0."
            )
        if (
            isinstance(sigma, bool)
            or not isinstance(sigma, numbers.Real)
            or not math.isfinite(sigma)
            or sigma < 0
        ):
            raise DataConfigError(
                f"SyntheticSource: sigma={sigma!r} is invalid; pass a finite number >= 0."
            )
        vocab = _check_vocab_size(vocab_size, "SyntheticSource: vocab_size")
        if vocab is None:
            raise DataConfigError(
                "SyntheticSource: vocab_size=None is invalid; pass an integer in [1, 2**31]."
            )
        self._seed = check_int("SyntheticSource: seed", seed, 0)
        self._min_length = check_int("SyntheticSource: min_length", min_length, 1)
        if max_length is None:
            self._max_length = _INT32_MAX
        else:
            self._max_length = check_int(
                "SyntheticSource: max_length", max_length, self._min_length
            )
        if (
            isinstance(min_token_id, bool)
            or not isinstance(min_token_id, numbers.Integral)
            or not 0 <= min_token_id < vocab
        ):
            raise DataConfigError(
                f"SyntheticSource: min_token_id={min_token_id!r} is invalid; pass an integer in "
                f"[0, vocab_size={vocab})."
            )
        self._min_token_id = int(min_token_id)
        self._mean_length = float(mean_length)
        self._sigma = float(sigma)
        self._mu = math.log(self._mean_length) - self._sigma**2 / 2
        self.vocab_size = vocab

    def __len__(self) -> int:
        return self._num_documents

    def _block(self, block: int) -> np.ndarray:
        return _synthetic_block(
            self._seed, block, self._mu, self._sigma, self._min_length, self._max_length
        )

    def length(self, index: int) -> int:
        """Returns the length of document `index` without generating its tokens.

        Args:
          index: Document index in [0, len).

        Returns:
          The number of tokens of that document.
        """
        return int(self._block(index // _LENGTH_BLOCK)[index % _LENGTH_BLOCK])

    def lengths(self) -> np.ndarray:
        """Returns the lengths of all documents.

        Returns:
          An int64 array of shape (num_documents,), equal to the per-index
          lengths of the documents.
        """
        num_blocks = -(-self._num_documents // _LENGTH_BLOCK)
        return np.concatenate([self._block(b) for b in range(num_blocks)])[
            : self._num_documents
        ].copy()

    def _read(self, index: int) -> np.ndarray:
        rng = np.random.default_rng([self._seed, _TOKENS_STREAM, index])
        return rng.integers(
            self._min_token_id, self.vocab_size, size=self.length(index), dtype=np.int32
        )

    def __repr__(self) -> str:
        max_length = None if self._max_length == _INT32_MAX else self._max_length
        return (
            f"SyntheticSource(num_documents={self._num_documents}, "
            f"mean_length={self._mean_length}, sigma={self._sigma}, "
            f"vocab_size={self.vocab_size}, seed={self._seed}, min_length={self._min_length}, "
            f"max_length={max_length}, min_token_id={self._min_token_id})"
        )
