"""The documents every system reads, and how each system's copy of them is written.

One set of documents (lognormal lengths, token ids in [2, 65536), end of
document = 1) is drawn once with numpy and stored flat: `tokens.npy`
(uint16, no end-of-document ids) and `offsets.npy` (int64, documents + 1
entries). Every system's corpus is written from these same arrays:

- ours with `xlstm_data.prepare.corpus.prepare_corpus` (what `xlstm-data
  prepare` runs) from a Parquet file of token lists, so the bench reads
  whatever storage layout `prepare` writes by default;
- Megatron with `IndexedDatasetBuilder` (uint16, the end-of-document id
  appended to each document, as `preprocess_data.py --append-eod`), written
  by `run_megatron` in the peers' venv; OLMo-core reads the same `.bin`;
- mosaicml-streaming as MDS shards of fixed 1024-token samples of the
  concatenated stream (the llm-foundry `concat_tokens` layout), written by
  `run_streaming`.

Corpora are cached under the bench cache (`$XLSTM_DATA_BENCH_CACHE`) keyed by
their parameters, each system's copy in its own subdirectory with a
`done.json` written last, so an interrupted write is redone, never read.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import struct
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from bench.peers import runner_util

#: Token ids are < VOCAB_SIZE (uint16 everywhere); 0 pads, 1 ends a document.
VOCAB_SIZE = 65536
PAD_ID, EOD_ID = 0, 1
#: Documents are drawn and written in chunks of this many.
CHUNK_DOCUMENTS = 1 << 18


@dataclasses.dataclass(frozen=True)
class DocSpec:
    """A set of lognormal-length documents.

    Attributes:
      name: Source name (mixture component).
      documents: Number of documents.
      mean_length: Mean length in tokens (before clipping).
      sigma: Standard deviation of the log-length.
      seed: Seed of lengths and tokens.
      max_length: Longest document (the lognormal tail is clipped here).
    """

    name: str
    documents: int
    mean_length: float = 512.0
    sigma: float = 1.0
    seed: int = 0
    max_length: int = 16384

    def key(self) -> str:
        blob = json.dumps(dataclasses.asdict(self), sort_keys=True).encode()
        return f"{self.name}-{self.documents}-{hashlib.sha1(blob).hexdigest()[:10]}"


def root_dir() -> Path:
    """Where the peers' corpora live (inside the bench cache)."""
    from bench import common

    return common.cache_dir() / "peers"


def corpus_dir(spec: DocSpec) -> Path:
    return root_dir() / spec.key()


def is_done(directory: Path) -> bool:
    return (directory / "done.json").exists()


def mark_done(directory: Path, info: dict[str, Any]) -> None:
    (directory / "done.json").write_text(json.dumps(info))


def fresh_dir(directory: Path) -> Path:
    """An empty `directory` (a half-written earlier attempt is removed)."""
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    return directory


def write_documents(spec: DocSpec) -> Path:
    """Draws the documents once (cached) and returns their directory (`docs/`)."""
    directory = corpus_dir(spec) / "docs"
    if is_done(directory):
        return directory
    fresh_dir(directory)
    mu = np.log(spec.mean_length) - spec.sigma**2 / 2
    lengths = np.empty(spec.documents, dtype=np.int64)
    for first in range(0, spec.documents, CHUNK_DOCUMENTS):
        count = min(CHUNK_DOCUMENTS, spec.documents - first)
        rng = np.random.default_rng([spec.seed, 1, first])
        drawn = rng.lognormal(mu, spec.sigma, count)
        lengths[first : first + count] = np.clip(drawn, 1, spec.max_length).astype(np.int64)
    offsets = np.zeros(spec.documents + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    tokens = np.lib.format.open_memmap(
        directory / "tokens.npy", mode="w+", dtype=np.uint16, shape=(int(offsets[-1]),)
    )
    for first in range(0, spec.documents, CHUNK_DOCUMENTS):
        last = min(first + CHUNK_DOCUMENTS, spec.documents)
        begin, end = int(offsets[first]), int(offsets[last])
        rng = np.random.default_rng([spec.seed, 2, first])
        tokens[begin:end] = rng.integers(EOD_ID + 1, VOCAB_SIZE, end - begin, dtype=np.uint16)
    tokens.flush()
    del tokens
    np.save(directory / "offsets.npy", offsets)
    mark_done(directory, {"spec": dataclasses.asdict(spec), "tokens": int(offsets[-1])})
    return directory


def evict_from_page_cache(paths: Iterable[Path | str]) -> None:
    """Drops the files' pages from the page cache, so the next reader reads them from disk.

    A cold start "from nothing cached" must not find the corpus a moment
    ago written (or read by the previous round) in memory: that hides the
    reads, and on kernels with large page-cache folios it inflates the
    resident set, since a fault maps the whole cached folio around it (a
    10^8-document cold start showed 2.0 GB resident at its first batch with
    the files cached, 0.6 GB without). `POSIX_FADV_DONTNEED` drops clean
    pages without root, so each file is first flushed to disk
    (`fdatasync`): the pages of a corpus written a moment ago may still be
    dirty. A directory stands for the files in it. Where the call is
    missing (not Linux) nothing is dropped.
    """
    if not hasattr(os, "posix_fadvise"):
        return
    for path in map(Path, paths):
        for file in sorted(path.rglob("*")) if path.is_dir() else [path]:
            if not file.is_file():
                continue
            descriptor = os.open(file, os.O_RDONLY)
            try:
                os.fdatasync(descriptor)
                os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(descriptor)


def load_documents(docs: Path) -> tuple[np.ndarray, np.ndarray]:
    """`(tokens, offsets)` of a documents directory; tokens memory-mapped."""
    return np.load(docs / "tokens.npy", mmap_mode="r"), np.load(docs / "offsets.npy")


def _token_schema() -> Any:
    """One `tokens` column of uint16 ids per document (pyarrow imported when first needed)."""
    import pyarrow as pa

    return pa.schema([("tokens", pa.large_list(pa.uint16()))])


def _token_tables(docs: Path, rows_per_table: int) -> Iterator[Any]:
    """The documents as Arrow tables of one `tokens` list<uint16> column, `rows_per_table` each."""
    import pyarrow as pa

    tokens, offsets = load_documents(docs)
    schema = _token_schema()
    for first in range(0, len(offsets) - 1, rows_per_table):
        last = min(first + rows_per_table, len(offsets) - 1)
        begin, end = int(offsets[first]), int(offsets[last])
        values = pa.array(np.asarray(tokens[begin:end]), type=pa.uint16())
        column = pa.LargeListArray.from_arrays(offsets[first : last + 1] - begin, values)
        yield pa.table({"tokens": column}, schema=schema)


def write_parquet(docs: Path, path: Path, rows_per_group: int = 1 << 16) -> Path:
    """The documents as a Parquet file with one `tokens` list<uint16> column (prepare's input)."""
    import pyarrow.parquet as pq

    with pq.ParquetWriter(path, _token_schema(), compression="none") as writer:
        for table in _token_tables(docs, rows_per_group):
            writer.write_table(table)
    return path


def write_arrow(docs: Path, path: Path, rows_per_batch: int = 1 << 16) -> Path:
    """The documents as an Arrow IPC file of the same column: the token arrays as they are.

    Nothing is decoded to read it (Parquet's levels and pages are), so
    `prepare` from it compares with Megatron's builder fed memory-mapped
    arrays: the same token arrays in, only the writing measured.
    """
    import pyarrow as pa

    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, _token_schema()) as writer:
        for table in _token_tables(docs, rows_per_batch):
            writer.write_table(table)
    return path


#: `prepare`'s input files by format: the file's name and how it is written.
PREPARE_INPUTS = {
    "parquet": ("documents.parquet", write_parquet),
    "arrow": ("documents.arrow", write_arrow),
}


def prepare_ours(docs: Path, output: Path, input_format: str = "parquet") -> dict[str, Any]:
    """Runs our `prepare` on the documents written as `input_format` into `output` (new).

    Returns the prepare index and the seconds `prepare_corpus` took (the
    input file is written before the clock starts: it is the input).
    """
    import time

    from xlstm_data.prepare.corpus import prepare_corpus

    name, write = PREPARE_INPUTS[input_format]
    staging = output.parent / f".{output.name}-input"
    fresh_dir(staging)
    try:
        source = write(docs, staging / name)
        runner_util.settle_writeback()
        started = time.perf_counter()
        index = prepare_corpus(
            [str(source)],
            str(output),
            input_format=input_format,
            field="tokens",
            vocab_size=VOCAB_SIZE,
        )
        secs = time.perf_counter() - started
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return {"index": index, "secs": secs}


#: ArrayRecord shards of the documents, as another pipeline writes them (`index`'s input).
ELSEWHERE_SHARDS = 4


def write_shards_elsewhere(docs: Path) -> Path:
    """The documents as int32 ArrayRecord shards, one record per document (cached).

    As a pipeline other than ours writes them (MaxText's: group size 1,
    ArrayRecord's default compression), with no index: what `xlstm-data
    index` is for. Kept beside the documents, and only `index.json` and
    `lengths.npy` change in it.
    """
    from xlstm_data.sources.array_record import write_array_record

    directory = docs.parent / "array_record"
    if is_done(directory):
        return directory
    fresh_dir(directory)
    tokens, offsets = load_documents(docs)
    count = len(offsets) - 1
    for shard in range(ELSEWHERE_SHARDS):
        first, last = shard * count // ELSEWHERE_SHARDS, (shard + 1) * count // ELSEWHERE_SHARDS
        write_array_record(
            directory / f"shard-{shard:05d}.array_record",
            (tokens[offsets[i] : offsets[i + 1]] for i in range(first, last)),
        )
    mark_done(directory, {"shards": ELSEWHERE_SHARDS})
    return directory


def index_ours(docs: Path) -> dict[str, Any]:
    """Runs our `index` over the documents' ArrayRecord shards made elsewhere.

    Returns the index and the seconds `index_shards` took. An index of an
    earlier round is removed first; its shards stay (they are the input).
    """
    import time

    from xlstm_data.prepare.index_shards import index_shards
    from xlstm_data.sources.corpus_index import INDEX_FILE, LENGTHS_FILE

    directory = write_shards_elsewhere(docs)
    for name in (INDEX_FILE, LENGTHS_FILE):
        (directory / name).unlink(missing_ok=True)
    runner_util.settle_writeback()
    started = time.perf_counter()
    index = index_shards(str(directory / "*.array_record"), vocab_size=VOCAB_SIZE)
    return {"index": index, "secs": time.perf_counter() - started}


#: Megatron's `.idx` header: magic, version 1, dtype code 8 (uint16).
_MEGATRON_HEADER = b"MMIDIDX\x00\x00" + struct.pack("<QB", 1, 8)


def write_megatron_layout(
    tokens: np.ndarray, offsets: np.ndarray, prefix: str, eod: int = EOD_ID
) -> dict[str, Any]:
    """Megatron's `.bin`/`.idx` of documents `tokens[offsets[i]:offsets[i + 1]]`, with numpy.

    The bytes `IndexedDatasetBuilder.add_document` then `finalize` write
    for uint16 ids, one sequence a document and `eod` appended to each
    non-empty one (`preprocess_data.py --append-eod`;
    tests/test_bench_peers.py compares them with the builder's own
    files), without its Python call per document: 10^8 of them at
    `OURS_ONLY_COLD` documents, where Megatron itself is not run.
    """
    count = len(offsets) - 1
    lengths = np.diff(offsets)
    sizes = (lengths + (lengths > 0)).astype("<i4")  # each document and its end
    with open(prefix + ".bin", "wb") as out:
        for first in range(0, count, CHUNK_DOCUMENTS):
            last = min(first + CHUNK_DOCUMENTS, count)
            begin = int(offsets[first])
            stored = np.concatenate([[0], np.cumsum(sizes[first:last], dtype=np.int64)])
            part = np.empty(int(stored[-1]), dtype="<u2")
            is_end = np.zeros(len(part), dtype=bool)
            is_end[stored[1:][lengths[first:last] > 0] - 1] = True
            part[is_end] = eod
            part[~is_end] = tokens[begin : int(offsets[last])]
            out.write(part.tobytes())
    with open(prefix + ".idx", "wb") as out:
        out.write(_MEGATRON_HEADER + struct.pack("<QQ", count, count + 1))
        sizes.tofile(out)
        pointer = 0  # in bytes; written a chunk at a time (800 MB of them at 10^8)
        for first in range(0, count, CHUNK_DOCUMENTS):
            part = sizes[first : first + CHUNK_DOCUMENTS].astype(np.int64) * 2
            ends = np.cumsum(part)
            (pointer + ends - part).astype("<i8").tofile(out)
            pointer += int(ends[-1])
        for first in range(0, count + 1, CHUNK_DOCUMENTS):
            np.arange(first, min(first + CHUNK_DOCUMENTS, count + 1), dtype="<i8").tofile(out)
    return {"documents": count, "ids": int(sizes.sum(dtype=np.int64))}


def write_ours(spec: DocSpec) -> Path:
    """Our prepared copy of the documents (cached)."""
    directory = corpus_dir(spec) / "ours"
    if is_done(directory):
        return directory
    if directory.exists():
        shutil.rmtree(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    result = prepare_ours(write_documents(spec), directory)
    mark_done(directory, {"prepare_secs": result["secs"]})
    return directory


def our_source(directory: Path | str) -> dict[str, Any]:
    """The data-config source of a directory `prepare` wrote.

    The shard files are found from the directory's `index.json`, so a change
    of their names follows; a shard kind this function does not know is an
    error asking to teach it (rather than silently measuring something else).
    """
    index = json.loads((Path(directory) / "index.json").read_text())
    layout = index.get("layout", "array_record")
    if layout in ("flat", "array_record"):  # a prepared directory opens in either layout
        return {"kind": "array_record", "path": str(directory)}
    raise ValueError(
        f"{directory}: prepare wrote shards of layout {layout!r}, which bench/peers/corpus.py "
        "does not know how to read; add their source kind to our_source"
    )
