"""Megatron-LM's `.bin`/`.idx` corpora, read in place: no `prepare`, no copy.

A user who trains with Megatron-LM has corpora written by its
`tools/preprocess_data.py` (`IndexedDatasetBuilder`): per prefix, a `.bin`
of every id back to back and an `.idx` that says where each sequence lies.
They are the flat layout under another index, so this source memory-maps
them as they are; converting a 10^9-token corpus with `prepare` would cost
minutes and a second copy on disk.

The `.idx` (every integer little-endian): the 9 bytes `MMIDIDX\\0\\0`; uint64
version 1; uint8 dtype code (1 uint8, 2 int8, 3 int16, 4 int32, 5 int64,
8 uint16; 6 and 7 are floats, refused); uint64 sequence count S; uint64
document count D (document boundaries: documents + 1); int32 sequence
lengths [S]; int64 sequence byte offsets into the `.bin` [S]; int64 document
boundaries [D], in sequences (document d is sequences `[b[d], b[d + 1])`);
and, for multimodal corpora, int8 sequence modes [S]. A document of several
sequences (`--split-sentences`) is read as one document: its sequences lie
back to back in the `.bin`, which is checked when the shard is opened.

Megatron's preprocessing appends the tokenizer's end-of-document id to every
non-empty document when asked (`--append-eod`), while this package appends
one when it packs. `end_of_document` names that stored id: each non-empty
document must end with it (checked on every read, and on each corpus's first
documents when the source is built) and is read without it, so it is not
doubled. A source left without it whose documents do end with the run's id
is refused (`resolve_eod_token_id`): it would otherwise train on two in a
row, silently. The files record no tokenizer, so a run with neither a
tokenizer nor `end_of_document` must set its end-of-document id.
"""

from __future__ import annotations

import glob
import mmap
import os
import re
from collections.abc import Iterator, Sequence
from typing import Any, SupportsIndex

import numpy as np
from absl import logging

from xlstm_data.errors import DataConfigError, DataReadError
from xlstm_data.sources.base import PathPattern, TokenizerSpec, TokenSource, _check_vocab_size
from xlstm_data.sources.lengths_cache import cached_lengths, file_signature
from xlstm_data.sources.token_shards import MappedShard, ShardFiles, TokenShards
from xlstm_data.sources.tokenizers import Tokenizer, get_tokenizer

MAGIC = b"MMIDIDX\x00\x00"
#: `.idx` dtype codes of integer ids (Megatron's `DType`).
DTYPE_CODES = {1: "u1", 2: "i1", 3: "<i2", 4: "<i4", 5: "<i8", 8: "<u2"}
_HEADER = len(MAGIC) + 8 + 1 + 8 + 8
_REMEDY = "write the corpus again with Megatron's tools/preprocess_data.py"
#: Documents whose last id is looked at to find a stored end-of-document id.
SAMPLED_ENDS = 64


def megatron_prefixes(path: PathPattern, arg: str = "path") -> list[str]:
    """The corpus prefixes `path` names, each with its `.bin` and `.idx` present.

    Args:
      path: A prefix as Megatron's `--data-path` takes it ("/data/web_text_document"),
        the prefix's `.bin` or `.idx`, a glob of `.idx` (or `.bin`) files, or
        a list of these. A glob's prefixes are sorted; a list keeps its order.
      arg: How errors name the argument.

    Raises:
      DataConfigError: If nothing matches or a prefix lacks one of its files.
    """
    if isinstance(path, (str, os.PathLike)):
        entries = [path]
    elif isinstance(path, (list, tuple)) and all(isinstance(e, (str, os.PathLike)) for e in path):
        entries = list(path)
    else:
        raise DataConfigError(
            f"{arg}={path!r} is not a corpus prefix; pass a prefix (str), a list of them, or a "
            "glob of .idx files, e.g. '/data/web_text_document'."
        )
    if not entries:
        raise DataConfigError(
            f"{arg}={path!r} names no corpus; pass a prefix such as '/data/web_text_document'."
        )
    prefixes: list[str] = []
    for entry in entries:
        entry = os.fspath(entry)
        if glob.has_magic(entry):
            matched = sorted({_prefix(p) for p in glob.glob(entry) if p.endswith((".bin", ".idx"))})
            if not matched:
                raise DataConfigError(
                    f"{arg}={entry!r} matches no .bin or .idx file; pass Megatron corpus prefixes "
                    "or a glob of their .idx files, e.g. '/data/*_text_document.idx'."
                )
        else:
            matched = [_prefix(entry)]
        for prefix in matched:
            for suffix in (".bin", ".idx"):
                if not os.path.isfile(prefix + suffix):
                    raise DataConfigError(
                        f"{arg}={entry!r}: {prefix + suffix} does not exist; a Megatron corpus "
                        "is a .bin and an .idx of one prefix (pass the prefix, as Megatron's "
                        "--data-path takes it)."
                    )
            if prefix not in prefixes:
                prefixes.append(prefix)
    return prefixes


def _prefix(path: str) -> str:
    return path[:-4] if path.endswith((".bin", ".idx")) else path


#: Megatron's split parts, in `--split` order.
SPLIT_PARTS = ("train", "valid", "test")


#: A `--split` string: up to 3 plain non-negative numbers, apart by commas, slashes or spaces.
_SPLIT = re.compile(r"\s*(\d+\.?\d*|\.\d+)(?:[\s,/]+(\d+\.?\d*|\.\d+)){0,2}\s*")


def split_bookends(split: Any, part: Any, arg: str = "split") -> tuple[float, float] | None:
    """Where part `part` of Megatron's `--split` begins and ends, as fractions of a corpus.

    None for `split` None (every document: only the "train" part exists).
    As Megatron parses it: the numbers of the string (`"969,30,1"`,
    `"98/2"`), missing ones 0, normalised; the parts' bookends are their
    running sums, the same float additions Megatron makes. A list of up to 3
    numbers is taken too (what a command-line override `...split=969,30,1`
    gives), and one number (`...split=90`). A string Megatron would misread
    silently (`"1e3,1"` is 1:3:1 there, `"-1,2"` 1:2) is refused.

    Raises:
      DataConfigError: Naming `arg`, on anything but up to 3 non-negative
        finite numbers with a positive sum, a part not in `SPLIT_PARTS` (or
        not "train" without a split), or a part of zero width.
    """
    if part not in SPLIT_PARTS:
        raise DataConfigError(
            f"{arg}_part={part!r} is not a part of the split; valid parts: {list(SPLIT_PARTS)}."
        )
    if split is None:
        if part != "train":
            raise DataConfigError(
                f"{arg}_part={part!r} needs {arg}: without a split every document is the train "
                f"part, and a {part!r} dataset would hold the train documents too; set {arg} to "
                "Megatron's --split string, e.g. '969,30,1', for every dataset of these files."
            )
        return None
    numbers = _split_numbers(split)
    if numbers is None:
        raise DataConfigError(
            f"{arg}={split!r} is not a Megatron --split; pass up to 3 non-negative numbers for "
            "train, valid and test with a positive sum, e.g. '969,30,1' (or [969, 30, 1]), or "
            "None for every document."
        )
    weights = np.array(numbers + [0.0] * (3 - len(numbers)), dtype=np.float64)
    weights = (weights / weights.sum()).tolist()
    ends = [0.0]
    for weight in weights:
        ends.append(ends[-1] + weight)
    low, high = ends[SPLIT_PARTS.index(part)], ends[SPLIT_PARTS.index(part) + 1]
    if high <= low:
        raise DataConfigError(
            f"{arg}={split!r} gives the {part!r} part no documents; give it a share, or read "
            "another part."
        )
    return low, high


def _split_numbers(split: Any) -> list[float] | None:
    """The numbers of a `--split` string or list, or None when it is not one."""
    if isinstance(split, (int, float)) and not isinstance(split, bool):
        split = [split]  # an override `...split=90` arrives as a number: Megatron's "90"
    if isinstance(split, str):
        if not _SPLIT.fullmatch(split):
            return None
        numbers = [float(n) for n in re.findall(r"\d+\.?\d*|\.\d+", split)]
    elif isinstance(split, (list, tuple)) and all(
        isinstance(n, (int, float)) and not isinstance(n, bool) for n in split
    ):
        numbers = [float(n) for n in split]
    else:
        return None
    finite = all(np.isfinite(n) and n >= 0 for n in numbers)
    if not 1 <= len(numbers) <= 3 or not finite or not np.isfinite(sum(numbers)):
        return None
    return numbers if sum(numbers) > 0 else None


def split_range(bookends: tuple[float, float] | None, documents: int) -> tuple[int, int]:
    """The documents `[begin, end)` of a corpus of `documents` its split part takes.

    Megatron's arithmetic (`int(round(fraction * n))`, Python's rounding), so
    a corpus of one sequence a document gives the documents Megatron's
    `GPTDataset` gives that part. Megatron splits `--split-sentences` corpora
    by sentence; this source keeps documents whole and splits by document.
    """
    if bookends is None:
        return 0, documents
    return int(round(bookends[0] * float(documents))), int(round(bookends[1] * float(documents)))


def check_end_of_document(value: Any, arg: str = "end_of_document") -> int | None:
    """`end_of_document` as an id, or None; anything else is refused naming `arg`."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise DataConfigError(
            f"{arg}={value!r} is not a token id; pass the id --append-eod stored after every "
            "document (e.g. 50256 for GPT-2), or None when the corpus was written without it."
        )
    return int(value)


def _parsed_header(header: bytes, path: str) -> tuple[np.dtype, int, int]:
    """The ids' dtype, the sequence count and the document boundaries' count of an `.idx`."""
    if len(header) < _HEADER or not header.startswith(MAGIC):
        raise DataReadError(
            f"MegatronIndexedSource: {path}: not a Megatron index (it does not start with "
            f"{MAGIC!r}); pass the prefix of a corpus written by Megatron's "
            "IndexedDatasetBuilder."
        )
    version, code, sequences, boundaries = (
        int(np.frombuffer(header, "<u8", 1, len(MAGIC))[0]),
        header[len(MAGIC) + 8],
        int(np.frombuffer(header, "<u8", 1, len(MAGIC) + 9)[0]),
        int(np.frombuffer(header, "<u8", 1, len(MAGIC) + 17)[0]),
    )
    if version != 1:
        raise DataReadError(
            f"MegatronIndexedSource: {path}: index version {version}; only version 1 (what "
            "every Megatron-LM release writes) is known."
        )
    if code not in DTYPE_CODES:
        raise DataReadError(
            f"MegatronIndexedSource: {path}: dtype code {code} is not an integer id dtype; "
            f"token corpora use codes {sorted(DTYPE_CODES)} (8: uint16, 4: int32)."
        )
    return np.dtype(DTYPE_CODES[code]), sequences, boundaries


def dtype_bounds_ids(dtype: np.dtype) -> bool:
    """Whether the storage dtype alone bounds the ids (uint8, uint16): no vocab_size needed."""
    return dtype.kind == "u" and dtype.itemsize <= 2


def check_ids_are_bounded(prefixes: list[str], arg: str) -> None:
    """Refuses corpora whose ids no vocabulary bounds, reading 34 bytes of each `.idx`.

    Run when a config names neither `vocab_size` nor a tokenizer, before any
    source of the run is opened.
    """
    for prefix in prefixes:
        try:
            with open(prefix + ".idx", "rb") as f:
                header = f.read(_HEADER)
        except OSError as error:
            raise DataReadError(
                f"MegatronIndexedSource: {prefix}.idx: cannot be read ({error})."
            ) from error
        dtype, _, _ = _parsed_header(header, prefix + ".idx")
        if not dtype_bounds_ids(dtype):
            raise DataConfigError(
                f"{arg} is unset and {prefix}.idx stores {dtype.name} ids, which bound no "
                "vocabulary (Megatron writes int32 for 65,500 ids or more); set it to the "
                "tokenizer's vocabulary size, or name the tokenizer"
            )


def _identity(path: str) -> list[Any]:
    """What a file's cached lengths depend on: path, size, mtime, inode and change time."""
    stat = os.stat(path)
    return [*file_signature(path), int(stat.st_ino), int(stat.st_ctime_ns)]


def _less_stored_ends(lengths: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Stored lengths less each document's stored end; an empty document stores none."""
    return np.subtract(lengths, lengths > 0, out=out)


def _advise(mapped: mmap.mmap | None, advice: str, *where: int) -> None:
    """`mapped.madvise(mmap.<advice>, *where)` where the platform has it; never fails.

    Advice changes only speed and the resident set: Linux refuses
    `MADV_DONTNEED` on locked memory (`mlockall`, as some RDMA setups do),
    and the corpus reads the same without it.
    """
    flag = getattr(mmap, advice, None)
    if mapped is None or flag is None:
        return
    try:
        mapped.madvise(flag, *where)
    except OSError as error:
        logging.log_first_n(logging.INFO, "madvise(%s) refused: %s", 1, advice, error)


#: Entries of an `.idx` array checked at a time (32 MB of int64).
_BLOCK = 1 << 22


def _step_range(blocks: Iterator[np.ndarray]) -> tuple[int, int]:
    """The smallest and largest step between consecutive boundaries, a block at a time.

    Each block overlaps the next by one boundary. A corpus of 10^8
    documents would otherwise take an 800 MB temporary.
    """
    lows, highs = [], []
    for block in blocks:
        if len(block) > 1:
            steps = np.diff(block)
            lows.append(int(steps.min()))
            highs.append(int(steps.max()))
    return (min(lows), max(highs)) if lows else (1, 1)


class _Index:
    """One `.idx`, memory-mapped and checked: per document, its length and first id."""

    def __init__(self, path: str):
        try:
            with open(path, "rb") as f:
                header = f.read(_HEADER)
                size = os.fstat(f.fileno()).st_size
                mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else None
        except OSError as error:
            raise DataReadError(
                f"MegatronIndexedSource: {path}: cannot be read ({error})."
            ) from error
        self.dtype, sequences, boundaries = _parsed_header(header, path)
        expected = _HEADER + 12 * sequences + 8 * boundaries
        if boundaries < 1 or size not in (expected, expected + sequences):
            raise DataReadError(
                f"MegatronIndexedSource: {path}: {size} bytes, but its header ({sequences} "
                f"sequences, {boundaries} document boundaries) needs {expected} (or "
                f"{expected + sequences} with modes); the file is truncated or damaged: {_REMEDY}."
            )
        self.path = path
        self._mapped = mapped
        self.sequence_lengths = np.frombuffer(mapped, "<i4", sequences, _HEADER)
        self.pointers = np.frombuffer(mapped, "<i8", sequences, _HEADER + 4 * sequences)
        bounds_at = _HEADER + 12 * sequences
        bounds = np.frombuffer(mapped, "<i8", boundaries, bounds_at)
        low, high = _step_range(self._released_blocks(bounds, bounds_at, overlap=1))
        if int(bounds[0]) != 0 or int(bounds[-1]) != sequences or low < 0:
            raise DataReadError(
                f"MegatronIndexedSource: {path}: document boundaries must rise from 0 to "
                f"{sequences} (the sequence count); they run from {int(bounds[0])} to "
                f"{int(bounds[-1])}{' and fall' if low < 0 else ''}: {_REMEDY}."
            )
        shortest = min(
            (int(b.min()) for b in self._released_blocks(self.sequence_lengths, _HEADER)),
            default=0,
        )
        if shortest < 0:
            raise DataReadError(
                f"MegatronIndexedSource: {path}: a negative sequence length: {_REMEDY}."
            )
        # Read from now on a document at a time, in shuffled order: without this a
        # read maps 64 KB around each entry, and the first batch at 10^8 documents
        # left 424 MB of the .idx resident.
        _advise(mapped, "MADV_RANDOM")
        #: Each document's first sequence is `bounds[d]`; None for one sequence a document.
        self._bounds: np.ndarray | None = None if low == high == 1 else bounds
        self._bounds_at = bounds_at
        self._summed: np.ndarray | None = None

    @property
    def lengths(self) -> np.ndarray:
        """Every document's stored length: the mapped lengths, or its sequences' summed.

        Summed on first use only: a process that takes the source's lengths
        from the lengths cache (a grain worker) reads documents by their
        sequences and never needs them (4 bytes a document).
        """
        if self._bounds is None:
            return self.sequence_lengths
        if self._summed is None:
            self._summed = self._summed_lengths(self._bounds, self._bounds_at)
        return self._summed

    def stored_lengths(self, documents: np.ndarray) -> np.ndarray:
        """The stored lengths of some `documents`, without summing every document's."""
        documents = np.asarray(documents, dtype=np.int64)
        if self._bounds is None:
            return self.sequence_lengths[documents].astype(np.int64)
        first = self._bounds[documents]
        counts = self._bounds[documents + 1] - first
        sums = np.zeros(len(documents), dtype=np.int64)
        starts = np.cumsum(counts) - counts  # each document's first place in `values`
        values = self.sequence_lengths[np.repeat(first - starts, counts) + np.arange(counts.sum())]
        filled = counts > 0
        if filled.any():
            sums[filled] = np.add.reduceat(values.astype(np.int64), starts[filled])
        return sums

    def _summed_lengths(self, bounds: np.ndarray, bounds_at: int) -> np.ndarray:
        """Each document's length, its sequences' summed, a block of documents at a time (int32).

        A whole cumulative sum (int64 per sequence) and the result in int64
        took 1.6 GB at 10^8 sequences; a block's sum takes 32 MB.
        """
        lengths = np.empty(len(bounds) - 1, dtype=np.int32)
        for k, block in enumerate(self._released_blocks(bounds, bounds_at, overlap=1)):
            if len(block) < 2:
                continue
            first, last = int(block[0]), int(block[-1])
            total = np.zeros(last - first + 1, dtype=np.int64)
            np.cumsum(self.sequence_lengths[first:last], dtype=np.int64, out=total[1:])
            self._release(_HEADER + 4 * first, 4 * (last - first))
            summed = total[block[1:] - first] - total[block[:-1] - first]
            if len(summed) and int(summed.max()) > np.iinfo(np.int32).max:
                bad = k * _BLOCK + int(np.argmax(summed))
                raise DataReadError(
                    f"MegatronIndexedSource: {self.path}: document {bad} holds "
                    f"{int(summed.max())} ids, more than the 2^31 - 1 a document may hold."
                )
            lengths[k * _BLOCK : k * _BLOCK + len(summed)] = summed
        return lengths

    def _released_blocks(
        self, array: np.ndarray, offset: int, overlap: int = 0
    ) -> Iterator[np.ndarray]:
        """`array`, mapped at byte `offset`, `_BLOCK` entries at a time, each let go after use.

        A block's pages leave this process's resident set once the caller
        moves on (`MADV_DONTNEED`; they stay in the page cache, and a later
        read maps them again). The checks at start read every boundary and
        length: at 10^8 documents they left 1.2 GB of the `.idx` resident,
        and the cold start peaked at 1.8 GB against the 1 GB it may take.
        """
        for start in range(0, len(array), _BLOCK):
            yield array[start : start + _BLOCK + overlap]
            self._release(offset + start * array.itemsize, (_BLOCK + overlap) * array.itemsize)

    def _release(self, begin: int, size: int) -> None:
        """Drops bytes `[begin, begin + size)` of the `.idx` map from the resident set."""
        if self._mapped is None:
            return
        aligned = begin - begin % mmap.PAGESIZE
        end = min(begin + size, len(self._mapped))
        if end > aligned:
            _advise(self._mapped, "MADV_DONTNEED", aligned, end - aligned)

    def lengths_less_stored_ends(self, begin: int, end: int) -> np.ndarray:
        """Documents `[begin, end)`'s lengths less the stored end of each non-empty one.

        A new array, made a block at a time so that the mapped lengths
        (400 MB at 10^8 documents) do not stay resident beside it.
        """
        lengths = self.lengths[begin:end]
        if self._bounds is not None:  # lengths summed over sequences: already a new array
            return _less_stored_ends(lengths)
        out = np.empty(len(lengths), dtype=lengths.dtype)
        offset = _HEADER + begin * lengths.itemsize
        for k, block in enumerate(self._released_blocks(lengths, offset)):
            _less_stored_ends(block, out=out[k * _BLOCK : k * _BLOCK + len(block)])
        return out

    @property
    def documents(self) -> int:
        return len(self.sequence_lengths) if self._bounds is None else len(self._bounds) - 1

    def check_back_to_back(self) -> None:
        """Checks that the sequences of documents of several lie back to back in the `.bin`."""
        if self._bounds is None or len(self.sequence_lengths) < 2:
            return
        pointers_at = _HEADER + 4 * len(self.sequence_lengths)
        for k, pointers in enumerate(self._released_blocks(self.pointers, pointers_at, overlap=1)):
            start = k * _BLOCK
            lengths = self.sequence_lengths[start : start + len(pointers) - 1]
            gaps = np.diff(pointers) - lengths.astype(np.int64) * self.dtype.itemsize
            self._release(_HEADER + 4 * start, 4 * len(lengths))
            if not gaps.any():
                continue
            bad = start + int(np.flatnonzero(gaps)[0]) + 1
            raise DataReadError(
                f"MegatronIndexedSource: {self.path}: sequence {bad} does not follow "
                f"sequence {bad - 1} in the .bin, so a document of several sequences cannot be "
                f"read as one: {_REMEDY}."
            )

    def spans(self, local: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Where documents `local`, of `lengths` ids each, lie in the `.bin`, in ids."""
        if self._bounds is None:
            first = local
        else:  # an empty last document's first sequence is past the end: any will do
            first = np.minimum(self._bounds[local], max(len(self.sequence_lengths) - 1, 0))
        pointers = self.pointers[first] if len(self.pointers) else np.zeros(len(local), np.int64)
        begin, misaligned = np.divmod(pointers, self.dtype.itemsize)
        if misaligned.any():
            raise DataReadError(
                f"MegatronIndexedSource: {self.path}: a document's offset is not a multiple of "
                f"the {self.dtype.itemsize}-byte id size: {_REMEDY}."
            )
        return begin, begin + lengths

    def bin_ids(self) -> int:
        """Ids the `.bin` must hold: up to the end of the last sequence."""
        if not len(self.sequence_lengths):
            return 0
        return (int(self.pointers[-1]) + int(self.sequence_lengths[-1]) * self.dtype.itemsize) // (
            self.dtype.itemsize
        )


class MegatronIndexedSource(TokenSource):
    """The documents of Megatron-LM `.bin`/`.idx` corpora, memory-mapped (see the module doc).

    Every `.idx` is read when the source is built (lengths, counts, checks);
    each `.bin` is mapped on its first read in each process. A damaged file
    raises one `DataReadError` naming it.

    Args:
      path: Corpus prefixes (see `megatron_prefixes`), read in that order.
      vocab_size: Exclusive bound checked for every id; default the
        tokenizer's, else the dtype's (256 for uint8, 65,536 for uint16).
        Required for int32 and wider ids when no tokenizer is given.
      tokenizer: The tokenizer the corpus was made with (a name or path for
        `get_tokenizer`), or None. Megatron's files do not record it; with
        it, `data.eod_token_id` defaults to its end-of-document id and
        `xlstm-data batch` can show text.
      end_of_document: The id stored after every document (`--append-eod`),
        stripped on read; None when the documents were written without one.
      split: Megatron's `--split` string ("969,30,1"), or None for every
        document. Each corpus is split as Megatron splits it
        (`split_range`): its first documents are the train part.
      split_part: The part this source reads: "train", "valid" or "test".

    Raises:
      DataConfigError: On a bad argument, or no documents.
      DataReadError: If an `.idx` is damaged or the prefixes disagree in dtype.
    """

    def __init__(
        self,
        path: PathPattern,
        vocab_size: int | None = None,
        tokenizer: TokenizerSpec = None,
        end_of_document: int | None = None,
        split: str | None = None,
        split_part: str = "train",
    ) -> None:
        explicit_vocab = _check_vocab_size(vocab_size, "MegatronIndexedSource: vocab_size")
        bookends = split_bookends(split, split_part, "MegatronIndexedSource: split")
        self._prefixes = megatron_prefixes(path, "MegatronIndexedSource: path")
        self._tokenizer: Tokenizer | None = None if tokenizer is None else get_tokenizer(tokenizer)
        indexes = [_Index(prefix + ".idx") for prefix in self._prefixes]
        dtypes = {index.dtype for index in indexes}
        if len(dtypes) > 1:
            listed = ", ".join(f"{i.path}: {i.dtype.name}" for i in indexes[:4])
            raise DataReadError(
                f"MegatronIndexedSource: path={path!r}: the corpora store ids in different dtypes "
                f"({listed}); one source reads one dtype: give each its own dataset."
            )
        self._dtype = indexes[0].dtype
        self.vocab_size = self._resolve_vocab(explicit_vocab)
        end_of_document = check_end_of_document(
            end_of_document, "MegatronIndexedSource: end_of_document"
        )
        if end_of_document is not None and end_of_document >= self.vocab_size:
            raise DataConfigError(
                f"MegatronIndexedSource: end_of_document={end_of_document} is not an id in "
                f"[0, {self.vocab_size}); pass the end-of-document id stored after every "
                "document (Megatron's --append-eod), or None."
            )
        self.end_of_document = end_of_document
        #: Each corpus's documents `[begin, end)` this source reads (its split part).
        self._ranges = [split_range(bookends, i.documents) for i in indexes]
        self._indexes: list[_Index | None] = list(indexes)
        self._lengths: np.ndarray | None = self._read_lengths()
        self._documents = len(self._lengths)
        documents = np.array([end - begin for begin, end in self._ranges], dtype=np.int64)
        if not self._lengths.size:
            raise DataConfigError(
                f"MegatronIndexedSource: path={path!r} holds no documents"
                + (f" in the {split_part!r} part of split={split!r}" if split else "")
                + "; point it at a non-empty corpus, or give that part a larger share."
            )
        self._shards = TokenShards(
            ShardFiles(
                "MegatronIndexedSource",
                [p + ".bin" for p in self._prefixes],
                [p + ".idx" for p in self._prefixes],
                _REMEDY,
                [begin for begin, _ in self._ranges],
            ),
            documents,
            self._open,
            self.vocab_size,
            self._dtype,
        )
        if end_of_document is not None:
            self._check_sampled_ends()
        logging.info(
            "MegatronIndexedSource: %d documents in %d corpora (%s ...), %s ids, vocab_size=%d.",
            len(self._lengths),
            len(self._prefixes),
            self._prefixes[0],
            self._dtype.name,
            self.vocab_size,
        )

    def _resolve_vocab(self, explicit: int | None) -> int:
        if explicit is not None:
            return explicit
        if self._tokenizer is not None:
            return int(self._tokenizer.vocab_size)
        if dtype_bounds_ids(self._dtype):
            return 1 << (8 * self._dtype.itemsize)
        raise DataConfigError(
            f"MegatronIndexedSource: the corpus stores {self._dtype.name} ids, which bound no "
            "vocabulary; set vocab_size (or tokenizer) so every id read is checked."
        )

    def _open(self, k: int) -> MappedShard:
        """Maps shard `k`'s `.bin` and checks it holds what its `.idx` says."""
        index = self._index(k)
        path = self._prefixes[k] + ".bin"
        ids = index.bin_ids()
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
        except OSError as error:
            raise DataReadError(
                f"MegatronIndexedSource: {path}: cannot be read ({error})."
            ) from error
        if size != ids * self._dtype.itemsize:
            raise DataReadError(
                f"MegatronIndexedSource: {path}: {size} bytes, but {index.path} places "
                f"{ids} ids of {self._dtype.itemsize} bytes in it; the file is truncated or from "
                f"another corpus: {_REMEDY}."
            )
        if isinstance(mapped, mmap.mmap):
            _advise(mapped, "MADV_RANDOM")  # documents are read in shuffled order
        index.check_back_to_back()
        tokens = np.frombuffer(mapped, dtype=self._dtype, count=ids)
        # The part's lengths as `lengths()` holds them (stored ends left out), a view.
        first = sum(end - begin for begin, end in self._ranges[:k])
        lengths = self.lengths()[first : first + self._ranges[k][1] - self._ranges[k][0]]
        offset = self._ranges[k][0]  # the split part's first document in the corpus
        if self.end_of_document is None:
            return MappedShard(tokens, lambda local: index.spans(local + offset, lengths[local]))

        eod = self.end_of_document

        def spans(local: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            documents = local + offset
            read = lengths[local]
            begin, end = index.spans(documents, read)
            # An empty document stores no end. Only a document read as empty looks at
            # the .idx's own length (1 with its stored end): the .idx is touched once a
            # document, not twice (424 MB of it resident at 10^8 documents, first batch).
            stored = read > 0
            empty = np.flatnonzero(~stored)
            stored[empty] = index.stored_lengths(documents[empty]) > 0
            ends = end[stored]
            if len(ends) and (int(ends.max()) >= len(tokens) or (tokens[ends] != eod).any()):
                self._refuse_stored_ends(k, tokens, documents[stored], ends, "the {} read together")
            return begin, end

        return MappedShard(tokens, spans)

    def _refuse_stored_ends(
        self, k: int, tokens: np.ndarray, local: np.ndarray, ends: np.ndarray, looked_at: str
    ) -> None:
        """Refuses non-empty documents `local` of corpus `k` unless `end_of_document` ends each.

        The one check of a stored end, and its one message, whether a read
        finds it or the first documents looked at when the source is built.
        `ends` are where each document's end is stored; `looked_at` names the
        documents, `{}` standing for their count ("the {} read together").
        """
        eod = self.end_of_document
        inside = ends < len(tokens)
        found = tokens[np.minimum(ends, len(tokens) - 1)] if len(tokens) else np.zeros_like(ends)
        wrong = ~inside | (found != eod)
        if not wrong.any():
            return
        bad = int(np.flatnonzero(wrong)[0])
        if inside[bad]:
            what = f"ends with id {int(found[bad])}, not end_of_document={eod}"
        else:
            what = f"runs past the end of the file, where end_of_document={eod} should follow it"
        count = len(ends)
        among = looked_at.format(f"{count} non-empty document{'s' * (count != 1)}")
        raise DataReadError(
            f"MegatronIndexedSource: {self._prefixes[k]}.bin: document {int(local[bad])} {what} "
            f"(of {among}, {int((~wrong).sum())} end with it); a corpus written without "
            "--append-eod is read with end_of_document=None (its own dataset when others have "
            "the id)."
        )

    # What the pipeline asks ------------------------------------------------------

    @property
    def tokenizer(self) -> Tokenizer | None:
        return self._tokenizer

    @property
    def files(self) -> list[str]:
        """Every file read: each prefix's `.bin`, then its `.idx`."""
        return [p + suffix for p in self._prefixes for suffix in (".bin", ".idx")]

    @property
    def token_dtype(self) -> np.dtype:
        """The dtype ids are stored (and `read_many` returns them) in."""
        return self._dtype

    def check_files(self) -> None:
        """Maps every `.bin` now and checks its size against its `.idx`, reading no id."""
        self._shards.open_all()

    def __len__(self) -> int:
        return self._documents

    def lengths(self) -> np.ndarray:
        """Every document's token count from the `.idx` (a stored end-of-document not counted)."""
        if self._lengths is None:  # a copy sent to a worker: read from the .idx again
            self._lengths = self._read_lengths()
        return self._lengths

    def _read_lengths(self) -> np.ndarray:
        """The lengths of every corpus's split part, one after the other, stored ends left out.

        One corpus of one sequence a document, read without `end_of_document`,
        gives its `.idx` lengths as mapped. Anything else is a new array,
        kept in the lengths cache (`lengths_cache`, keyed by each `.idx`'s
        path, size, mtime, inode and change time, and checked on a hit by
        `_agrees`): each grain worker reads the source's lengths again, and
        without the cache made its own copy (400 MB a worker at 10^8
        documents); with it, every process maps the one file.
        """
        if len(self._ranges) == 1 and self.end_of_document is None:
            index = self._index(0)
            if index._bounds is None:  # one sequence a document
                begin, end = self._ranges[0]
                return index.sequence_lengths[begin:end]
        parts = {
            "source": "MegatronIndexedSource",
            # An .idx's size follows from its counts alone: a rewrite with other lengths
            # and its old mtime (`cp -p`) is told apart by its inode and change time.
            "indexes": [_identity(p + ".idx") for p in self._prefixes],
            "ranges": [list(r) for r in self._ranges],
            "stored_ends_left_out": self.end_of_document is not None,
        }
        return cached_lengths(
            parts,
            sum(end - begin for begin, end in self._ranges),
            self._computed_lengths,
            f"MegatronIndexedSource({self._prefixes[0]}{', ...' * (len(self._prefixes) > 1)})",
            dtype=np.int32,
            check=self._agrees,
        )

    def _agrees(self, lengths: np.ndarray) -> bool:
        """Whether cached `lengths` hold each corpus's first and last documents' as its `.idx`."""
        at = 0
        for k, (begin, end) in enumerate(self._ranges):
            index = self._index(k)
            local = np.unique(
                np.r_[np.arange(begin, min(end, begin + 8)), np.arange(max(begin, end - 8), end)]
            )
            expected = index.stored_lengths(local)
            if self.end_of_document is not None:
                expected = _less_stored_ends(expected)
            if not np.array_equal(lengths[at + local - begin], expected):
                return False
            at += end - begin
        return True

    def _computed_lengths(self) -> np.ndarray:
        """`_read_lengths` from the `.idx` files themselves."""
        if self.end_of_document is None:
            parts = [self._index(k).lengths[b:e] for k, (b, e) in enumerate(self._ranges)]
        else:  # less a stored end, which an empty document does not have
            parts = [
                self._index(k).lengths_less_stored_ends(b, e)
                for k, (b, e) in enumerate(self._ranges)
            ]
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def _index(self, k: int) -> _Index:
        """Shard `k`'s `.idx`, read again in a process the source was sent to."""
        index = self._indexes[k]
        if index is None:
            index = self._indexes[k] = _Index(self._prefixes[k] + ".idx")
        return index

    def __getstate__(self) -> dict[str, Any]:
        """Paths and counts only: a worker reads the `.idx` again (not 20 bytes a document)."""
        state = self.__dict__.copy()
        state["_lengths"] = None
        state["_indexes"] = [None] * len(self._prefixes)
        return state

    def last_ids(self) -> dict[str, np.ndarray]:
        """Per corpus (`.bin`), the last stored id of its first few non-empty documents.

        What `resolve_eod_token_id` looks at to refuse a run that would
        append a second end-of-document id to documents that hold one.
        """
        last = {}
        for k, local in self._sampled().items():
            tokens = self._shards.shard(k).tokens
            last[self._prefixes[k] + ".bin"] = tokens[self._stored_ends(k, local)].astype(np.int64)
        return last

    def _sampled(self) -> dict[int, np.ndarray]:
        """Each corpus's first non-empty documents: `SAMPLED_ENDS` in all, at least 4 each.

        Consecutive documents share pages: at a cold start, documents spread
        over a corpus were a disk read each. Every read checks a stored end
        again, so this early look needs no spread.
        """
        per_corpus = max(4, SAMPLED_ENDS // len(self._prefixes))
        sampled = {}
        for k, (begin, end) in enumerate(self._ranges):
            index = self._index(k)
            window = 4 * per_corpus  # widened only while too few are non-empty
            while True:
                looked = np.arange(begin, min(end, begin + window))
                found = np.flatnonzero(index.stored_lengths(looked) > 0)
                if len(found) >= per_corpus or window >= end - begin:
                    break
                window *= 64
            if len(found):
                sampled[k] = begin + found[:per_corpus]  # the corpus's own document numbers
        return sampled

    def _stored_ends(self, k: int, local: np.ndarray) -> np.ndarray:
        """Where documents `local` of corpus `k` store their last id (with their `.idx` lengths)."""
        index = self._index(k)
        _, end = index.spans(local, index.stored_lengths(local))
        return end - 1

    def _check_sampled_ends(self) -> None:
        """Refuses `end_of_document` at once when a corpus's first documents do not end with it."""
        for k, local in self._sampled().items():
            tokens = self._shards.shard(k).tokens
            ends = self._stored_ends(k, local)
            self._refuse_stored_ends(k, tokens, local, ends, "its first {}")

    def _read(self, index: int) -> np.ndarray:
        (tokens,) = self.read_many(np.array([index], dtype=np.int64))
        return np.array(tokens, dtype=np.int32)

    def read_many(self, indices: Sequence[SupportsIndex] | np.ndarray) -> list[np.ndarray]:
        """Several documents as zero-copy, read-only slices of the `.bin` maps.

        Ids are checked against `vocab_size` in one pass over all of them
        (skipped when the dtype bounds them), and a stored end-of-document id
        after each document.

        Raises:
          IndexError: If an index is out of range.
          DataReadError: Naming the file and document, if a file is damaged,
            an id is outside the vocabulary or a stored end-of-document id
            is missing.
        """
        return self._shards.read_many(indices)

    def __repr__(self) -> str:
        where = (
            repr(self._prefixes[0])
            if len(self._prefixes) == 1
            else (f"{len(self._prefixes)} prefixes {self._prefixes[0]!r}..{self._prefixes[-1]!r}")
        )
        return (
            f"MegatronIndexedSource({where}, documents={len(self)}, dtype={self._dtype.name}, "
            f"vocab_size={self.vocab_size}, end_of_document={self.end_of_document})"
        )
