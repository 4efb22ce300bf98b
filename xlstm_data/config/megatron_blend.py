"""Datasets from Megatron-LM's `--data-path` words: a blend a Megatron user already has.

Megatron-LM takes a blend as `--data-path 0.7 /data/web_text_document 0.3
/data/code_text_document`: weights and prefixes in turn, or prefixes alone.
`megatron_datasets` turns those words into the `data.train` (or `data.eval`)
entries of a config, so the blend is pasted, not translated by hand:

- weighted words give one `megatron` dataset per prefix, with its weight
  (normalised as Megatron normalises them; shares are of tokens, as
  Megatron's are of samples of one sequence length);
- prefixes alone give one dataset reading all of them, whose documents are
  drawn as one corpus: each prefix in proportion to its size, as Megatron
  weights an unweighted blend by each dataset's number of samples.

Megatron reads words that do not parse into a blend as it can: an odd count
is all prefixes, so `0.7 web 0.3` looks for a corpus named `0.3`. Such words
are refused here, naming the word, before any file is opened. The prefixes
themselves, and every other key, are checked where every dataset is
(`validate_data_config`).
"""

from __future__ import annotations

import keyword
import math
import os
import re
from collections.abc import Sequence
from typing import Any

import ml_collections

from xlstm_data.errors import DataConfigError

#: The dataset name of an unweighted blend (one dataset over every prefix).
UNWEIGHTED_NAME = "corpus"


def megatron_datasets(
    data_path: str | Sequence[str], arg: str = "data_path", mixed: bool = True, **options: Any
) -> dict[str, dict[str, Any]]:
    """The datasets Megatron-LM's `--data-path` words name, as config entries.

    Args:
      data_path: The words after `--data-path`, as one string or a list
        (`["0.7", "/data/web_text_document", "0.3", "/data/code_text_document"]`).
      arg: How errors name the argument.
      mixed: False for `data.eval`, whose datasets are evaluated apart, not
        mixed: the weights are left out.
      **options: Keys every dataset gets (`end_of_document`, `vocab_size`,
        `split`, `split_part`, `tokenizer`), checked with the config.

    Returns:
      {name: {"kind": "megatron", "path": prefix, "weight": w, **options}} for
      a weighted blend, named after each prefix's file name (as a key a
      `--config.data.train.NAME.KEY=...` override can name); for prefixes
      alone, {"corpus": {"kind": "megatron", "path": [prefixes], **options}}.
      With `split_part` "valid" or "test", the names end with `_valid` or
      `_test`, apart from the train datasets of the same words.

    Raises:
      DataConfigError: If the words do not read as a blend, a weight is
        negative, not finite or all weights are zero, or `options` sets what
        the words give (`kind`, `path`, `weight`).
    """
    given = sorted(set(options) & {"kind", "path", "weight"})
    if given:
        raise DataConfigError(
            f"{arg}: {given[0]}={options[given[0]]!r} is given by the --data-path words; pass "
            "only the other keys of a megatron dataset (end_of_document, vocab_size, split, "
            "split_part, tokenizer)."
        )
    words = _words(data_path, arg)
    numbers = [_number(word) for word in words]
    # A valid or test part is named apart from the train datasets of the same words.
    part = options.get("split_part")
    suffix = f"_{part}" if isinstance(part, str) and part != "train" else ""
    if not any(n is not None for n in numbers):
        path: str | list[str] = words[0] if len(words) == 1 else words
        return {UNWEIGHTED_NAME + suffix: {"kind": "megatron", "path": path, **options}}
    datasets: dict[str, dict[str, Any]] = {}
    names: set[str] = set()
    for weight, prefix in _weighted_pairs(words, numbers, arg):
        name = _unique_name(prefix, names)
        names.add(name)
        # The suffix after the count: a train `web_2` has its valid part in `web_2_valid`.
        datasets[name + suffix] = {"kind": "megatron", "path": prefix, **options}
        if mixed:
            datasets[name + suffix]["weight"] = weight
    return datasets


def _words(data_path: str | Sequence[str], arg: str) -> list[str]:
    if isinstance(data_path, str):
        words = data_path.split()
    elif isinstance(data_path, list | tuple) and all(map(_is_word, data_path)):
        words = [str(w).strip() for w in data_path]
    else:
        raise DataConfigError(
            f"{arg}={data_path!r} is not Megatron's --data-path; pass its words as one string "
            "or a list, e.g. '0.7 /data/web_text_document 0.3 /data/code_text_document'."
        )
    if not words or not all(words):
        raise DataConfigError(
            f"{arg}={data_path!r} names no corpus; pass a prefix such as "
            "'/data/web_text_document', or weights and prefixes in turn."
        )
    return words


def _is_word(word: Any) -> bool:
    return isinstance(word, str) or (isinstance(word, int | float) and not isinstance(word, bool))


def _number(word: str) -> float | None:
    try:
        return float(word)
    except ValueError:
        return None


def _weighted_pairs(
    words: list[str], numbers: list[float | None], arg: str
) -> list[tuple[float, str]]:
    """(weight, prefix) pairs of words that must alternate: a number, then a prefix."""
    where = f"{arg}={' '.join(words)!r}"
    for place, (word, number) in enumerate(zip(words, numbers, strict=True)):
        if (number is None) == (place % 2 == 0):  # a weight where a prefix goes, or the reverse
            expected = "a weight" if place % 2 == 0 else "a corpus prefix"
            raise DataConfigError(
                f"{where}: word {place + 1} ({word!r}) should be {expected}; pass weights and "
                "prefixes in turn ('0.7 /data/web 0.3 /data/code') or prefixes alone."
            )
    if len(words) % 2:
        raise DataConfigError(
            f"{where}: the last weight ({words[-1]!r}) has no corpus prefix after it; pass "
            "weights and prefixes in turn."
        )
    pairs = []
    for i in range(0, len(words), 2):
        weight = float(numbers[i])  # type: ignore[arg-type]
        if not math.isfinite(weight) or weight < 0:
            raise DataConfigError(
                f"{where}: the weight of {words[i + 1]!r} is {words[i]!r}; expected a finite "
                "number >= 0."
            )
        pairs.append((weight, words[i + 1]))
    if not any(weight > 0 for weight, _ in pairs):
        raise DataConfigError(f"{where}: every weight is zero; give one > 0.")
    return pairs


def _unique_name(prefix: str, taken: set[str]) -> str:
    """The prefix's file name as a config key an override can name, unique among `taken`.

    Characters other than letters, digits and _ become _. A name config_flags
    cannot parse as an attribute (`2024_cc`, `class`) gets `corpus_` before
    it, and one a `ConfigDict` has as a method (`items`) `_corpus` after it.
    """
    file_name = os.path.basename(prefix.rstrip("/"))
    file_name = file_name.removesuffix(".bin").removesuffix(".idx")  # as a prefix reads them
    base = re.sub(r"\W", "_", file_name) or UNWEIGHTED_NAME
    if not base.isidentifier() or keyword.iskeyword(base):
        base = f"{UNWEIGHTED_NAME}_{base}"
    if hasattr(ml_collections.ConfigDict(), base):
        base = f"{base}_{UNWEIGHTED_NAME}"
    name, count = base, 1
    while name in taken:
        count += 1
        name = f"{base}_{count}"
    return name
