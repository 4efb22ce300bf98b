"""The end-of-document id a run packs documents with, checked against its sources.

The id appended after every document must mean "end of document" to the
model. A source's tokenizer defines that id; a configured id that differs
would end documents with a token that means something else, silently. Both
the config path (`data.eod_token_id`) and the reference factories
(`eod_token_id`) resolve the id here, so they refuse the same mismatches.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from absl import logging

from xlstm_data.errors import DataConfigError


def resolve_eod_token_id(
    configured: int | None,
    sources: Mapping[str, Any],
    *,
    key: str = "data.eod_token_id",
    fallback: int = 1,
    look_at_ends: bool = True,
) -> int:
    """The end-of-document id, checked against every source.

    A source's tokenizer (`source.tokenizer`: text tokenized on read, or
    shards whose `prepare` index names one) defines the id its documents end
    with: a configured id that differs is refused; unset, the tokenizers'
    common id is used. Sources without a tokenizer (synthetic ids, bare
    token arrays, a plain grain dataset) define none and accept any id
    inside their vocabulary; when no source has a tokenizer the unset id is
    `fallback`. Every source with a known `vocab_size` must contain the id.
    A source that stores an id after each document (`end_of_document`,
    Megatron's `--append-eod`) defines it as a tokenizer does.

    Args:
      configured: The id the user set, or None when unset.
      sources: The opened sources by the name errors should use (e.g.
        "data.train.web").
      key: The config key or argument errors name.
      fallback: The id when unset and no source has a tokenizer: 1 on the
        config path (the byte tokenizer's, which sources default to), 0 for
        the factories (the reference API's default).
      look_at_ends: Also refuse a source whose documents already end with the
        id (`_refuse_a_second_end`); False for an early call on some of the
        sources, so that the final call alone reads their ends and warns.

    Returns:
      The end-of-document id.

    Raises:
      DataConfigError: If the id is outside a source's vocabulary, a tokenizer
        defines another id than the configured one, or (unset) the tokenizers
        disagree.
    """
    own = {name: defined for name, source in sources.items() if (defined := _own_id(name, source))}
    if configured is not None:
        eod, origin = int(configured), f"{key}={configured}"
    elif own:
        ids = {name: eod for name, (eod, _) in own.items()}
        if len(set(ids.values())) > 1:
            listed = ", ".join(f"{name}: {eod}" for name, eod in ids.items())
            raise DataConfigError(
                f"{key} is unset and the datasets' tokenizers end documents with different ids "
                f"({listed}); a run has one vocabulary, so tokenize every dataset with the same "
                "tokenizer"
            )
        name, (eod, tokenizer) = next(iter(own.items()))
        origin = f"{key} (unset: the end-of-document id of {name}'s {tokenizer!r})"
    else:
        eod = fallback
        origin = f"{key} (unset: {eod}, as no dataset has a tokenizer)"
    for name, source in sources.items():
        vocab = getattr(source, "vocab_size", None)
        if vocab is not None and not 0 <= eod < vocab:
            raise DataConfigError(
                f"{origin} is id {eod}, outside the vocabulary of {name} (vocab_size={vocab}, "
                f"valid ids 0..{vocab - 1}); set {key} to the end-of-document id of the data's "
                "tokenizer"
            )
        if configured is not None and name in own and own[name][0] != eod:
            theirs, tokenizer = own[name]
            raise DataConfigError(
                f"{key}={configured} disagrees with the tokenizer of {name} ({tokenizer!r}), "
                f"whose end-of-document id is {theirs}; set {key}={theirs}, or leave it unset "
                "(None) to use the tokenizer's"
            )
        if look_at_ends:
            _refuse_a_second_end(name, source, eod, origin, key)
    return eod


class _StoredEnd:
    """How messages name an end-of-document id a source stores after each document."""

    def __init__(self, eod: int):
        self.eod = eod

    def __repr__(self) -> str:
        return f"stored id: end_of_document={self.eod}"


def _own_id(name: str, source: Any) -> tuple[int, Any] | None:
    """The id a source's documents end with, and what defines it: its tokenizer or its files."""
    tokenizer = getattr(source, "tokenizer", None)
    stored = getattr(source, "end_of_document", None)
    if tokenizer is not None:
        if stored is not None and stored != int(tokenizer.eod_id):
            raise DataConfigError(
                f"{name}.end_of_document={stored} disagrees with its tokenizer {tokenizer!r}, "
                f"whose "
                f"end-of-document id is {int(tokenizer.eod_id)}; set end_of_document to the id "
                "the corpus stores after each document (the tokenizer's, for Megatron's "
                "--append-eod)"
            )
        return int(tokenizer.eod_id), tokenizer
    if stored is not None:
        return int(stored), _StoredEnd(int(stored))
    return None


def _refuse_a_second_end(name: str, source: Any, eod: int, origin: str, key: str) -> None:
    """Refuses a source whose documents already end with `eod` but are read with it.

    Packing appends `eod` after every document: one that ends with it
    already (Megatron's `--append-eod`) would train on two in a row. Such a
    source says which id it strips (`end_of_document`); one that strips none
    is sampled (`last_ids`: a few documents' last id) and refused when every
    sampled document ends with `eod`.
    """
    last_ids = getattr(source, "last_ids", None)
    if last_ids is None or getattr(source, "end_of_document", None) is not None:
        return
    ends = last_ids()
    if len(ends) > 1 and len(set(ends.tolist())) == 1 and int(ends[0]) != eod:
        logging.warning(
            "%s: every one of the %d documents looked at ends with id %d, and packing appends "
            "%s after each; if %d is the corpus's end-of-document id, set %s.end_of_document=%d "
            "and %s to it",
            name,
            len(ends),
            int(ends[0]),
            origin,
            int(ends[0]),
            name,
            int(ends[0]),
            key,
        )
    if len(ends) and (ends == eod).all():
        raise DataConfigError(
            f"{name}: every one of the {len(ends)} documents looked at already ends with {origin}, "
            f"which packing appends after each document, so the run would train on two in a "
            f"row; set {name}.end_of_document={eod} (the corpus was written with Megatron's "
            "--append-eod) so the stored one is read as the end of the document"
        )
