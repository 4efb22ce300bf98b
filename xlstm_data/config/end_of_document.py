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

from xlstm_data.errors import DataConfigError


def resolve_eod_token_id(
    configured: int | None,
    sources: Mapping[str, Any],
    *,
    key: str = "data.eod_token_id",
    fallback: int = 1,
) -> int:
    """The end-of-document id, checked against every source.

    A source's tokenizer (`source.tokenizer`: text tokenized on read, or
    shards whose `prepare` index names one) defines the id its documents end
    with: a configured id that differs is refused; unset, the tokenizers'
    common id is used. Sources without a tokenizer (synthetic ids, bare
    token arrays, a plain grain dataset) define none and accept any id
    inside their vocabulary; when no source has a tokenizer the unset id is
    `fallback`. Every source with a known `vocab_size` must contain the id.

    Args:
      configured: The id the user set, or None when unset.
      sources: The opened sources by the name errors should use (e.g.
        "data.train.web").
      key: The config key or argument errors name.
      fallback: The id when unset and no source has a tokenizer: 1 on the
        config path (the byte tokenizer's, which sources default to), 0 for
        the factories (the reference API's default).

    Returns:
      The end-of-document id.

    Raises:
      DataConfigError: If the id is outside a source's vocabulary, a tokenizer
        defines another id than the configured one, or (unset) the tokenizers
        disagree.
    """
    own = {
        name: (int(source.tokenizer.eod_id), source.tokenizer)
        for name, source in sources.items()
        if getattr(source, "tokenizer", None) is not None
    }
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
    return eod
