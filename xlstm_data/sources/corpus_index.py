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

from xlstm_data.errors import DataReadError

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
#: Keys an index may hold (absent: "tokens" records, the tokenizer's own special tokens).
_OPTIONAL_KEYS: dict[str, type] = {"record_format": str, "eod_token": str, "pad_token": str}


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
    for number, shard in enumerate(index["shards"]):
        if not isinstance(shard, dict) or any(k not in shard for k in _SHARD_KEYS):
            raise DataReadError(
                f"{path}: shard entry {number} is {shard!r}, expected the keys "
                f"{list(_SHARD_KEYS)}; {_REWRITE_HINT}."
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


def prepared_corpus(files: Sequence[str], record_counts: Sequence[int]) -> PreparedCorpus | None:
    """Reads and checks the prepare index of shard `files`.

    Files may come from several prepared directories (each with its own index,
    all made with the same tokenizer and vocabulary) and be any subset of their
    shards, in any order. A directory without `index.json` is not prepared: its
    files have no known lengths, which makes `slices` None.

    Args:
      files: ArrayRecord files read by a source, in its order.
      record_counts: The number of records each file really holds.

    Returns:
      The corpus description, or None when no file is in a prepared directory.

    Raises:
      DataReadError: If an index disagrees with the files: a file in a
        prepared directory that its index does not list, another record count
        or file size than listed, a `lengths.npy` of another length, or two
        indexes with different tokenizers or vocabularies.
    """
    indexes: dict[str, dict[str, Any] | None] = {}
    shards: dict[str, dict[str, dict[str, Any]]] = {}
    slices: list[tuple[str, int, int, int]] | None = []
    for path, count in zip(files, record_counts, strict=True):
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
        if int(entry["documents"]) != int(count):
            raise DataReadError(
                f"{path}: holds {count} records but {index_file} says it holds "
                f"{entry['documents']} documents; the shard or the index is stale: "
                f"{_REWRITE_HINT}."
            )
        size = os.path.getsize(path)
        if int(entry["bytes"]) != size:
            raise DataReadError(
                f"{path}: is {size} bytes but {index_file} says {entry['bytes']}; the shard "
                f"was rewritten after the index: {_REWRITE_HINT}."
            )
        if slices is not None:
            lengths_file = os.path.join(directory, LENGTHS_FILE)
            slices.append((lengths_file, entry["start"], int(count), int(entry["tokens"])))
    prepared = {d: i for d, i in indexes.items() if i is not None}
    if not prepared:
        return None
    # Compared without the tokenizer's path, which differs between machines.
    described = {
        d: {
            **{k: i[k] for k in ("vocab_size", "tokenizer_vocab_size", "eod_id")},
            "record_format": i.get("record_format", "tokens"),
        }
        for d, i in prepared.items()
    }
    (a, first), *others = described.items()
    for b, second in others:
        if second != first:
            raise DataReadError(
                "the files come from prepared directories with different vocabularies: "
                f"{os.path.join(a, INDEX_FILE)} has {first} but {os.path.join(b, INDEX_FILE)} "
                f"has {second}; read them as separate datasets or prepare them with one "
                "tokenizer."
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
