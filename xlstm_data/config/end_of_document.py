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
    final: bool = True,
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
      final: Whether `sources` are all the run's. An early call on the
        ones opened so far (so that a mismatch fails before the next is
        indexed) neither refuses an unset id that a later source could still
        define nor reads any document's end (`_refuse_a_second_end`).

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
        if final:
            _refuse_a_guessed_id(key, sources)
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
        if final:
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
                f"whose end-of-document id is {int(tokenizer.eod_id)}; set end_of_document to "
                "the id the corpus stores after each document (the tokenizer's, for Megatron's "
                "--append-eod)"
            )
        return int(tokenizer.eod_id), tokenizer
    if stored is not None:
        return int(stored), _StoredEnd(int(stored))
    return None


def _refuse_a_guessed_id(key: str, sources: Mapping[str, Any]) -> None:
    """Refuses the fallback id for tokenized files that record no tokenizer.

    A Megatron corpus (`end_of_document` unset, no `tokenizer`) holds ids
    of a real vocabulary whose end-of-document id the files do not say: the
    fallback (the byte tokenizer's 1) would end every document with an
    ordinary token (GPT-2's `"`), silently.
    """
    unknown = [
        name
        for name, source in sources.items()
        if hasattr(source, "end_of_document") and getattr(source, "tokenizer", None) is None
    ]
    if unknown:
        raise DataConfigError(
            f"{key} is unset and {unknown[0]} records no tokenizer (Megatron's files name "
            f"none), so no end-of-document id is known; set {key} to the id of the tokenizer "
            f"the corpus was made with (50256 for GPT-2), or {unknown[0]}.end_of_document to "
            "the id --append-eod stored after each document, or its tokenizer"
        )


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
    for path, ends in last_ids().items():
        if len(ends) and (ends == eod).all():
            raise DataConfigError(
                f"{name}: the first {len(ends)} documents of {path} all end with {origin}, "
                f"which packing appends after each document, so the run would train on two in "
                f"a row; set {name}.end_of_document={eod} (the corpus was written with "
                "Megatron's --append-eod) so the stored one is read as the end of the document"
            )
        if len(ends) > 1 and len(set(ends.tolist())) == 1:
            logging.warning(
                "%s: the first %d documents of %s all end with id %d, and packing appends %s "
                "after each; if %d is the corpus's end-of-document id, set %s.end_of_document=%d "
                "and %s to it",
                name,
                len(ends),
                path,
                int(ends[0]),
                origin,
                int(ends[0]),
                name,
                int(ends[0]),
                key,
            )
