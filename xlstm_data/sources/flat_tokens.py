"""Prepared shards in the flat layout: a memory-mapped token file and document offsets each.

Reading one compressed ArrayRecord record per document costs a call into the
reader and a decompression per document (56 % of the 0-worker host path on the
benchmark corpus). A shard stored as one flat array of token ids, with the
offsets of its documents, gives each document as a zero-copy slice of a memory
map instead: no decompression, no copy, no per-document call, and the page
cache is shared by every process reading the shard. Megatron's `.bin`/`.idx`
and OLMo's `.npy` token files are stored this way.

Per shard, `prepare` writes two `.npy` files (names from `flat_shard_files`):

- `<shard>.tokens.npy`: 1-D, the documents' ids back to back (no EOD added), in
  the smallest dtype that holds the vocabulary (`token_dtype`): uint16 for a
  vocabulary of at most 65,536 ids, else uint32;
- `<shard>.offsets.npy`: 1-D int64, documents + 1 entries, where document d is
  `tokens[offsets[d]:offsets[d + 1]]`.

The directory's `index.json` (with `"layout": "flat"`) lists both files with
their sizes, and `lengths.npy` holds every document's length, so a source
knows its size and lengths from those two files alone: building it `stat`s
each shard and opens none. Each process maps a shard on its first read, so a
source pickles to grain workers as a few paths.
"""

from __future__ import annotations

import mmap
from collections.abc import Sequence
from typing import SupportsIndex

import numpy as np
from absl import logging

from xlstm_data.errors import DataConfigError, DataReadError
from xlstm_data.sources.base import (
    PathPattern,
    TokenizerSpec,
    TokenSource,
    _check_vocab_size,
    expand_files,
)
from xlstm_data.sources.corpus_index import (
    INDEX_FILE,
    PreparedCorpus,
    prepared_corpus,
    prepared_tokenizer,
)
from xlstm_data.sources.token_shards import MappedShard, ShardFiles, TokenShards
from xlstm_data.sources.tokenizers import get_tokenizer

TOKENS_SUFFIX = ".tokens.npy"
OFFSETS_SUFFIX = ".offsets.npy"
_REWRITE = "rerun `xlstm-data prepare` with the same inputs and --output to rewrite it"


def token_dtype(vocab_size: int) -> str:
    """The smallest unsigned dtype holding ids below `vocab_size`: "uint16" or "uint32"."""
    return "uint16" if vocab_size <= 1 << 16 else "uint32"


def flat_shard_files(shard: str) -> tuple[str, str]:
    """The tokens and offsets file names of shard `shard` (e.g. "shard-00000-of-00004")."""
    return shard + TOKENS_SUFFIX, shard + OFFSETS_SUFFIX


def offsets_path(tokens_path: str) -> str:
    """The offsets file beside a tokens file."""
    return tokens_path[: -len(TOKENS_SUFFIX)] + OFFSETS_SUFFIX


class FlatTokenSource(TokenSource):
    """Documents of flat-layout shards written by `xlstm-data prepare` (see the module doc).

    Token ids are checked against the vocabulary on every read, in one
    vectorised pass over the ids read, unless the storage dtype alone bounds
    them (uint16 ids under a vocabulary of 65,536 or more). A damaged file
    (truncated, rewritten, or with offsets or ids that do not fit) raises one
    `DataReadError` naming it.
    """

    def __init__(
        self,
        pattern: PathPattern,
        tokenizer: TokenizerSpec = None,
        vocab_size: int | None = None,
    ) -> None:
        """Reads the shards' index; opens no shard.

        Args:
          pattern: Glob or path of `*.tokens.npy` shards, or a list of them;
            matched files are sorted. Each must be listed in the `index.json`
            of its directory.
          tokenizer: None for the tokenizer recorded in the index; any other
            must be the same (vocabulary size and end-of-document id).
          vocab_size: Exclusive bound checked for every token id; default the
            index's vocab_size.

        Raises:
          DataConfigError: On a bad argument, a pattern matching no file or a
            file that is not a listed flat shard, a corpus without documents,
            or a tokenizer that is not the one the shards were made with.
          DataReadError: If an index disagrees with the files (size, listing).
        """
        explicit_vocab = _check_vocab_size(vocab_size, "FlatTokenSource: vocab_size")
        if tokenizer is not None:
            self._tokenizer = get_tokenizer(tokenizer)
        self._files = expand_files(pattern, "FlatTokenSource: pattern")
        others = [path for path in self._files if not path.endswith(TOKENS_SUFFIX)]
        if others:
            raise DataConfigError(
                f"FlatTokenSource: pattern={pattern!r} matches {others[0]!r}, which is not a "
                f"flat token shard (*{TOKENS_SUFFIX}); narrow the pattern to the shards, e.g. "
                f"'DIR/*{TOKENS_SUFFIX}', or pass the prepared directory in a config "
                "(kind='array_record', path='DIR')."
            )
        prepared = prepared_corpus(self._files)
        if prepared is None or prepared.documents is None or prepared.slices is None:
            raise DataConfigError(
                f"FlatTokenSource: {self._files[0]!r} is not listed in an {INDEX_FILE} beside "
                "it; flat shards are read with the index `xlstm-data prepare` writes with them: "
                "pass the shards of a prepared directory."
            )
        if prepared.layout != "flat":
            raise DataConfigError(
                f"FlatTokenSource: {prepared.index_files[0]} says its shards are in the "
                f"{prepared.layout!r} layout, not 'flat'; read them with ArrayRecordSource."
            )
        self._prepared: PreparedCorpus = prepared
        self._tokenizer = prepared_tokenizer(
            prepared, tokenizer, self._tokenizer, "FlatTokenSource"
        )
        self.vocab_size = prepared.vocab_size if explicit_vocab is None else explicit_vocab
        assert prepared.token_dtype is not None
        self._dtype = np.dtype(prepared.token_dtype).newbyteorder("<")
        self._documents = np.asarray(prepared.documents, dtype=np.int64)
        self._tokens = np.asarray([s[3] for s in prepared.slices], dtype=np.int64)
        self._num_documents = int(self._documents.sum())
        if self._num_documents == 0:
            raise DataConfigError(
                f"FlatTokenSource: pattern={pattern!r} matched {len(self._files)} shard(s) but "
                "they hold no documents; point it at non-empty shards."
            )
        self._shards = TokenShards(
            ShardFiles(
                "FlatTokenSource", self._files, [offsets_path(f) for f in self._files], _REWRITE
            ),
            self._documents,
            self._open,
            self.vocab_size,
            self._dtype,
        )
        logging.info(
            "FlatTokenSource: %d documents in %d shards (%s ... %s), %s ids, vocab_size=%d.",
            self._num_documents,
            len(self._files),
            self._files[0],
            self._files[-1],
            self._dtype.name,
            self.vocab_size,
        )

    def _open(self, shard: int) -> MappedShard:
        """Maps a shard's two files and checks they are what the index says."""
        path = self._files[shard]
        documents, tokens = int(self._documents[shard]), int(self._tokens[shard])
        tokens_array = _load(path, self._dtype, tokens, "tokens")
        offsets_file = offsets_path(path)
        offsets = _load(offsets_file, np.dtype("<i8"), documents + 1, "document offsets")
        if int(offsets[0]) != 0 or int(offsets[-1]) != tokens:
            raise DataReadError(
                f"FlatTokenSource: {offsets_file}: offsets run from {int(offsets[0])} to "
                f"{int(offsets[-1])}, but its shard holds {tokens} tokens (offsets must run from "
                f"0 to {tokens}); the file is damaged: {_REWRITE}."
            )
        return MappedShard(tokens_array, lambda local: (offsets[local], offsets[local + 1]))

    def check_files(self) -> None:
        """Checks every shard's headers and offsets' ends now, before training reads any.

        Reads a few bytes per file (the `.npy` headers, the first and last
        offset), never the tokens, so garbage in a header or an offsets
        file's ends is one error at start-up rather than hours into a run.
        Ids are checked against the vocabulary on every read, and offsets
        inside the file when their documents are read. The maps are kept for
        this process's reads.

        Raises:
          DataReadError: Naming the damaged file (see `_open`).
        """
        self._shards.open_all()

    # Reading ------------------------------------------------------------------

    @property
    def files(self) -> list[str]:
        """Every file read: each shard's tokens file, then its offsets file."""
        return [name for path in self._files for name in (path, offsets_path(path))]

    @property
    def prepared(self) -> PreparedCorpus:
        """What the `xlstm-data prepare` index says about the shards."""
        return self._prepared

    @property
    def token_dtype(self) -> np.dtype:
        """The dtype ids are stored (and `read_many` returns them) in."""
        return self._dtype

    def __len__(self) -> int:
        return self._num_documents

    def lengths(self) -> np.ndarray:
        """Every document's token count: the index's `lengths.npy`, memory-mapped; no shard read.

        Raises:
          DataReadError: If `lengths.npy` disagrees with `index.json`.
        """
        lengths = self._prepared.lengths()
        assert lengths is not None
        return lengths

    def _read(self, index: int) -> np.ndarray:
        (tokens,) = self.read_many(np.array([index], dtype=np.int64))
        return np.array(tokens, dtype=np.int32)

    def read_many(self, indices: Sequence[SupportsIndex] | np.ndarray) -> list[np.ndarray]:
        """Several documents as zero-copy, read-only slices of the shards' memory maps.

        Their ids are checked against `vocab_size` in one pass over all of
        them (skipped when the dtype bounds them).

        Args:
          indices: Document indices in [-len, len), repeats allowed.

        Returns:
          One 1-D array per index, in the storage dtype (`token_dtype`:
          uint16 or uint32), read-only and backed by the file.

        Raises:
          IndexError: If an index is out of range.
          DataReadError: If a shard is damaged or holds an id outside the
            vocabulary, naming the file and document.
        """
        return self._shards.read_many(indices)

    def __repr__(self) -> str:
        files = (
            repr(self._files[0])
            if len(self._files) == 1
            else f"{len(self._files)} files {self._files[0]!r}..{self._files[-1]!r}"
        )
        return (
            f"FlatTokenSource({files}, documents={self._num_documents}, "
            f"dtype={self._dtype.name}, vocab_size={self.vocab_size})"
        )


def _load(path: str, dtype: np.dtype, size: int, what: str) -> np.ndarray:
    """A 1-D `.npy` of `size` entries of `dtype`, memory-mapped, as a plain read-only array.

    The map is advised for random access (`MADV_RANDOM`): training reads
    documents in shuffled order, and the kernel's default read-around on a
    page fault (up to megabytes) then reads mostly tokens nobody asked for.
    Measured on the 10^6-document benchmark corpus with its pages evicted,
    64 random documents took 258 ms with the default and 17 ms advised.

    Raises:
      DataReadError: If the file cannot be mapped (truncated, not `.npy`) or
        holds another dtype, shape or size than its index says.
    """
    try:
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            read_header = (
                np.lib.format.read_array_header_1_0
                if version == (1, 0)
                else np.lib.format.read_array_header_2_0
            )
            shape, fortran_order, found = read_header(f)
            header = f.tell()
            if found != dtype or shape != (size,) or fortran_order:
                raise DataReadError(
                    f"FlatTokenSource: {path}: holds {what} of dtype {found} and shape "
                    f"{shape}, but its index says dtype {dtype.name} and shape ({size},); the "
                    f"file is damaged or from another preparation: {_REWRITE}."
                )
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        if hasattr(mmap, "MADV_RANDOM"):
            mapped.madvise(mmap.MADV_RANDOM)
        # A plain ndarray over the map (a np.memmap costs a subclass hook per slice).
        return np.frombuffer(mapped, dtype=dtype, count=size, offset=header)
    except (OSError, ValueError, EOFError) as error:
        raise DataReadError(
            f"FlatTokenSource: {path}: cannot be memory-mapped as a .npy file of {what} "
            f"({error}); the file is damaged or truncated: {_REWRITE}."
        ) from error
