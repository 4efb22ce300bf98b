"""Tokenizers that turn document text into int32 token ids for the pipeline.

The pipeline itself only moves token ids around; text enters through a tokenizer
when a source stores raw text. A tiny `Tokenizer` protocol keeps the rest of the
package independent of any tokenizer library:

* `ByteTokenizer` is the default. It needs no vocabulary file and no download,
  so tests, benchmarks and first runs work out of the box.
* `HFTokenizer` wraps a local HuggingFace `tokenizers` JSON file for real
  vocabularies. `tokenizers` is an optional dependency (`xlstm-data[hf]`).

Tokenizers travel into grain worker processes inside pickled sources, so both
implementations pickle cheaply (the HF one stores only its path and reloads).
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np
from absl import logging

from xlstm_data.errors import DataConfigError

__all__ = ["ByteTokenizer", "HFTokenizer", "Tokenizer", "get_tokenizer"]

# Tokens commonly used as end-of-document / padding markers, tried in order when
# `HFTokenizer` is not told which token to use.
_EOD_CANDIDATES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<eod>")
_PAD_CANDIDATES = ("<pad>", "[PAD]", "<|padding|>", "<|pad|>")


@runtime_checkable
class Tokenizer(Protocol):
    """What the pipeline needs from a tokenizer.

    Attributes:
      vocab_size: Number of ids; every id produced by `encode` is in
        [0, vocab_size).
      eod_id: Id appended after each document when documents are packed.
      pad_id: Id used to fill unused positions of a packed sequence.
    """

    vocab_size: int
    eod_id: int
    pad_id: int

    def encode(self, text: str) -> np.ndarray:
        """Encodes text without special tokens; their spelling in `text` is text.

        Args:
          text: Document text.

        Returns:
          A 1-D int32 array of token ids.
        """
        ...

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """Decodes token ids back to text, dropping special tokens.

        Args:
          ids: Token ids.

        Returns:
          The decoded text.
        """
        ...


@dataclasses.dataclass(frozen=True)
class ByteTokenizer:
    """UTF-8 byte-level tokenizer: byte b has id b + 2; ids 0 and 1 are special.

    Attributes:
      vocab_size: 258 (256 byte values plus pad and end-of-document).
      eod_id: 1.
      pad_id: 0.
    """

    vocab_size: int = dataclasses.field(default=258, init=False)
    eod_id: int = dataclasses.field(default=1, init=False)
    pad_id: int = dataclasses.field(default=0, init=False)

    _OFFSET = 2  # Class attribute (no annotation), not a dataclass field.

    def encode(self, text: str) -> np.ndarray:
        """Encodes text as its UTF-8 bytes shifted past the special ids.

        Args:
          text: Document text.

        Returns:
          A 1-D int32 array with one id per UTF-8 byte.

        Raises:
          DataConfigError: If `text` is not a str.
        """
        if not isinstance(text, str):
            raise DataConfigError(
                f"ByteTokenizer.encode: text must be a str, got {type(text).__name__} "
                f"({_short_repr(text)}); decode bytes to str first."
            )
        return np.frombuffer(text.encode("utf-8"), np.uint8).astype(np.int32) + self._OFFSET

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """Decodes ids to text, skipping pad/eod and replacing invalid UTF-8.

        Args:
          ids: Token ids in [0, 258).

        Returns:
          The decoded text; malformed byte sequences become U+FFFD.

        Raises:
          DataConfigError: If an id is outside [0, 258).
        """
        arr = np.asarray(ids)
        if arr.size == 0:
            return ""
        if arr.ndim != 1 or arr.dtype.kind not in "iu":
            raise DataConfigError(
                "ByteTokenizer.decode: ids must be a 1-D sequence of integers, got "
                f"shape {arr.shape} dtype {arr.dtype}."
            )
        bad = (arr < 0) | (arr >= self.vocab_size)
        if bad.any():
            raise DataConfigError(
                f"ByteTokenizer.decode: id {int(arr[bad][0])} is out of range; valid ids are "
                f"0..{self.vocab_size - 1} (0=pad, 1=eod, 2..257=bytes)."
            )
        data = arr[arr >= self._OFFSET] - self._OFFSET
        return data.astype(np.uint8).tobytes().decode("utf-8", errors="replace")


class HFTokenizer:
    """A local HuggingFace `tokenizers` JSON file behind the `Tokenizer` protocol.

    Encoding never adds the tokenizer's own special tokens (BOS/EOS templates)
    unless `add_special_tokens=True`; the pipeline appends `eod_id` itself.
    Text that spells a special token (e.g. "<|endoftext|>" quoted in a web page)
    is encoded as ordinary text, never as the control token, so only the
    pipeline decides where documents end.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        eod_token: str | None = None,
        pad_token: str | None = None,
        add_special_tokens: bool = False,
    ) -> None:
        """Loads the tokenizer file.

        Args:
          path: Local path of a `tokenizer.json` file.
          eod_token: Token marking end of document. If None, the first of
            "<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<eod>" present
            in the vocabulary is used.
          pad_token: Padding token. If None, the first of "<pad>", "[PAD]",
            "<|padding|>", "<|pad|>" present is used, else the eod token.
          add_special_tokens: Passed to `tokenizers.Tokenizer.encode`.

        Raises:
          DataConfigError: If `tokenizers` is not installed, the file is missing
            or unreadable, or a token is not in the vocabulary.
        """
        self._path = os.fspath(path)
        self._requested_eod = eod_token
        self._requested_pad = pad_token
        self._add_special_tokens = bool(add_special_tokens)
        self._load()

    def _load(self) -> None:
        """(Re)loads the tokenizer file and resolves the special ids."""
        try:
            hf_tokenizers = importlib.import_module("tokenizers")
        except ImportError as e:
            raise DataConfigError(
                f"HFTokenizer(path={self._path!r}) needs the optional 'tokenizers' package; "
                "install it with: pip install xlstm-data[hf]  (or use tokenizer='byte')."
            ) from e
        if not os.path.isfile(self._path):
            raise DataConfigError(
                f"HFTokenizer: path={self._path!r} does not exist or is not a file; "
                "pass the path of a local HuggingFace tokenizer.json file."
            )
        try:
            self._tok: Any = hf_tokenizers.Tokenizer.from_file(self._path)
        except Exception as e:  # tokenizers raises a bare Exception on bad JSON.
            raise DataConfigError(
                f"HFTokenizer: path={self._path!r} is not a valid HuggingFace tokenizer "
                f"JSON file: {e}"
            ) from e
        if not hasattr(self._tok, "encode_special_tokens"):
            raise DataConfigError(
                f"HFTokenizer(path={self._path!r}) needs tokenizers>=0.20, which can encode the "
                "spelling of a special token as text; install it with: pip install xlstm-data[hf]"
            )
        # Documents that spell a special token ("<|endoftext|>") are text: without this the
        # library matches special tokens in the input even with add_special_tokens=False,
        # and a web page quoting the token would end its document mid-way.
        self._tok.encode_special_tokens = True
        self.vocab_size: int = int(self._tok.get_vocab_size(with_added_tokens=True))
        self.eod_token = self._resolve("eod_token", self._requested_eod, _EOD_CANDIDATES, None)
        self.pad_token = self._resolve(
            "pad_token", self._requested_pad, _PAD_CANDIDATES, self.eod_token
        )
        self.eod_id: int = int(self._tok.token_to_id(self.eod_token))
        self.pad_id: int = int(self._tok.token_to_id(self.pad_token))

    def _resolve(
        self, arg: str, requested: str | None, candidates: Sequence[str], fallback: str | None
    ) -> str:
        """Picks the token for `arg`, validating that it exists in the vocabulary.

        Args:
          arg: Argument name, for error messages.
          requested: The token the caller asked for, or None to auto-detect.
          candidates: Tokens tried in order when `requested` is None.
          fallback: Token used when no candidate exists; None means error.

        Returns:
          The chosen token string.
        """
        if requested is not None:
            if self._tok.token_to_id(requested) is None:
                raise DataConfigError(
                    f"HFTokenizer: {arg}={requested!r} is not in the vocabulary of "
                    f"{self._path!r}; pass a token that is, e.g. one of its special tokens "
                    f"{self._special_tokens()}."
                )
            return requested
        for token in candidates:
            if self._tok.token_to_id(token) is not None:
                return token
        if fallback is None:
            raise DataConfigError(
                f"HFTokenizer: {arg}=None and none of {list(candidates)} is in the vocabulary of "
                f"{self._path!r}; pass {arg} explicitly, e.g. one of {self._special_tokens()}."
            )
        logging.info(
            "HFTokenizer(%s): no pad token found, padding with %s=%r.", self._path, "eod", fallback
        )
        return fallback

    def _special_tokens(self) -> list[str]:
        """Returns the added/special tokens of the vocabulary, for error hints."""
        try:
            decoder = self._tok.get_added_tokens_decoder()
            return [t.content for _, t in sorted(decoder.items())][:20]
        except Exception:  # Older tokenizers versions lack the method.
            return []

    @property
    def path(self) -> str:
        """The tokenizer file path."""
        return self._path

    def encode(self, text: str) -> np.ndarray:
        """Encodes text.

        Args:
          text: Document text.

        Returns:
          A 1-D int32 array of token ids.

        Raises:
          DataConfigError: If `text` is not a str.
        """
        if not isinstance(text, str):
            raise DataConfigError(
                f"HFTokenizer.encode: text must be a str, got {type(text).__name__} "
                f"({_short_repr(text)})."
            )
        ids = self._tok.encode(text, add_special_tokens=self._add_special_tokens).ids
        return np.asarray(ids, dtype=np.int32)

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """Decodes ids to text, skipping special tokens.

        Args:
          ids: Token ids.

        Returns:
          The decoded text.
        """
        return self._tok.decode([int(i) for i in np.asarray(ids).reshape(-1)])

    def __getstate__(self) -> dict[str, Any]:
        """Pickles only the arguments; the file is reloaded on unpickling."""
        return {
            "path": self._path,
            "eod_token": self._requested_eod,
            "pad_token": self._requested_pad,
            "add_special_tokens": self._add_special_tokens,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Reloads the tokenizer file named in `state`."""
        self._path = state["path"]
        self._requested_eod = state["eod_token"]
        self._requested_pad = state["pad_token"]
        self._add_special_tokens = state["add_special_tokens"]
        self._load()

    def __repr__(self) -> str:
        return (
            f"HFTokenizer(path={self._path!r}, vocab_size={self.vocab_size}, "
            f"eod={self.eod_token!r}:{self.eod_id}, pad={self.pad_token!r}:{self.pad_id})"
        )


def get_tokenizer(spec: str | os.PathLike[str] | Tokenizer | None) -> Tokenizer:
    """Builds a tokenizer from a config value.

    Args:
      spec: None or "byte" for `ByteTokenizer`; a path ending in ".json" for
        `HFTokenizer`; or an object implementing `Tokenizer`, returned as is.

    Returns:
      The tokenizer.

    Raises:
      DataConfigError: If `spec` is none of the above.
    """
    if spec is None:
        return ByteTokenizer()
    if isinstance(spec, (str, os.PathLike)):
        text = os.fspath(spec)
        if text == "byte":
            return ByteTokenizer()
        if isinstance(text, str) and text.endswith(".json"):
            return HFTokenizer(text)
    elif isinstance(spec, Tokenizer):
        return spec
    raise DataConfigError(
        f"tokenizer={_short_repr(spec)} is not valid; use None or 'byte' (byte-level, no "
        "download), a path to a local HuggingFace tokenizer file ending in '.json', or an "
        "object with vocab_size, eod_id, pad_id, encode() and decode()."
    )


def _short_repr(value: object, limit: int = 80) -> str:
    """repr() truncated to `limit` characters, for error messages."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
