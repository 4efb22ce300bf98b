"""Turns planned rows (pieces of documents) into the arrays of a host batch.

Each document of the batch is read once, all of one source's in one call
(zero-copy views for memory-mapped shards); the part of its example stream
the batch uses is built as in `chunking.document_to_examples` (`tokens +
[EOD]`, or `[EOD] + tokens + [EOD]` when inputs are shifted right), all
streams in one concatenation; then every field of every row is derived in one
pass: a repeat of a per-piece value over the pieces, which tile the batch,
and one gather from that buffer for inputs and for targets. No loop runs per
piece or per token.

The fields are written into one int32 block `[field, row, position]`: a
step leaves a worker process as one shared-memory segment instead of one per
field, and `fields_of` gives them back by name as views, without a copy.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from xlstm_data.batch import LLM_BATCH_FIELDS, SOURCE_ID_FIELD, SOURCE_ID_PADDING
from xlstm_data.plan.pieces import Pieces

#: Reads documents `documents` (int64 array) of plan source `source` as 1-D int32 tokens.
ReadDocuments = Callable[[int, np.ndarray], Sequence[np.ndarray]]

FIELDS = (*LLM_BATCH_FIELDS, SOURCE_ID_FIELD)
_FIELD = {name: index for index, name in enumerate(FIELDS)}
_DOCUMENT_BITS = 40


def _used_tokens(
    tokens: Sequence[np.ndarray], low: np.ndarray, high: np.ndarray, prefix: int, zeros: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The tokens of stream positions `[low, high)` of each document back to back, then `zeros`.

    A document's example stream is `[EOD] * prefix + tokens + [EOD]`. Only the
    tokens of the part the batch's pieces use (and the target one further on)
    are copied, so a long document of which a batch takes one row's worth
    costs one row's worth of copying, not its whole length; the EODs are not
    copied at all (`assemble_rows` writes them where the pieces have them).
    The documents may be views of any integer dtype (memory-mapped uint16
    ids); the result is int32.

    One `np.concatenate` of the documents builds the buffer, and only a
    document the pieces use part of is sliced in Python. The loop over every
    document this replaced (appending its part and its EODs) cost 2.4 us per
    document, a sixth of a host step of 8 x 1024 rows (bench/peers corpus).

    Returns:
      The int32 buffer; each document's token count; and the buffer index of
      stream position `prefix` of each document (its first token, were every
      token copied).
    """
    length = np.fromiter(map(len, tokens), dtype=np.int64, count=len(tokens))
    first = np.minimum(np.maximum(low - prefix, 0), length)
    last = np.maximum(np.minimum(high - prefix, length), first)
    documents = list(tokens)
    for u in np.flatnonzero((first > 0) | (last < length)).tolist():
        documents[u] = documents[u][int(first[u]) : int(last[u])]
    documents.append(np.zeros(zeros, dtype=np.int32))
    used = last - first
    token_zero = np.cumsum(used) - used - first
    return np.concatenate(documents, dtype=np.int32, casting="same_kind"), length, token_zero


def assemble_rows(
    pieces: Pieces,
    read_documents: ReadDocuments,
    row_length: int,
    *,
    shift: bool,
    shift_target: bool,
    eod_token_id: int,
    empty: Callable[[tuple[int, ...], type], np.ndarray] | None = None,
) -> np.ndarray:
    """The `LLMBatch` fields of the planned rows, and `source_ids`: int32 `[FIELDS, rows, L]`.

    Every row is its pieces followed by one padding piece (possibly empty), so
    the pieces of all rows tile the batch in order: each field is then one
    `np.repeat` of a per-piece value (plus an `arange` for positions and the
    gather index) written straight into the block, with no scatter, no
    per-token mask and no pass over the padding beyond writing it.

    Args:
      pieces: The rows to fill.
      read_documents: Reads a source's documents (one call per source); each
        must be as long as the plan was told (`PlannedBatchDataset` checks it
        on every read). Any integer dtype; views are not written to.
      row_length: L.
      shift: Targets are the inputs shifted by one.
      shift_target: Shift targets left (else inputs right, EOD as BOS).
      eod_token_id: Appended to every document.

    Returns:
      The fields in `FIELDS` order (`fields_of` names them): zero-filled
      (segmentation 0) where a row has no tokens, and `source_ids` holds each
      token's plan source, `SOURCE_ID_PADDING` on padding.
    """
    rows = pieces.rows
    size = rows * row_length
    block = (empty or aligned_empty)((len(FIELDS), rows, row_length), np.int32)
    flat_block = block.reshape(len(FIELDS), size)
    if len(pieces.source) == 0:
        block.fill(0)
        flat_block[_FIELD[SOURCE_ID_FIELD]] = SOURCE_ID_PADDING
        return block
    # Every entry of `block` is written below.
    keys = pieces.source.astype(np.int64) << _DOCUMENT_BITS | pieces.document
    unique, which = np.unique(keys, return_inverse=True)
    unique_source = unique >> _DOCUMENT_BITS
    unique_document = unique & ((1 << _DOCUMENT_BITS) - 1)
    # `unique` is sorted, so each source's documents are one run.
    runs = np.flatnonzero(np.diff(unique_source)) + 1
    tokens: list[np.ndarray] = []
    for lo, hi in zip([0, *runs.tolist()], [*runs.tolist(), len(unique)], strict=True):
        tokens.extend(read_documents(int(unique_source[lo]), unique_document[lo:hi]))
    # The stream positions the pieces use; targets read one further on.
    low = np.full(len(unique), np.iinfo(np.int64).max, dtype=np.int64)
    high = np.zeros(len(unique), dtype=np.int64)
    np.minimum.at(low, which, pieces.start)
    np.maximum.at(high, which, pieces.stop + int(shift))
    prefix = int(shift and not shift_target)
    # Padding gathers from a run of zeros (inputs, and targets one further on).
    flat, length, token_zero = _used_tokens(tokens, low, high, prefix, row_length + 1)
    zeros_at = len(flat) - row_length - 1

    # Each row's pieces, then its padding piece: together they tile the batch.
    lengths = pieces.stop - pieces.start
    row_of_piece = pieces.row_of_piece()
    first_piece_of_row = pieces.row_offsets[:-1]
    filled = pieces.row_tokens()
    order = np.arange(len(lengths)) + row_of_piece  # a real piece's place among all
    pads = pieces.row_offsets[1:] + np.arange(rows)  # each row's padding piece's place
    count = len(lengths) + rows
    tile = np.empty(count, dtype=np.int64)
    tile[order] = lengths
    tile[pads] = row_length - filled
    begin = np.cumsum(tile) - tile  # of each piece in the batch
    segment = np.zeros(count, dtype=np.int32)
    segment[order] = np.arange(len(lengths)) - first_piece_of_row[row_of_piece] + 1
    source = np.full(count, SOURCE_ID_PADDING, dtype=np.int32)
    source[order] = pieces.source
    # Buffer index of each piece's first input, less its place in the batch.
    gather_shift = np.empty(count, dtype=np.int64)
    gather_shift[order] = token_zero[which] + pieces.start - prefix
    gather_shift[pads] = zeros_at
    gather_shift -= begin

    flat_block[_FIELD["inputs_segmentation"]] = np.repeat(segment, tile)
    flat_block[_FIELD["targets_segmentation"]] = flat_block[_FIELD["inputs_segmentation"]]
    position = flat_block[_FIELD["inputs_position"]]
    np.subtract(_arange(size), np.repeat(begin, tile), out=position, casting="same_kind")
    for r in np.flatnonzero(filled < row_length).tolist():  # padding has position 0
        position[r * row_length + int(filled[r]) : (r + 1) * row_length] = 0
    flat_block[_FIELD["targets_position"]] = position
    flat_block[_FIELD[SOURCE_ID_FIELD]] = np.repeat(source, tile)
    gather = _arange(size) + np.repeat(gather_shift, tile)
    # An EOD's gather index points at a neighbour's token (or out of range:
    # clipped); `_write_eods` then puts the EOD there.
    piece_begin, piece_length = begin[order], length[which]
    inputs = flat_block[_FIELD["inputs"]]
    np.take(flat, gather, out=inputs, mode="clip")
    _write_eods(inputs, pieces, piece_length, piece_begin, prefix, 0, eod_token_id)
    if shift:
        gather += 1
        targets = flat_block[_FIELD["targets"]]
        np.take(flat, gather, out=targets, mode="clip")
        _write_eods(targets, pieces, piece_length, piece_begin, prefix, 1, eod_token_id)
    else:
        flat_block[_FIELD["targets"]] = inputs
    return block


def _write_eods(
    field: np.ndarray,
    pieces: Pieces,
    length: np.ndarray,
    begin: np.ndarray,
    prefix: int,
    offset: int,
    eod_token_id: int,
) -> None:
    """Writes EOD where a piece's stream has it: after the tokens, and before them (`prefix`).

    Position j of a piece reads stream position `start + j + offset`, so each
    piece holds at most one leading and one trailing EOD: two scatters over
    the pieces instead of a copy of each EOD into the token buffer.

    Args:
      field: The flat `[rows * L]` inputs or targets.
      length: Each piece's document's token count.
      begin: Each piece's first position in `field`.
      offset: 1 for targets read one further on, else 0.
    """
    size = pieces.stop - pieces.start
    trailing = prefix + length - pieces.start - offset  # j of stream position prefix + n
    at = np.flatnonzero((trailing >= 0) & (trailing < size))
    field[begin[at] + trailing[at]] = eod_token_id
    if prefix and offset == 0:  # stream position 0 is an EOD (j = -start)
        field[begin[pieces.start == 0]] = eod_token_id


#: Bytes a host buffer's start must be a multiple of for XLA's CPU client to
#: use it in place: a step's block of 8 x 1024 rows went into the compiled
#: pick in 0.04-0.05 ms aligned, against ~0.1 ms copied when not (numpy's
#: own allocations are 16-byte aligned).
ALIGNMENT = 64


def aligned_empty(shape: tuple[int, ...], dtype: np.dtype | type) -> np.ndarray:
    """An uninitialised C-contiguous array whose data starts on an `ALIGNMENT` boundary."""
    dtype = np.dtype(dtype)
    size = math.prod(shape) * dtype.itemsize
    raw = np.empty(size + ALIGNMENT, dtype=np.uint8)
    offset = -raw.ctypes.data % ALIGNMENT
    return raw[offset : offset + size].view(dtype).reshape(shape)


def aligned_copy(array: np.ndarray) -> np.ndarray:
    """`array` copied into an `aligned_empty` array of its shape and dtype."""
    copy = aligned_empty(array.shape, array.dtype)
    np.copyto(copy, array)
    return copy


_ARANGES: dict[int, np.ndarray] = {}


def _arange(size: int) -> np.ndarray:
    """`np.arange(size)` (int64), kept per size: a batch shape repeats every step."""
    values = _ARANGES.get(size)
    if values is None:
        values = np.arange(size, dtype=np.int64)
        values.flags.writeable = False
        if len(_ARANGES) < 16:
            _ARANGES[size] = values
    return values


def fields_of(block: np.ndarray) -> dict[str, np.ndarray]:
    """The named fields of an `assemble_rows` block (views, no copy)."""
    return dict(zip(FIELDS, block, strict=True))
