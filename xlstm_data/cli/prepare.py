"""Turns raw text, JSONL or token arrays into tokenized ArrayRecord shards.

Tokenizing once, ahead of training, keeps the tokenizer out of the training
hosts' hot loop and gives every later tool the corpus's shape without reading
it: the output directory holds one shard per input file plus `index.json`
(documents and tokens per shard) and `lengths.npy` (every document's length,
in source order), which `ArrayRecordSource` uses for exact epoch lengths and
`xlstm-data inspect` for its plan.

Each shard is written under a temporary name and renamed when complete, then
marked done with a small JSON file recording its input's size and mtime, so a
rerun after an interruption keeps finished shards and redoes only the rest.
Input files are processed in parallel worker processes.

The index also records the tokenizer and the vocabulary every id was checked
against, so readers bound ids and pick the end-of-document id from the data
itself. A rerun with other inputs deletes the shards it no longer produces
(only files named like its own shards), so `DIR/*.array_record` never mixes
two runs; a reader finding an index that disagrees with the shards fails.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import multiprocessing
import os
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
from absl import logging

from xlstm_data.checks import check_int
from xlstm_data.errors import DataConfigError, DataReadError
from xlstm_data.sources import TEXT_UNITS, TextFileSource, expand_files, write_array_record
from xlstm_data.sources.corpus_index import INDEX_FILE, LENGTHS_FILE, PREPARE_FORMAT_VERSION
from xlstm_data.sources.tokenizers import get_tokenizer

INPUT_FORMATS = ("auto", "text", "jsonl", "tokens")
_TOKEN_SUFFIXES = (".npy", ".npz")


@dataclasses.dataclass(frozen=True)
class ShardJob:
    """One input file and the shard it becomes."""

    source: str
    shard: str
    input_format: str
    field: str
    unit: str
    tokenizer: str
    vocab_size: int


def shard_name(index: int, count: int) -> str:
    return f"shard-{index:05d}-of-{count:05d}.array_record"


#: Files `prepare` writes in the output directory (shards, half-written shards)
#: and in its work directory (markers); only these are ever deleted.
_SHARD_FILE = re.compile(r"(shard-\d{5,}-of-\d{5,}\.array_record)(\.partial)?")
_WORK_FILE = re.compile(
    r"(shard-\d{5,}-of-\d{5,}\.array_record)\.(done\.json|lengths\.npy)(\.partial)?"
)


#: Per-shard bookkeeping lives apart, so `DIR/*` globs match shards only.
WORK_DIR = ".prepare"


def _done_path(output_dir: str, shard: str) -> str:
    return os.path.join(output_dir, WORK_DIR, shard + ".done.json")


def _lengths_path(output_dir: str, shard: str) -> str:
    return os.path.join(output_dir, WORK_DIR, shard + ".lengths.npy")


def _input_signature(job: ShardJob) -> dict[str, Any]:
    """What a finished shard depends on: its input file and how it was tokenized."""
    stat = os.stat(job.source)
    return {
        "source": os.path.abspath(job.source),
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "input_format": job.input_format,
        "field": job.field,
        "unit": job.unit,
        "tokenizer": job.tokenizer,
        "vocab_size": job.vocab_size,
    }


def _format_of(path: str, input_format: str) -> str:
    """The input format of `path`; `.json` is too ambiguous to guess.

    Raises:
      DataConfigError: If `input_format` is "auto" and `path` ends in ".json".
    """
    if input_format != "auto":
        return input_format
    if path.lower().endswith(".jsonl"):
        return "jsonl"
    if path.lower().endswith(_TOKEN_SUFFIXES):
        return "tokens"
    if path.lower().endswith(".json"):
        raise DataConfigError(
            f"prepare: input {path!r} ends in .json, which --format=auto does not guess: pass "
            "--format=jsonl if it holds one JSON object per line (the text under --field), or "
            "--format=text to tokenize its characters, braces included"
        )
    return "text"


def _tokenizer_spec(tokenizer: str | os.PathLike[str] | None) -> str:
    """The tokenizer argument as workers load it and the index records it."""
    if tokenizer is None:
        return "byte"
    spec = os.fspath(tokenizer)
    return os.path.abspath(spec) if spec.endswith(".json") else spec


def _token_documents(path: str) -> Iterator[np.ndarray]:
    """Documents of a `.npy` (1-D: one document; 2-D: one per row) or `.npz` file."""
    try:
        loaded = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as error:
        raise DataReadError(f"prepare: cannot read token file {path!r}: {error}") from error
    arrays = [loaded[k] for k in loaded.files] if hasattr(loaded, "files") else [loaded]
    for number, array in enumerate(arrays):
        if array.dtype.kind not in "iu" or array.ndim not in (1, 2):
            raise DataReadError(
                f"prepare: array {number} in {path!r} has dtype {array.dtype} and shape "
                f"{array.shape}; token files hold 1-D (one document) or 2-D (one per row) "
                "integer arrays"
            )
        yield from ([array] if array.ndim == 1 else list(array))


def _documents(job: ShardJob) -> Iterator[np.ndarray]:
    if job.input_format == "tokens":
        yield from _token_documents(job.source)
        return
    source = TextFileSource(
        job.source,
        tokenizer=job.tokenizer,
        unit=job.unit,
        jsonl_field=job.field if job.input_format == "jsonl" else None,
        json_as_text=job.input_format == "text",
    )
    try:
        for index in range(len(source)):
            yield source[index]["tokens"]
    finally:
        source.close()


def prepare_shard(job: ShardJob, output_dir: str) -> dict[str, Any]:
    """Writes one shard (unless already done); returns its summary."""
    done = _done_path(output_dir, job.shard)
    signature = _input_signature(job)
    final = os.path.join(output_dir, job.shard)
    if os.path.exists(done):
        with open(done) as f:
            summary = json.load(f)
        if {k: summary.get(k) for k in signature} == signature and _size(final) == summary.get(
            "bytes"
        ):
            return summary
    lengths: list[int] = []

    def counted() -> Iterator[np.ndarray]:
        for number, tokens in enumerate(_documents(job)):
            tokens = np.asarray(tokens)
            if tokens.size and (int(tokens.min()) < 0 or int(tokens.max()) >= job.vocab_size):
                bad = int(tokens[(tokens < 0) | (tokens >= job.vocab_size)][0])
                raise DataReadError(
                    f"prepare: document {number} of {job.source!r} holds token id {bad}, "
                    f"outside the corpus vocabulary [0, {job.vocab_size}) (tokenizer="
                    f"{job.tokenizer!r}); pass the tokenizer these ids come from (--tokenizer) "
                    "or their vocabulary size (vocab_size)"
                )
            lengths.append(len(tokens))
            yield tokens.astype(np.int32)

    partial = final + ".partial"
    try:
        write_array_record(partial, counted())
    except DataConfigError as error:
        raise DataReadError(f"prepare: {job.source!r}: {error}") from error
    np.save(_lengths_path(output_dir, job.shard), np.asarray(lengths, dtype=np.int32))
    os.replace(partial, final)
    summary = {
        **signature,
        "file": job.shard,
        "documents": len(lengths),
        "tokens": int(sum(lengths)),
        "bytes": os.path.getsize(final),
    }
    _write_json_atomically(done, summary)
    return summary


def _size(path: str) -> int | None:
    try:
        return os.path.getsize(path)
    except OSError:
        return None


def _remove_stale_shards(output_dir: str, shards: set[str]) -> None:
    """Deletes shards (and their markers) of earlier runs that this run does not produce.

    Only names `prepare` itself writes are touched, so other files a user keeps
    in the output directory survive.
    """
    work = os.path.join(output_dir, WORK_DIR)
    for directory, pattern in ((output_dir, _SHARD_FILE), (work, _WORK_FILE)):
        for name in sorted(os.listdir(directory)):
            match = pattern.fullmatch(name)
            if match is None or (match.group(1) in shards and not name.endswith(".partial")):
                continue
            path = os.path.join(directory, name)
            logging.info("prepare: removing %s, which this run does not produce", path)
            os.remove(path)


def _write_json_atomically(path: str, value: Any) -> None:
    partial = path + ".partial"
    with open(partial, "w") as f:
        json.dump(value, f, indent=1)
    os.replace(partial, path)


def _prepared_shards(
    jobs: Sequence[ShardJob], output_dir: str, workers: int
) -> Iterator[dict[str, Any]]:
    """Shard summaries as the shards finish, in this process or in `workers` processes."""
    if workers == 1 or len(jobs) == 1:
        for job in jobs:
            yield prepare_shard(job, output_dir)
        return
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
        futures = [pool.submit(prepare_shard, job, output_dir) for job in jobs]
        for future in concurrent.futures.as_completed(futures):
            yield future.result()


def prepare_corpus(
    inputs: Sequence[str],
    output_dir: str,
    *,
    input_format: str = "auto",
    field: str = "text",
    unit: str = "line",
    tokenizer: str = "byte",
    vocab_size: int | None = None,
    workers: int = 1,
    progress: Callable[[int, int, dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Tokenizes `inputs` into ArrayRecord shards with an index in `output_dir`.

    Args:
      inputs: Files or globs. `.jsonl` files are JSONL, `.npy`/`.npz` token
        arrays, anything else but `.json` text (unless `input_format` says
        otherwise; a `.json` file needs an explicit format).
      output_dir: Where shards, `index.json` and `lengths.npy` go. Shards of an
        earlier run that this one does not produce are deleted.
      input_format: "auto", "text", "jsonl" or "tokens".
      field: JSONL key holding each document's text.
      unit: Text documents are lines ("line") or whole files ("file").
      tokenizer: "byte" or a local HuggingFace tokenizer `.json` file.
      vocab_size: The corpus vocabulary every id is checked against, recorded
        in the index; default the tokenizer's. Larger only for token arrays
        whose ids are not the tokenizer's (or a padded model vocabulary).
      workers: Input files tokenized in parallel (processes).
      progress: Called as `progress(done, total, shard_summary)` per shard.

    Returns:
      The index (also written to `output_dir/index.json`).

    Raises:
      DataConfigError: On a bad argument (before any input is read).
      DataReadError: On an input that cannot be read or holds ids outside the
        vocabulary.
    """
    if input_format not in INPUT_FORMATS:
        raise DataConfigError(
            f"--format={input_format!r} is invalid; valid formats: {list(INPUT_FORMATS)}"
        )
    if unit not in TEXT_UNITS:
        raise DataConfigError(f"--unit={unit!r} is invalid; valid units: {list(TEXT_UNITS)}")
    check_int("workers", workers, 1)
    spec = _tokenizer_spec(tokenizer)
    loaded = get_tokenizer(spec)  # refuses a bad tokenizer up front
    corpus_vocab = int(loaded.vocab_size)
    if vocab_size is not None:
        corpus_vocab = check_int("vocab_size", vocab_size, 1)
        if corpus_vocab < loaded.vocab_size:
            raise DataConfigError(
                f"vocab_size={vocab_size} is smaller than the vocabulary of tokenizer={spec!r} "
                f"({loaded.vocab_size} ids); pass vocab_size >= {loaded.vocab_size}, or leave it "
                "unset to use the tokenizer's"
            )
    files = expand_files(list(inputs), "inputs")
    formats = [_format_of(path, input_format) for path in files]
    os.makedirs(os.path.join(output_dir, WORK_DIR), exist_ok=True)
    jobs = [
        ShardJob(path, shard_name(i, len(files)), kind, field, unit, spec, corpus_vocab)
        for i, (path, kind) in enumerate(zip(files, formats, strict=True))
    ]
    summaries: dict[str, dict[str, Any]] = {}
    for summary in _prepared_shards(jobs, output_dir, workers):
        summaries[summary["file"]] = summary
        if progress:
            progress(len(summaries), len(jobs), summary)
    shards = [summaries[job.shard] for job in jobs]
    _remove_stale_shards(output_dir, {job.shard for job in jobs})
    lengths = np.concatenate(
        [np.load(_lengths_path(output_dir, s["file"])) for s in shards]
    ).astype(np.int32)
    lengths_file = os.path.join(output_dir, LENGTHS_FILE)
    with open(lengths_file + ".partial", "wb") as f:
        np.save(f, lengths)
    os.replace(lengths_file + ".partial", lengths_file)
    index = {
        "format_version": PREPARE_FORMAT_VERSION,
        "tokenizer": spec,
        "tokenizer_vocab_size": int(loaded.vocab_size),
        "eod_id": int(loaded.eod_id),
        "vocab_size": corpus_vocab,
        "documents": int(lengths.size),
        "tokens": int(lengths.sum()),
        "shards": [
            {k: s[k] for k in ("file", "source", "documents", "tokens", "bytes")} for s in shards
        ],
    }
    _write_json_atomically(os.path.join(output_dir, INDEX_FILE), index)
    logging.info(
        "prepared %d documents, %d tokens in %d shards under %s",
        index["documents"],
        index["tokens"],
        len(shards),
        output_dir,
    )
    return index
