"""The index `xlstm-data prepare` writes next to its shards, and reading it back.

Knowing every document's length without reading the documents gives exact
epoch lengths and lets `inspect` plan a run in milliseconds; knowing the
tokenizer and vocabulary the shards were made with lets a source check its
ids and the run's end-of-document id. Both are only worth having when they are
true, so an index that disagrees with the shards being read (a shard it does
not list, another record count or file size, a `lengths.npy` of another
length) is an error naming the file and the disagreement, never silently
ignored: a directory without `index.json` is simply not a prepared corpus.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from xlstm_data.errors import DataConfigError, DataReadError
from xlstm_data.sources.base import _spec_repr as spec_repr

#: Version of `index.json`; bump on format changes.
PREPARE_FORMAT_VERSION = 2
INDEX_FILE = "index.json"
LENGTHS_FILE = "lengths.npy"

_REWRITE_HINT = (
    "rerun `xlstm-data prepare` with the same inputs and --output to rewrite it (finished "
    "shards are kept), or `xlstm-data index` on the shards if it made the index"
)
#: Keys every index holds, with their types.
_INDEX_KEYS: dict[str, type] = {
    "format_version": int,
    "tokenizer": str,
    "tokenizer_vocab_size": int,
    "eod_id": int,
    "vocab_size": int,
    "documents": int,
    "tokens": int,
    "shards": list,
}
_SHARD_KEYS = ("file", "documents", "tokens", "bytes")
#: What the records hold: int32 token bytes, or UTF-8 text tokenized on read.
RECORD_FORMATS = ("tokens", "text")
#: How the shards store their documents: one ArrayRecord record per document, or
#: one flat token file per shard with document offsets (`flat_tokens`).
LAYOUTS = ("array_record", "flat")
#: The token dtypes of flat shards: the smallest that holds the vocabulary.
TOKEN_DTYPES = ("uint16", "uint32")
#: Keys an index may hold (absent: "tokens" records in the "array_record" layout,
#: the tokenizer's own special tokens).
_OPTIONAL_KEYS: dict[str, type] = {
    "record_format": str,
    "eod_token": str,
    "pad_token": str,
    "layout": str,
    "token_dtype": str,
}
#: Keys each shard of a flat index holds besides `_SHARD_KEYS`.
_FLAT_SHARD_KEYS = ("offsets", "offsets_bytes")


def read_index(directory: str) -> dict[str, Any] | None:
    """The `index.json` of a prepared directory, or None if it has none.

    Args:
      directory: A directory `prepare` may have written.

    Returns:
      The parsed index, or None when `directory/index.json` does not exist.

    Raises:
      DataReadError: If the file exists but is not a readable index of this
        format version.
    """
    path = os.path.join(directory, INDEX_FILE)
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            index = json.load(f)
    except (OSError, ValueError) as error:
        raise DataReadError(
            f"{path}: is not a readable prepare index ({error}); {_REWRITE_HINT}, or delete it "
            "if the directory was not made by prepare."
        ) from error
    if not isinstance(index, dict) or index.get("format_version") != PREPARE_FORMAT_VERSION:
        version = index.get("format_version") if isinstance(index, dict) else None
        raise DataReadError(
            f"{path}: has format_version={version!r}, but this version of xlstm-data reads "
            f"format_version={PREPARE_FORMAT_VERSION}; {_REWRITE_HINT}."
        )
    for key, kind in _INDEX_KEYS.items():
        if not isinstance(index.get(key), kind):
            raise DataReadError(
                f"{path}: key {key!r} is {index.get(key)!r}, expected a {kind.__name__}; "
                f"{_REWRITE_HINT}."
            )
    for key, kind in _OPTIONAL_KEYS.items():
        if key in index and not isinstance(index[key], kind):
            raise DataReadError(
                f"{path}: key {key!r} is {index[key]!r}, expected a {kind.__name__} or no such "
                f"key; {_REWRITE_HINT}."
            )
    if index.get("record_format", "tokens") not in RECORD_FORMATS:
        raise DataReadError(
            f"{path}: record_format={index['record_format']!r} is not one of "
            f"{list(RECORD_FORMATS)}; {_REWRITE_HINT}."
        )
    layout = index.get("layout", "array_record")
    if layout not in LAYOUTS:
        raise DataReadError(
            f"{path}: layout={layout!r} is not one of {list(LAYOUTS)}; this version of "
            f"xlstm-data cannot read it: upgrade it, or {_REWRITE_HINT}."
        )
    shard_keys = _SHARD_KEYS
    if layout == "flat":
        shard_keys = (*_SHARD_KEYS, *_FLAT_SHARD_KEYS)
        if index.get("token_dtype") not in TOKEN_DTYPES or index.get("record_format", "tokens") != (
            "tokens"
        ):
            raise DataReadError(
                f"{path}: a flat layout needs token_dtype in {list(TOKEN_DTYPES)} and token "
                f"records, not token_dtype={index.get('token_dtype')!r}, record_format="
                f"{index.get('record_format', 'tokens')!r}; {_REWRITE_HINT}."
            )
    for number, shard in enumerate(index["shards"]):
        if not isinstance(shard, dict) or any(k not in shard for k in shard_keys):
            raise DataReadError(
                f"{path}: shard entry {number} is {shard!r}, expected the keys "
                f"{list(shard_keys)}; {_REWRITE_HINT}."
            )
    return index


@dataclasses.dataclass(frozen=True)
class PreparedCorpus:
    """What the prepare index says about a list of shard files (small; pickles cheaply).

    Attributes:
      vocab_size: Every token id in the shards is below it.
      tokenizer: The tokenizer text was encoded with: "byte" or the absolute
        path of a HuggingFace tokenizer file on the machine that prepared it.
      tokenizer_vocab_size: That tokenizer's vocabulary size.
      eod_id: That tokenizer's end-of-document id.
      index_files: The `index.json` files consulted.
      slices: Per shard file read, (lengths file, first document, documents,
        tokens); None unless every file read is a listed shard.
      eod_token: The end-of-document token `prepare` was told, or None.
      pad_token: The padding token `prepare` was told, or None.
      record_format: "tokens" (int32 ids), or "text" for UTF-8 shards that
        `xlstm-data index` counted with the tokenizer.
      layout: How the shards store documents (one of `LAYOUTS`).
      token_dtype: The token dtype of flat shards ("uint16"/"uint32"), else None.
      documents: Per file read, the documents its index lists; None unless
        every file read is a listed shard. With it a source knows its size
        without opening a shard.
    """

    vocab_size: int
    tokenizer: str
    tokenizer_vocab_size: int
    eod_id: int
    index_files: tuple[str, ...]
    slices: tuple[tuple[str, int, int, int], ...] | None
    eod_token: str | None = None
    pad_token: str | None = None
    record_format: str = "tokens"
    layout: str = "array_record"
    token_dtype: str | None = None
    documents: tuple[int, ...] | None = None

    def load_tokenizer(self) -> Any:
        """The tokenizer the shards were made with, with the special tokens `prepare` was
        told (`--eod_token`/`--pad_token`); without them its own are detected again."""
        from xlstm_data.sources.tokenizers import HFTokenizer, get_tokenizer

        if self.eod_token is None and self.pad_token is None:
            return get_tokenizer(self.tokenizer)
        return HFTokenizer(self.tokenizer, eod_token=self.eod_token, pad_token=self.pad_token)

    def lengths(self) -> np.ndarray | None:
        """Every document's token count (in file order), or None if unknown.

        When the shards read are every shard of one prepared directory, in
        order, this is `lengths.npy` itself, memory-mapped (int32 as
        `prepare` writes it): a 10^8-document corpus then costs no anonymous
        memory, where an int64 copy took 800 MB. Otherwise the shards' slices
        are joined into one int64 array.

        Raises:
          DataReadError: If `lengths.npy` disagrees with a shard's token count
            in `index.json`.
        """
        if self.slices is None:
            return None
        loaded: dict[str, np.ndarray] = {}
        pieces = []
        for lengths_file, start, count, tokens in self.slices:
            if lengths_file not in loaded:
                loaded[lengths_file] = _load_lengths(lengths_file)
            piece = loaded[lengths_file][start : start + count]
            if int(piece.sum(dtype=np.int64)) != tokens:
                raise DataReadError(
                    f"{lengths_file}: documents {start}..{start + count - 1} sum to "
                    f"{int(piece.sum())} tokens but {os.path.dirname(lengths_file)}/{INDEX_FILE} "
                    f"says their shard holds {tokens}; {_REWRITE_HINT}."
                )
            pieces.append(piece)
        if len(loaded) == 1:
            (whole,) = loaded.values()
            starts = [start for _, start, _, _ in self.slices]
            counts = [count for _, _, count, _ in self.slices]
            if starts == list(np.cumsum([0, *counts[:-1]])) and sum(counts) == len(whole):
                return whole
        if not pieces:
            return np.zeros((0,), np.int64)
        return np.concatenate([np.asarray(p, dtype=np.int64) for p in pieces])


def _load_lengths(path: str) -> np.ndarray:
    """`lengths.npy`, memory-mapped, as a 1-D integer array."""
    try:
        lengths = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as error:
        raise DataReadError(
            f"{path}: cannot be read ({error}) although {INDEX_FILE} beside it lists shards; "
            f"{_REWRITE_HINT}."
        ) from error
    if lengths.ndim != 1 or lengths.dtype.kind not in "iu":
        raise DataReadError(
            f"{path}: holds an array of shape {lengths.shape} dtype {lengths.dtype}, not 1-D "
            f"integer document lengths; {_REWRITE_HINT}."
        )
    return lengths


def prepared_corpus(
    files: Sequence[str], record_counts: Sequence[int] | None = None
) -> PreparedCorpus | None:
    """Reads and checks the prepare index of shard `files`.

    Files may come from several prepared directories (each with its own index,
    all made with the same tokenizer, vocabulary and layout) and be any subset
    of their shards, in any order. A directory without `index.json` is not
    prepared: its files have no known lengths, which makes `slices` None.

    Only the indexes are read, and each listed file's size is compared with the
    index (one `stat` per file): no shard is opened, so a source of 10^5 shards
    starts in the time it takes to parse its index.

    Args:
      files: Shard files read by a source, in its order.
      record_counts: The number of records each file really holds, when the
        caller opened them (checked against the index); None: not opened, the
        index's counts are `documents`.

    Returns:
      The corpus description, or None when no file is in a prepared directory.

    Raises:
      DataReadError: If an index disagrees with the files: a file in a
        prepared directory that its index does not list, another record count
        or file size than listed (for a flat shard, also of its offsets file),
        a `lengths.npy` of another length, or two indexes with different
        tokenizers, vocabularies or layouts.
    """
    indexes: dict[str, dict[str, Any] | None] = {}
    shards: dict[str, dict[str, dict[str, Any]]] = {}
    slices: list[tuple[str, int, int, int]] | None = []
    documents: list[int] = []
    counts: Sequence[int | None] = record_counts or [None] * len(files)
    for path, count in zip(files, counts, strict=True):
        directory = os.path.dirname(os.path.abspath(path))
        if directory not in indexes:
            indexes[directory] = index = read_index(directory)
            if index is not None:
                shards[directory] = _check_lengths_file(directory, index)
        if indexes[directory] is None:
            slices = None
            continue
        index_file = os.path.join(directory, INDEX_FILE)
        entry = shards[directory].get(os.path.basename(path))
        if entry is None:
            listed = sorted(shards[directory])
            shown = listed[:3] + (["..."] if len(listed) > 3 else [])
            raise DataReadError(
                f"{path}: is in a prepared directory but {index_file} does not list it (it "
                f"lists {len(listed)} shards: {shown}); it is left over from another run or "
                f"put there by hand: move it out of the directory, or {_REWRITE_HINT}."
            )
        if count is not None and int(entry["documents"]) != int(count):
            raise DataReadError(
                f"{path}: holds {count} records but {index_file} says it holds "
                f"{entry['documents']} documents; the shard or the index is stale: "
                f"{_REWRITE_HINT}."
            )
        _check_size(path, int(entry["bytes"]), index_file)
        if "offsets" in entry:
            offsets = os.path.join(directory, entry["offsets"])
            _check_size(offsets, int(entry["offsets_bytes"]), index_file)
        documents.append(int(entry["documents"]))
        if slices is not None:
            lengths_file = os.path.join(directory, LENGTHS_FILE)
            slices.append(
                (lengths_file, entry["start"], int(entry["documents"]), int(entry["tokens"]))
            )
    prepared = {d: i for d, i in indexes.items() if i is not None}
    if not prepared:
        return None
    # Compared without the tokenizer's path, which differs between machines.
    described = {
        d: {
            **{k: i[k] for k in ("vocab_size", "tokenizer_vocab_size", "eod_id")},
            "record_format": i.get("record_format", "tokens"),
            "layout": i.get("layout", "array_record"),
            "token_dtype": i.get("token_dtype"),
        }
        for d, i in prepared.items()
    }
    (a, first), *others = described.items()
    for b, second in others:
        if second != first:
            raise DataReadError(
                "the files come from prepared directories with different vocabularies or "
                f"layouts: {os.path.join(a, INDEX_FILE)} has {first} but "
                f"{os.path.join(b, INDEX_FILE)} has {second}; read them as separate datasets "
                "or prepare them alike."
            )
    index = prepared[a]
    return PreparedCorpus(
        vocab_size=index["vocab_size"],
        tokenizer=index["tokenizer"],
        tokenizer_vocab_size=index["tokenizer_vocab_size"],
        eod_id=index["eod_id"],
        index_files=tuple(os.path.join(d, INDEX_FILE) for d in prepared),
        slices=None if slices is None else tuple(slices),
        eod_token=index.get("eod_token"),
        pad_token=index.get("pad_token"),
        record_format=index.get("record_format", "tokens"),
        layout=index.get("layout", "array_record"),
        token_dtype=index.get("token_dtype"),
        documents=None if slices is None else tuple(documents),
    )


def _check_size(path: str, listed: int, index_file: str) -> None:
    """A listed file must have the size its index records (a `stat`, no read)."""
    try:
        size = os.path.getsize(path)
    except OSError as error:
        raise DataReadError(
            f"{path}: is listed in {index_file} but cannot be found ({error}); {_REWRITE_HINT}."
        ) from error
    if size != listed:
        raise DataReadError(
            f"{path}: is {size} bytes but {index_file} says {listed}; the file was "
            f"truncated or rewritten after the index: {_REWRITE_HINT}."
        )


def _check_lengths_file(directory: str, index: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Checks `lengths.npy` has one entry per listed document; returns shards by file name."""
    by_name: dict[str, dict[str, Any]] = {}
    start = 0
    for shard in index["shards"]:
        by_name[shard["file"]] = {**shard, "start": start}
        start += int(shard["documents"])
    lengths_file = os.path.join(directory, LENGTHS_FILE)
    size = _load_lengths(lengths_file).size
    if size != start or start != index["documents"]:
        raise DataReadError(
            f"{lengths_file}: holds {size} document lengths but "
            f"{os.path.join(directory, INDEX_FILE)} lists {start} documents in "
            f"{len(index['shards'])} shards (and {index['documents']} in total); "
            f"{_REWRITE_HINT}."
        )
    return by_name


def prepared_tokenizer(prepared: PreparedCorpus, tokenizer: Any, named: Any, who: str) -> Any:
    """The tokenizer of prepared shards: the index's, or `tokenizer` if it is the same.

    Token arrays prepared with a `vocab_size` beyond the recorded
    tokenizer's hold ids that tokenizer did not make (another tokenizer's,
    e.g. GPT-2's): they have no tokenizer unless one is named that covers
    their vocabulary, so its end-of-document id is not forced on them.

    Args:
      prepared: The index of the shards.
      tokenizer: The tokenizer argument the source was given (None: the index's).
      named: That argument loaded (`get_tokenizer(tokenizer)`), or None.
      who: The source's class name, which starts error messages.

    Returns:
      The tokenizer of the source's ids, or None when it has none.

    Raises:
      DataConfigError: If `tokenizer` differs from the one the shards were
        made with (vocabulary size or end-of-document id), or is None and the
        index's tokenizer file is not on this machine.
    """
    index_file = prepared.index_files[0]
    # Text is always encoded by the recorded tokenizer, whatever the vocabulary.
    if prepared.vocab_size > prepared.tokenizer_vocab_size and prepared.record_format == "tokens":
        if tokenizer is None:
            return None
        assert named is not None
        if int(named.vocab_size) < prepared.vocab_size:
            raise DataConfigError(
                f"{who}: tokenizer={spec_repr(tokenizer)} has "
                f"{named.vocab_size} ids, fewer than the shards' vocab_size "
                f"{prepared.vocab_size} (recorded in {index_file}); name the tokenizer "
                "that made the ids, or None"
            )
        return named
    told = "".join(
        f", {key} {value!r}"
        for key, value in (("eod_token", prepared.eod_token), ("pad_token", prepared.pad_token))
        if value is not None
    )
    made_with = (
        f"tokenizer={prepared.tokenizer!r} (vocab_size {prepared.tokenizer_vocab_size}, "
        f"eod_id {prepared.eod_id}{told}, recorded in {index_file})"
    )
    if tokenizer is None:
        if prepared.tokenizer != "byte" and not os.path.isfile(prepared.tokenizer):
            raise DataConfigError(
                f"{who}: the shards were prepared with {made_with}, which is "
                "not a file on this machine; pass tokenizer= the path of a copy of it."
            )
        found = prepared.load_tokenizer()
    else:
        found = named
        assert found is not None
    if (int(found.vocab_size), int(found.eod_id)) != (
        prepared.tokenizer_vocab_size,
        prepared.eod_id,
    ):
        raise DataConfigError(
            f"{who}: tokenizer={spec_repr(tokenizer)} (vocab_size "
            f"{found.vocab_size}, eod_id {found.eod_id}) is not the tokenizer the shards "
            f"were prepared with: {made_with}; pass that tokenizer, or None to use it."
        )
    return found
