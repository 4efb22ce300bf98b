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


def _used_streams(
    tokens: Sequence[np.ndarray],
    low: np.ndarray,
    high: np.ndarray,
    prefix: int,
    eod_token_id: int,
    zeros: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Positions `[low, high)` of each document's example stream back to back, then `zeros`.

    A document's example stream is `[EOD] * prefix + tokens + [EOD]`; only the
    part the batch's pieces use (and the target one further on) is copied, so
    a long document of which a batch takes one row's worth costs one row's
    worth of copying, not its whole length. The documents may be views of any
    integer dtype (memory-mapped uint16 ids); the result is int32.

    Returns:
      The int32 buffer, and the buffer index of each stream's position `low`.
    """
    eod = np.array([eod_token_id], dtype=np.int32)
    parts: list[np.ndarray] = []
    starts = np.empty(len(tokens), dtype=np.int64)
    filled = 0
    for u, (document, lo, hi) in enumerate(zip(tokens, low.tolist(), high.tolist(), strict=True)):
        starts[u] = filled
        n = len(document)
        if lo < prefix:
            parts.append(eod)
        first, last = max(lo - prefix, 0), min(hi - prefix, n)
        if last > first:
            parts.append(document[first:last])
        if hi > n + prefix:
            parts.append(eod)
        filled += hi - lo
    parts.append(np.zeros(zeros, dtype=np.int32))
    return np.concatenate(parts, dtype=np.int32, casting="same_kind"), starts


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
    flat, stream_start = _used_streams(tokens, low, high, prefix, eod_token_id, row_length + 1)
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
    gather_shift[order] = stream_start[which] + pieces.start - low[which]
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
    np.take(flat, gather, out=flat_block[_FIELD["inputs"]], mode="clip")  # in range: no buffer
    if shift:
        gather += 1
        np.take(flat, gather, out=flat_block[_FIELD["targets"]], mode="clip")
    else:
        flat_block[_FIELD["targets"]] = flat_block[_FIELD["inputs"]]
    return block


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
