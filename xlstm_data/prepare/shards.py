"""Step 2 of a preparation: which documents go to which output shard, and writing them.

Where a document lands is a pure function of the tokenized parts' lengths
(in input order) and the settings: the held-out split is a seeded
permutation of the global document numbers, and the training documents are
cut into shards of about equal tokens (or one shard per input file), in
input order. No runner, worker count or part size changes a byte of the
output, which is what lets the Beam runner's output be checked against the
local one, and lets a rerun resume shard by shard.

Held-out documents are chosen as those whose position under a keyed
bijection of [0, documents) is below the held-out count: exact in number,
spread over the whole corpus, evaluated per document without holding a
permutation in memory, whatever the corpus size.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from xlstm_data.errors import DataConfigError, DataReadError
from xlstm_data.plan.permutation import FeistelPermutation, derive_seed
from xlstm_data.prepare import paths
from xlstm_data.prepare.settings import PrepareSettings
from xlstm_data.prepare.tokenize import stored_dtype
from xlstm_data.sources.array_record import write_array_record
from xlstm_data.sources.flat_tokens import flat_shard_files, offsets_path

TRAIN, VALIDATION = "train", "validation"
#: The held-out split's shards and index live in this subdirectory of the output.
VALIDATION_DIR = "validation"
SHARDS_DIR = "shards"
#: Documents read from a part's tokens per read: bounded memory for huge parts.
_READ_TOKENS = 8 << 20

#: Files of the output directories `prepare` writes; only these are ever deleted.
SHARD_FILE = re.compile(
    r"(shard-\d{5,}-of-\d{5,}\.(?:array_record|tokens\.npy|offsets\.npy))(\.[0-9a-f]{12}\.partial)?"
)


def shard_name(index: int, count: int, layout: str = "array_record") -> str:
    """The file of shard `index` of `count` (for "flat", its tokens file)."""
    stem = f"shard-{index:05d}-of-{count:05d}"
    return flat_shard_files(stem)[0] if layout == "flat" else f"{stem}.array_record"


@dataclasses.dataclass(frozen=True)
class TokenizedPart:
    """What the shard plan needs to know of a tokenized part.

    Attributes:
      name: The part's name (its files in the work directory).
      source: The input file it came from.
      file_number: That file's position among the inputs.
      first_document: The global number of its first document.
      documents: Its documents.
    """

    name: str
    source: str
    file_number: int
    first_document: int
    documents: int


@dataclasses.dataclass(frozen=True)
class HeldOut:
    """The held-out documents: those whose permuted number is below `count`."""

    documents: int
    count: int
    seed: int

    def mask(self, first: int, count: int) -> np.ndarray:
        """Whether each of the global documents [first, first + count) is held out."""
        if self.count == 0 or count == 0:
            return np.zeros(count, dtype=bool)
        permutation = FeistelPermutation(self.documents, self.seed)
        return permutation(np.arange(first, first + count, dtype=np.int64)) < self.count


@dataclasses.dataclass(frozen=True)
class Piece:
    """Documents [start, stop) of a part, of which the shard takes its split's.

    `first_document` (the global number of the part's first document) only
    matters to the held-out choice; without a held-out split it is 0, so a
    shard's digest does not change when an earlier input gains documents and
    a rerun keeps the shards of unchanged inputs.
    """

    part: str
    first_document: int
    start: int
    stop: int


@dataclasses.dataclass(frozen=True)
class ShardTask:
    """One output shard: where its documents come from and what it will hold."""

    split: str
    file: str
    pieces: tuple[Piece, ...]
    held_out: HeldOut
    documents: int
    tokens: int
    inputs: tuple[str, ...]
    token_dtype: str | None = None

    @property
    def layout(self) -> str:
        """ "flat" (a tokens and an offsets file, ids as `token_dtype`) or "array_record"."""
        return "array_record" if self.token_dtype is None else "flat"

    @property
    def files(self) -> tuple[str, ...]:
        """Every file the shard is made of."""
        return (self.file, offsets_path(self.file)) if self.layout == "flat" else (self.file,)

    def digest(self) -> str:
        """What the shard's bytes depend on (its parts' names cover their inputs)."""
        described = dataclasses.asdict(self)
        if self.token_dtype is None:  # as before flat shards existed: old shards are kept
            del described["token_dtype"]
        text = json.dumps(described, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()


def held_out(settings: PrepareSettings, documents: int) -> HeldOut:
    """The held-out split of a corpus of `documents` documents."""
    count = settings.held_out_documents(documents)
    if count == 0:  # nothing depends on the corpus size then (see `Piece`)
        return HeldOut(0, 0, 0)
    return HeldOut(documents, count, derive_seed("prepare/validation", settings.seed))


def plan_shards(
    parts: Sequence[TokenizedPart],
    lengths_of: Callable[[TokenizedPart], np.ndarray],
    settings: PrepareSettings,
    files: int,
) -> list[ShardTask]:
    """Every output shard, training then held-out, in order.

    Training documents fill `settings.shard_count` shards in input order,
    document d going to the shard its first token's position falls in (a
    token-balanced cut); without a count, each input file is one shard. The
    held-out documents, in input order, fill shards of about the same size.

    Args:
      parts: The tokenized parts in input order.
      lengths_of: A part's document lengths (read once per pass; parts are
        visited one at a time, so memory stays per part).
      settings: The preparation's settings.
      files: The number of input files.

    Raises:
      DataConfigError: If the inputs hold no document, or the held-out split
        would take all of them.
    """
    total = sum(part.documents for part in parts)
    if total == 0:
        raise DataConfigError(
            "prepare: the inputs hold no documents (every line or file is blank); check the "
            "INPUT globs and --field/--unit"
        )
    split = held_out(settings, total)
    tokens = {TRAIN: 0, VALIDATION: 0}
    for part in parts:
        lengths = lengths_of(part).astype(np.int64)
        mask = split.mask(part.first_document, part.documents)
        tokens[VALIDATION] += int(lengths[mask].sum())
        tokens[TRAIN] += int(lengths[~mask].sum())
    train_shards = settings.shard_count(tokens[TRAIN])
    counts = {TRAIN: files if train_shards is None else train_shards, VALIDATION: 0}
    if split.count:
        share = tokens[VALIDATION] / max(1, tokens[TRAIN] + tokens[VALIDATION])
        counts[VALIDATION] = max(1, round(counts[TRAIN] * share))
    builders = {
        name: _Shards(name, counts[name], split, settings.token_dtype)
        for name in (TRAIN, VALIDATION)
    }
    offsets = {TRAIN: 0, VALIDATION: 0}
    for part in parts:
        lengths = lengths_of(part).astype(np.int64)
        mask = split.mask(part.first_document, part.documents)
        for name, members in ((TRAIN, ~mask), (VALIDATION, mask)):
            local = np.flatnonzero(members)
            if not local.size:
                continue
            sizes = lengths[local]
            if name == TRAIN and train_shards is None:
                shard = np.full(local.size, part.file_number, dtype=np.int64)
            else:
                starts = offsets[name] + np.cumsum(sizes) - sizes
                shard = np.minimum(starts * counts[name] // max(1, tokens[name]), counts[name] - 1)
            offsets[name] += int(sizes.sum())
            builders[name].add(part, local, shard, sizes)
    return [*builders[TRAIN].tasks(), *builders[VALIDATION].tasks()]


class _Shards:
    """Collects the pieces, documents and tokens of one split's shards."""

    def __init__(self, split: str, count: int, held: HeldOut, token_dtype: str | None):
        self._split = split
        self._held = held
        self._token_dtype = token_dtype
        self._pieces: list[list[Piece]] = [[] for _ in range(count)]
        self._documents = [0] * count
        self._tokens = [0] * count
        self._inputs: list[dict[str, None]] = [{} for _ in range(count)]

    def add(
        self, part: TokenizedPart, local: np.ndarray, shard: np.ndarray, sizes: np.ndarray
    ) -> None:
        """Adds a part's documents `local` (sorted), going to shards `shard` (non-decreasing)."""
        cuts = np.flatnonzero(np.diff(shard)) + 1
        first_document = part.first_document if self._held.count else 0
        for first, stop in zip([0, *cuts.tolist()], [*cuts.tolist(), local.size], strict=True):
            k = int(shard[first])
            self._pieces[k].append(
                Piece(part.name, first_document, int(local[first]), int(local[stop - 1]) + 1)
            )
            self._documents[k] += stop - first
            self._tokens[k] += int(sizes[first:stop].sum())
            self._inputs[k][part.source] = None

    def tasks(self) -> Iterator[ShardTask]:
        count = len(self._pieces)
        for k in range(count):
            layout = "array_record" if self._token_dtype is None else "flat"
            yield ShardTask(
                self._split,
                shard_name(k, count, layout),
                tuple(self._pieces[k]),
                self._held,
                self._documents[k],
                self._tokens[k],
                tuple(self._inputs[k]),
                self._token_dtype,
            )


def split_directory(output_dir: str, split: str) -> str:
    return output_dir if split == TRAIN else paths.join(output_dir, VALIDATION_DIR)


def _marker(work_dir: str, task: ShardTask, suffix: str) -> str:
    return paths.join(work_dir, SHARDS_DIR, f"{task.split}-{task.file}{suffix}")


def finished_shard(task: ShardTask, output_dir: str, work_dir: str) -> dict[str, Any] | None:
    """The summary of a shard already written with these contents, or None."""
    marker = _marker(work_dir, task, ".done.json")
    if not paths.exists(marker):
        return None
    summary = paths.read_json(marker)
    directory = split_directory(output_dir, task.split)
    if summary.get("digest") != task.digest():
        return None
    if paths.size(paths.join(directory, task.file)) != summary.get("bytes"):
        return None
    if task.layout == "flat" and (
        paths.size(paths.join(directory, offsets_path(task.file))) != summary.get("offsets_bytes")
    ):
        return None
    return summary


def write_shard(
    task: ShardTask, output_dir: str, work_dir: str, part_path: Callable[[str, str], str]
) -> dict[str, Any]:
    """Writes one shard (unless already written) from its parts' tokens; returns its summary.

    Args:
      task: The shard.
      output_dir: The preparation's output directory.
      work_dir: Its work directory (markers and lengths go there).
      part_path: `part_path(name, suffix)`: a tokenized part's file.
    """
    finished = finished_shard(task, output_dir, work_dir)
    if finished is not None:
        return finished
    directory = split_directory(output_dir, task.split)
    paths.makedirs(directory)
    paths.makedirs(paths.join(work_dir, SHARDS_DIR))
    final = paths.join(directory, task.file)
    lengths: list[np.ndarray] = []

    def chunks() -> Iterator[np.ndarray]:
        for piece in task.pieces:
            for tokens, sizes in _piece_chunks(piece, task, part_path):
                lengths.append(sizes.astype(np.int32))
                yield tokens

    def records() -> Iterator[np.ndarray]:
        for tokens in chunks():
            yield from np.split(tokens, np.cumsum(lengths[-1])[:-1])

    if task.layout == "flat":
        _write_flat(task, final, chunks())
    else:
        partial = paths.partial_name(final)
        with paths.local_copy_for_writing(partial) as local:
            write_array_record(local, records())
        paths.replace(partial, final)
    array = np.concatenate(lengths) if lengths else np.zeros(0, np.int32)
    if array.size != task.documents or int(array.sum(dtype=np.int64)) != task.tokens:
        raise DataReadError(
            f"prepare: shard {task.file} came out with {array.size} documents and "
            f"{int(array.sum())} tokens, planned {task.documents} and {task.tokens}: an input "
            "changed during the run; rerun prepare"
        )
    summary_files = {}
    if task.layout == "flat":
        offsets = np.zeros(array.size + 1, dtype=np.int64)
        np.cumsum(array, out=offsets[1:])
        offsets_file = paths.join(directory, offsets_path(task.file))
        paths.write_npy_atomically(offsets_file, offsets)
        summary_files = {
            "offsets": offsets_path(task.file),
            "offsets_bytes": paths.size(offsets_file),
        }
    paths.write_npy_atomically(_marker(work_dir, task, ".lengths.npy"), array)
    summary = {
        "digest": task.digest(),
        "split": task.split,
        "file": task.file,
        "documents": task.documents,
        "tokens": task.tokens,
        "bytes": paths.size(final),
        **summary_files,
    }
    paths.write_json_atomically(_marker(work_dir, task, ".done.json"), summary)
    return summary


def _write_flat(task: ShardTask, final: str, chunks: Iterator[np.ndarray]) -> None:
    """Writes a flat shard's tokens file: the documents' ids back to back, as `token_dtype`.

    The ids were checked against the vocabulary when their part was tokenized.
    A part of an earlier version holds int32 ids, which are checked again
    here, one pass per chunk, because a narrowing cast would wrap an id that
    does not fit without a sound; a part in the shard's dtype needs no cast,
    so no pass (two reductions over every id).
    """
    assert task.token_dtype is not None
    dtype = np.dtype(task.token_dtype).newbyteorder("<")
    upper = int(np.iinfo(dtype).max)

    def checked(chunk: np.ndarray) -> np.ndarray:
        return chunk if np.can_cast(chunk.dtype, dtype, "safe") else _narrowed(chunk, upper)

    try:
        paths.write_npy_in_pieces(final, (checked(chunk) for chunk in chunks), task.tokens, dtype)
    except ValueError as error:
        raise DataReadError(
            f"prepare: shard {task.file}: {error}, planned {task.tokens} tokens: an input "
            "changed during the run; rerun prepare"
        ) from error


def _narrowed(joined: np.ndarray, upper: int) -> np.ndarray:
    if joined.size and (int(joined.min()) < 0 or int(joined.max()) > upper):
        raise DataReadError(
            f"prepare: a tokenized part holds id {int(joined.max())} or {int(joined.min())}, "
            f"outside [0, {upper}]; its files in the work directory were changed: delete the "
            "output's .prepare directory and rerun prepare"
        )
    return joined


def shard_lengths(task: ShardTask, work_dir: str) -> np.ndarray:
    with paths.open_file(_marker(work_dir, task, ".lengths.npy"), "rb") as f:
        return np.load(f)


def _piece_chunks(
    piece: Piece, task: ShardTask, part_path: Callable[[str, str], str]
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The piece's documents of the task's split, in chunks of about `_READ_TOKENS` tokens.

    Each chunk is the kept documents' ids back to back and their lengths:
    one read and, when the other split holds some of them, one mask, never a
    Python step per document.
    """
    with paths.open_file(part_path(piece.part, ".lengths.npy"), "rb") as f:
        part_lengths = np.load(f).astype(np.int64)
    dtype = stored_dtype(paths.read_json(part_path(piece.part, ".done.json")))
    width = dtype.itemsize
    lengths = part_lengths[piece.start : piece.stop]
    before = int(part_lengths[: piece.start].sum())
    mask = task.held_out.mask(piece.first_document + piece.start, piece.stop - piece.start)
    keep = mask if task.split == VALIDATION else ~mask
    ends = np.cumsum(lengths)
    with paths.open_file(part_path(piece.part, ".tokens"), "rb") as tokens_file:
        first = 0
        while first < lengths.size:
            base = int(ends[first - 1]) if first else 0
            stop = max(first + 1, int(np.searchsorted(ends, base + _READ_TOKENS, side="right")))
            stop = min(stop, lengths.size)
            count = int(ends[stop - 1]) - base
            tokens_file.seek(width * (before + base))
            raw = tokens_file.read(width * count)
            if len(raw) != width * count:
                raise DataReadError(
                    f"prepare: {part_path(piece.part, '.tokens')} is shorter than its lengths "
                    "say; delete the output's .prepare directory and rerun prepare"
                )
            flat = np.frombuffer(raw, dtype=dtype)
            kept, sizes = keep[first:stop], lengths[first:stop]
            if kept.all():
                yield flat, sizes
            elif kept.any():
                yield flat[np.repeat(kept, sizes)], sizes[kept]
            first = stop
