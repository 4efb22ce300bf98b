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
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import multiprocessing
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
from absl import logging

from xlstm_data.checks import check_int
from xlstm_data.corpus_index import INDEX_FILE, LENGTHS_FILE, PREPARE_FORMAT_VERSION
from xlstm_data.errors import DataConfigError, DataReadError
from xlstm_data.sources import TEXT_UNITS, TextFileSource, _expand_files, write_array_record
from xlstm_data.tokenizers import get_tokenizer

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


def shard_name(index: int, count: int) -> str:
    return f"shard-{index:05d}-of-{count:05d}.array_record"


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
    }


def _format_of(path: str, input_format: str) -> str:
    if input_format != "auto":
        return input_format
    if path.endswith(".jsonl"):
        return "jsonl"
    if path.endswith(_TOKEN_SUFFIXES):
        return "tokens"
    return "text"


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
    if os.path.exists(done):
        with open(done) as f:
            summary = json.load(f)
        if {k: summary.get(k) for k in signature} == signature:
            return summary
    lengths: list[int] = []

    def counted() -> Iterator[np.ndarray]:
        for tokens in _documents(job):
            lengths.append(len(tokens))
            yield np.asarray(tokens, dtype=np.int32)

    final = os.path.join(output_dir, job.shard)
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
    }
    _write_json_atomically(done, summary)
    return summary


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
    workers: int = 1,
    progress: Callable[[int, int, dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Tokenizes `inputs` into ArrayRecord shards with an index in `output_dir`.

    Args:
      inputs: Files or globs. `.jsonl` files are JSONL, `.npy`/`.npz` token
        arrays, anything else text (unless `input_format` says otherwise).
      output_dir: Where shards, `index.json` and `lengths.npy` go.
      input_format: "auto", "text", "jsonl" or "tokens".
      field: JSONL key holding each document's text.
      unit: Text documents are lines ("line") or whole files ("file").
      tokenizer: "byte" or a local HuggingFace tokenizer `.json` file.
      workers: Input files tokenized in parallel (processes).
      progress: Called as `progress(done, total, shard_summary)` per shard.

    Returns:
      The index (also written to `output_dir/index.json`).
    """
    if input_format not in INPUT_FORMATS:
        raise DataConfigError(
            f"--format={input_format!r} is invalid; valid formats: {list(INPUT_FORMATS)}"
        )
    if unit not in TEXT_UNITS:
        raise DataConfigError(f"--unit={unit!r} is invalid; valid units: {list(TEXT_UNITS)}")
    check_int("workers", workers, 1)
    vocab_size = get_tokenizer(tokenizer).vocab_size  # refuses a bad tokenizer up front
    files = _expand_files(list(inputs), "inputs")
    os.makedirs(os.path.join(output_dir, WORK_DIR), exist_ok=True)
    jobs = [
        ShardJob(
            path, shard_name(i, len(files)), _format_of(path, input_format), field, unit, tokenizer
        )
        for i, path in enumerate(files)
    ]
    summaries: dict[str, dict[str, Any]] = {}
    for summary in _prepared_shards(jobs, output_dir, workers):
        summaries[summary["file"]] = summary
        if progress:
            progress(len(summaries), len(jobs), summary)
    shards = [summaries[job.shard] for job in jobs]
    lengths = np.concatenate(
        [np.load(_lengths_path(output_dir, s["file"])) for s in shards]
    ).astype(np.int32)
    np.save(os.path.join(output_dir, LENGTHS_FILE), lengths)
    index = {
        "format_version": PREPARE_FORMAT_VERSION,
        "tokenizer": tokenizer,
        "vocab_size": int(vocab_size),
        "documents": int(lengths.size),
        "tokens": int(lengths.sum()),
        "shards": [{k: s[k] for k in ("file", "source", "documents", "tokens")} for s in shards],
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
