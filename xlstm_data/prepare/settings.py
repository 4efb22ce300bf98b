"""What a preparation is asked to do, validated once before any input is read.

Every step of a preparation (tokenizing a part, writing a shard, writing an
index), on whichever runner, reads its settings from one frozen
`PrepareSettings`, so the local runner and Beam workers cannot disagree, and
each finished step's marker records exactly the settings its output depends
on.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from typing import Any

import numpy as np

from xlstm_data.checks import check_int
from xlstm_data.errors import DataConfigError
from xlstm_data.prepare.inputs import INPUT_FORMATS
from xlstm_data.sources.base import TEXT_UNITS
from xlstm_data.sources.corpus_index import LAYOUTS, PREPARE_FORMAT_VERSION
from xlstm_data.sources.flat_tokens import token_dtype
from xlstm_data.sources.tokenizers import HFTokenizer, Tokenizer, get_tokenizer

RUNNERS = ("local", "beam")


@dataclasses.dataclass(frozen=True)
class PrepareSettings:
    """A validated preparation request; build it with `PrepareSettings.create`.

    Attributes:
      input_format: One of `inputs.INPUT_FORMATS`.
      field: JSON key or Parquet/Arrow column holding each document.
      unit: Text documents are lines ("line") or whole files ("file").
      tokenizer: "byte" or the absolute path of a HuggingFace tokenizer file.
      eod_token: The tokenizer's end-of-document token by name; None: detected.
      pad_token: Its padding token by name; None: detected.
      tokenizer_vocab_size: Ids the tokenizer makes.
      eod_id: Its end-of-document id.
      vocab_size: The corpus vocabulary every id is checked against.
      skip_bad_lines: Skip (and count) unparsable lines instead of stopping.
      num_shards: Output shards; None: one per input file (unless
        `shard_size_mb`).
      shard_size_mb: Target MiB of token data per shard, instead of `num_shards`.
      validation_fraction: Share of documents held out, or None.
      validation_documents: Number of documents held out, or None.
      seed: Chooses the held-out documents.
      part_mb: Inputs larger than this are tokenized in parallel parts.
      layout: How shards store documents: "flat" (a memory-mapped token file
        and document offsets per shard, read by `FlatTokenSource`; the
        default) or "array_record" (one record of int32 ids per document).
    """

    input_format: str
    field: str
    unit: str
    tokenizer: str
    eod_token: str | None
    pad_token: str | None
    tokenizer_vocab_size: int
    eod_id: int
    vocab_size: int
    skip_bad_lines: bool
    num_shards: int | None
    shard_size_mb: float | None
    validation_fraction: float | None
    validation_documents: int | None
    seed: int
    part_mb: int
    layout: str = "flat"

    @classmethod
    def create(
        cls,
        *,
        input_format: str = "auto",
        field: str = "text",
        unit: str = "line",
        tokenizer: str | os.PathLike[str] | None = "byte",
        eod_token: str | None = None,
        pad_token: str | None = None,
        vocab_size: int | None = None,
        skip_bad_lines: bool = False,
        num_shards: int | None = None,
        shard_size_mb: float | None = None,
        validation_fraction: float | None = None,
        validation_documents: int | None = None,
        seed: int = 0,
        part_mb: int = 256,
        layout: str = "flat",
    ) -> PrepareSettings:
        """Checks every argument and loads the tokenizer once.

        Raises:
          DataConfigError: Naming the flag, the bad value and what is valid.
        """
        if input_format not in INPUT_FORMATS:
            raise DataConfigError(
                f"--format={input_format!r} is invalid; valid formats: {list(INPUT_FORMATS)}"
            )
        if unit not in TEXT_UNITS:
            raise DataConfigError(f"--unit={unit!r} is invalid; valid units: {list(TEXT_UNITS)}")
        if not isinstance(field, str) or not field:
            raise DataConfigError(
                f"--field={field!r} is invalid; pass the JSON key or column holding the documents"
            )
        spec = _tokenizer_spec(tokenizer)
        loaded = load_tokenizer(spec, eod_token, pad_token)
        corpus_vocab = int(loaded.vocab_size)
        if vocab_size is not None:
            corpus_vocab = check_int("--vocab_size", vocab_size, 1)
            if corpus_vocab < loaded.vocab_size:
                raise DataConfigError(
                    f"--vocab_size={vocab_size} is smaller than the vocabulary of "
                    f"--tokenizer={spec!r} ({loaded.vocab_size} ids); pass --vocab_size >= "
                    f"{loaded.vocab_size}, or leave it unset to use the tokenizer's"
                )
        check_int("--num_shards", num_shards, 1, optional=True)
        if shard_size_mb is not None:
            if num_shards is not None:
                raise DataConfigError(
                    f"--num_shards={num_shards} and --shard_size_mb={shard_size_mb} both set "
                    "the number of shards; pass one of them"
                )
            if not _positive_number(shard_size_mb):
                raise DataConfigError(
                    f"--shard_size_mb={shard_size_mb!r} is invalid; pass a number of MiB > 0"
                )
        if validation_fraction is not None:
            if validation_documents is not None:
                raise DataConfigError(
                    f"--validation_fraction={validation_fraction} and --validation_documents="
                    f"{validation_documents} both size the held-out split; pass one of them"
                )
            if not _positive_number(validation_fraction) or validation_fraction >= 1:
                raise DataConfigError(
                    f"--validation_fraction={validation_fraction!r} is outside (0, 1); pass the "
                    "share of documents to hold out, e.g. 0.001"
                )
        check_int("--validation_documents", validation_documents, 1, optional=True)
        check_int("--seed", seed, 0)
        check_int("--part_mb", part_mb, 1)
        if layout not in LAYOUTS:
            raise DataConfigError(f"--layout={layout!r} is invalid; valid layouts: {list(LAYOUTS)}")
        return cls(
            input_format=input_format,
            field=field,
            unit=unit,
            tokenizer=spec,
            eod_token=eod_token,
            pad_token=pad_token,
            tokenizer_vocab_size=int(loaded.vocab_size),
            eod_id=int(loaded.eod_id),
            vocab_size=corpus_vocab,
            skip_bad_lines=bool(skip_bad_lines),
            num_shards=num_shards,
            shard_size_mb=None if shard_size_mb is None else float(shard_size_mb),
            validation_fraction=(
                None if validation_fraction is None else float(validation_fraction)
            ),
            validation_documents=validation_documents,
            seed=int(seed),
            part_mb=int(part_mb),
            layout=layout,
        )

    @property
    def holds_out(self) -> bool:
        return self.validation_fraction is not None or self.validation_documents is not None

    def held_out_documents(self, documents: int) -> int:
        """How many of `documents` go to the validation split.

        Raises:
          DataConfigError: If that would leave no training document.
        """
        if self.validation_documents is not None:
            count = self.validation_documents
            flag = f"--validation_documents={count}"
        elif self.validation_fraction is not None:
            count = max(1, round(self.validation_fraction * documents))
            flag = f"--validation_fraction={self.validation_fraction}"
        else:
            return 0
        if count >= documents:
            raise DataConfigError(
                f"{flag} holds out {count} of the corpus's {documents} documents, leaving none "
                "to train on; hold out fewer"
            )
        return count

    def tokenization(self) -> dict[str, Any]:
        """What a tokenized part depends on besides its input."""
        return {
            "field": self.field,
            "unit": self.unit,
            "tokenizer": self.tokenizer,
            "eod_token": self.eod_token,
            "pad_token": self.pad_token,
            "vocab_size": self.vocab_size,
            "skip_bad_lines": self.skip_bad_lines,
        }

    def index_header(self, documents: int, tokens: int) -> dict[str, Any]:
        """The keys every `index.json` starts with, for shards of `documents` and `tokens`.

        `prepare` and `index` both write them, so a reader cannot tell which
        made the shards; the special tokens appear only when they were named.
        """
        header: dict[str, Any] = {
            "format_version": PREPARE_FORMAT_VERSION,
            "tokenizer": self.tokenizer,
            "tokenizer_vocab_size": self.tokenizer_vocab_size,
            "eod_id": self.eod_id,
            "vocab_size": self.vocab_size,
            "documents": int(documents),
            "tokens": int(tokens),
        }
        for key in ("eod_token", "pad_token"):
            if getattr(self, key) is not None:
                header[key] = getattr(self, key)
        return header

    @property
    def token_dtype(self) -> str | None:
        """The dtype of flat shards' ids (the smallest holding the vocabulary), else None."""
        return token_dtype(self.vocab_size) if self.layout == "flat" else None

    def shard_count(self, tokens: int) -> int | None:
        """Output shards for `tokens` of training data; None: one per input file."""
        if self.num_shards is not None:
            return self.num_shards
        if self.shard_size_mb is not None:
            token_bytes = 4 if self.token_dtype is None else np.dtype(self.token_dtype).itemsize
            return max(1, math.ceil(tokens * token_bytes / (self.shard_size_mb * 2**20)))
        return None


def _positive_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def _tokenizer_spec(tokenizer: str | os.PathLike[str] | None) -> str:
    """The tokenizer argument as workers load it and the index records it."""
    if tokenizer is None:
        return "byte"
    spec = os.fspath(tokenizer)
    return os.path.abspath(spec) if spec.endswith(".json") else spec


@functools.lru_cache(maxsize=4)
def load_tokenizer(spec: str, eod_token: str | None, pad_token: str | None) -> Tokenizer:
    """The tokenizer of a preparation, loaded once per process (workers reuse it).

    Raises:
      DataConfigError: On a tokenizer that cannot be loaded, or special tokens
        named for the byte tokenizer (whose ids are fixed) or missing from the
        vocabulary.
    """
    if eod_token is None and pad_token is None:
        return get_tokenizer(spec)
    if not spec.endswith(".json"):
        named = "--eod_token" if eod_token is not None else "--pad_token"
        raise DataConfigError(
            f"{named} names a special token, but --tokenizer={spec!r} has fixed special ids; "
            "pass --tokenizer=<a HuggingFace tokenizer .json> or drop the flag"
        )
    get_tokenizer(spec)  # the file's own errors first
    return HFTokenizer(spec, eod_token=eod_token, pad_token=pad_token)
