"""Step 1 of a preparation: one input part into token ids on disk.

A part (a whole input file, or a byte or row-group range of a big one) is
tokenized into `WORK/parts/<name>.tokens` (little-endian ids, documents back
to back, in the flat shards' dtype, else int32: `part_dtype`) and
`<name>.lengths.npy`, then marked done with `<name>.done.json`, which names
the dtype. Step 2 cuts the shards out of these files, so how the
output is sharded does not depend on how the input was split or which worker
tokenized what.

A part's name is a digest of everything its tokens depend on: the input's
path, size and modification time, the part's range and the tokenization
settings. A rerun (after an interruption, or with more inputs) therefore
reuses every part already done, and a changed input or setting gets a new
name instead of stale tokens. The bulky `.tokens` files are deleted once the
shards are written; the lengths and markers stay, so a rerun that finds its
shards complete reads nothing, and one that must rewrite a shard tokenizes
its parts again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from absl import logging

from xlstm_data.errors import DataReadError
from xlstm_data.prepare import paths
from xlstm_data.prepare.inputs import InputPart, SkippedLines, TokenBatch, read_documents
from xlstm_data.prepare.settings import PrepareSettings, load_tokenizer

PARTS_DIR = "parts"
#: Tokens buffered before a write: 32 MiB.
_WRITE_TOKENS = 8 << 20


@dataclasses.dataclass(frozen=True)
class PartJob:
    """A part to tokenize, with what its output depends on.

    Attributes:
      part: The input part.
      settings: The preparation's settings.
      work_dir: The preparation's work directory (`OUTPUT/.prepare`).
      signature: The input file's path, size and mtime, the part's range and
        the tokenization settings.
      name: A digest of `signature`; names the part's files.
    """

    part: InputPart
    settings: PrepareSettings
    work_dir: str
    signature: dict[str, Any]
    name: str

    def path(self, suffix: str) -> str:
        return paths.join(self.work_dir, PARTS_DIR, self.name + suffix)


def part_jobs(
    parts: Sequence[InputPart], settings: PrepareSettings, work_dir: str
) -> list[PartJob]:
    """The jobs for `parts`, each input file looked at once."""
    stats: dict[str, tuple[int, int]] = {}
    jobs = []
    for part in parts:
        if part.path not in stats:
            stats[part.path] = paths.stat(part.path)
        size, mtime_ns = stats[part.path]
        signature = {
            "source": paths.absolute(part.path),
            "size": size,
            "mtime_ns": mtime_ns,
            "kind": part.kind,
            "compression": part.compression,
            "part": [part.part, part.parts, part.start, part.stop],
            **settings.tokenization(),
        }
        digest = hashlib.sha256(json.dumps(signature, sort_keys=True).encode()).hexdigest()
        jobs.append(PartJob(part, settings, work_dir, signature, f"part-{digest[:24]}"))
    return jobs


def finished_part(job: PartJob, *, with_tokens: bool) -> dict[str, Any] | None:
    """The summary of an already tokenized part, or None if it must be (re)done."""
    done = job.path(".done.json")
    if not paths.exists(done):
        return None
    summary = paths.read_json(done)
    if summary.get("signature") != job.signature:
        return None
    if with_tokens and paths.size(job.path(".tokens")) != (
        stored_dtype(summary).itemsize * summary["tokens"]
    ):
        return None
    return summary


def part_dtype(settings: PrepareSettings) -> np.dtype:
    """The dtype a part's ids are written in: the flat shards' (uint16 up to 65,536), else int32.

    Written as int32 whatever the shards, a part was twice the bytes of the
    shards cut from it, written once and read once: `prepare` took 0.49-0.75
    s for the bench/peers corpus (51 M ids) against 0.39 s for Megatron's
    `IndexedDatasetBuilder`, 0.31 s of it in writing the int32 part.
    """
    return np.dtype(settings.token_dtype or np.int32).newbyteorder("<")


def stored_dtype(summary: dict[str, Any]) -> np.dtype:
    """The dtype of a finished part's ids (int32 for a part written before parts named it)."""
    return np.dtype(summary.get("token_dtype", "<i4"))


def part_lengths(job: PartJob) -> np.ndarray:
    """Every document's token count in a finished part."""
    with paths.open_file(job.path(".lengths.npy"), "rb") as f:
        return np.load(f)


def tokenize_part(job: PartJob, *, with_tokens: bool = True) -> dict[str, Any]:
    """Tokenizes the part unless already done; returns its summary.

    Args:
      job: The part.
      with_tokens: Whether its tokens file must exist; False accepts a part
        whose tokens were deleted after its shards were written (its
        lengths are all the shard plan needs).

    Raises:
      DataReadError: On a document that cannot be read (naming the file and
        line) or an id outside the corpus vocabulary.
    """
    finished = finished_part(job, with_tokens=with_tokens)
    if finished is not None:
        return finished
    skipped = SkippedLines()
    lengths: list[np.ndarray] = []
    dtype = part_dtype(job.settings)
    tokens_path = job.path(".tokens")
    paths.makedirs(paths.join(job.work_dir, PARTS_DIR))
    partial = paths.partial_name(tokens_path)
    with paths.open_file(partial, "wb") as out:
        buffered: list[np.ndarray] = []
        pending = 0
        for tokens, sizes in _part_tokens(job, skipped):
            lengths.append(sizes)
            buffered.append(tokens)
            pending += tokens.size
            if pending >= _WRITE_TOKENS:
                out.write(_joined(buffered, dtype))
                buffered, pending = [], 0
        if buffered:
            out.write(_joined(buffered, dtype))
    paths.replace(partial, tokens_path)
    array = np.concatenate(lengths).astype(np.int32) if lengths else np.zeros(0, np.int32)
    paths.write_npy_atomically(job.path(".lengths.npy"), array)
    summary = {
        "name": job.name,
        "signature": job.signature,
        "documents": int(array.size),
        "tokens": int(array.sum(dtype=np.int64)),
        "token_dtype": dtype.str,
        "skipped_lines": skipped.count,
        "skipped_examples": skipped.examples,
    }
    paths.write_json_atomically(job.path(".done.json"), summary)
    if skipped.count:
        logging.warning(
            "prepare: skipped %d bad lines in %s (part %d of %d), e.g. %s",
            skipped.count,
            job.part.path,
            job.part.part + 1,
            job.part.parts,
            skipped.examples[0],
        )
    return summary


def _part_tokens(job: PartJob, skipped: SkippedLines) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The part's documents as integer ids and their lengths, checked against the vocabulary.

    Token lists of a Parquet or Arrow batch come and are checked together
    (`TokenBatch`); other documents one at a time, with a length array of one.
    """
    settings = job.settings
    tokenizer = load_tokenizer(settings.tokenizer, settings.eod_token, settings.pad_token)
    documents = read_documents(
        job.part,
        field=settings.field,
        unit=settings.unit,
        skip_bad_lines=settings.skip_bad_lines,
        skipped=skipped,
        batched=True,
    )
    number = 0  # documents before this one
    for document in documents:
        if isinstance(document, TokenBatch):
            tokens, sizes = np.asarray(document.tokens), np.asarray(document.lengths)
        else:
            tokens = np.asarray(
                tokenizer.encode(document) if isinstance(document, str) else document
            )
            sizes = np.array([tokens.size], dtype=np.int64)
        if tokens.size and (int(tokens.min()) < 0 or int(tokens.max()) >= settings.vocab_size):
            at = int(np.flatnonzero((tokens < 0) | (tokens >= settings.vocab_size))[0])
            which = number + int(np.searchsorted(np.cumsum(sizes), at, side="right"))
            raise DataReadError(
                f"prepare: document {which} of {_where(job.part)} holds token id "
                f"{int(tokens[at])}, outside the corpus vocabulary [0, {settings.vocab_size}) "
                f"(--tokenizer={settings.tokenizer!r}); pass the tokenizer these ids come from "
                "(--tokenizer) or their vocabulary size (--vocab_size)"
            )
        number += len(sizes)
        yield tokens, sizes  # cast once, when written (`_joined`)


def _joined(arrays: list[np.ndarray], dtype: np.dtype) -> memoryview:
    """The arrays' ids as one buffer of `dtype`, written without another copy.

    The cast is unchecked: `_part_tokens` has checked every id against the
    vocabulary, which `dtype` holds.
    """
    return memoryview(np.concatenate(arrays, dtype=dtype, casting="unsafe"))


def _where(part: InputPart) -> str:
    if part.parts == 1:
        return repr(part.path)
    return f"{part.path!r} (part {part.part + 1} of {part.parts})"
