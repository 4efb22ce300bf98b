"""Turns planned rows (pieces of documents) into the arrays of a host batch.

Each document of the batch is read once, all of one source's in one call;
its example stream is built as in `chunking.document_to_examples`
(`tokens + [EOD]`, or `[EOD] + tokens + [EOD]` when inputs are shifted right),
all streams in one concatenation; then every field of every row is filled by
one gather from that buffer, with index arithmetic over the whole batch
(placement, segment ids, positions) and no loop per piece or per token.

The fields are written into one int32 block `[field, row, position]`: a
step leaves a worker process as one shared-memory segment instead of one per
field, and `fields_of` gives them back by name as views, without a copy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from xlstm_data.batch import LLM_BATCH_FIELDS, SOURCE_ID_FIELD, SOURCE_ID_PADDING
from xlstm_data.plan.pieces import Pieces

#: Reads documents `documents` (int64 array) of plan source `source` as 1-D int32 tokens.
ReadDocuments = Callable[[int, np.ndarray], Sequence[np.ndarray]]

FIELDS = (*LLM_BATCH_FIELDS, SOURCE_ID_FIELD)
_FIELD = {name: index for index, name in enumerate(FIELDS)}
_DOCUMENT_BITS = 40


def _example_streams(
    tokens: Sequence[np.ndarray], shift: bool, shift_target: bool, eod_token_id: int, pad: int
) -> tuple[np.ndarray, np.ndarray]:
    """All documents' example streams back to back, then `pad` zeros; and each stream's size."""
    eod = np.array([eod_token_id], dtype=np.int32)
    if shift and not shift_target:
        parts = [part for document in tokens for part in (eod, document, eod)]
        extra = 2
    else:
        parts = [part for document in tokens for part in (document, eod)]
        extra = 1
    parts.append(np.zeros(pad, dtype=np.int32))
    sizes = np.fromiter((len(d) for d in tokens), dtype=np.int64, count=len(tokens)) + extra
    return np.concatenate(parts), sizes


def assemble_rows(
    pieces: Pieces,
    read_documents: ReadDocuments,
    row_length: int,
    *,
    shift: bool,
    shift_target: bool,
    eod_token_id: int,
) -> np.ndarray:
    """The `LLMBatch` fields of the planned rows, and `source_ids`: int32 `[FIELDS, rows, L]`.

    Args:
      pieces: The rows to fill.
      read_documents: Reads a source's documents (one call per source); each
        must be as long as the plan was told (`PlannedBatchDataset` checks it
        on every read).
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
    block = np.zeros((len(FIELDS), size), dtype=np.int32)
    block[_FIELD[SOURCE_ID_FIELD]] = SOURCE_ID_PADDING
    if len(pieces.source) == 0:
        return block.reshape(len(FIELDS), rows, row_length)
    keys = pieces.source.astype(np.int64) << _DOCUMENT_BITS | pieces.document
    unique, which = np.unique(keys, return_inverse=True)
    unique_source = unique >> _DOCUMENT_BITS
    unique_document = unique & ((1 << _DOCUMENT_BITS) - 1)
    # `unique` is sorted, so each source's documents are one run.
    runs = np.flatnonzero(np.diff(unique_source)) + 1
    tokens: list[np.ndarray] = []
    for lo, hi in zip([0, *runs.tolist()], [*runs.tolist(), len(unique)], strict=True):
        tokens.extend(read_documents(int(unique_source[lo]), unique_document[lo:hi]))
    # Padding reads two zeros at the end (inputs, and targets one further on).
    flat, sizes = _example_streams(tokens, shift, shift_target, eod_token_id, 2)
    pad = len(flat) - 2
    stream_offset = np.cumsum(sizes) - sizes
    lengths = pieces.stop - pieces.start
    row_of_piece = pieces.row_of_piece()
    first_piece_of_row = pieces.row_offsets[:-1][row_of_piece]
    ends = np.cumsum(lengths)
    begins = ends - lengths  # of each piece among all the batch's tokens
    destination_start = row_of_piece * row_length + begins - begins[first_piece_of_row]
    token = np.arange(int(ends[-1]), dtype=np.int64)
    destination = token + np.repeat(destination_start - begins, lengths)
    gather = np.full(size, pad, dtype=np.int64)
    gather[destination] = token + np.repeat(stream_offset[which] + pieces.start - begins, lengths)
    segment = block[_FIELD["inputs_segmentation"]]
    segment[destination] = np.repeat(
        (np.arange(len(lengths)) - first_piece_of_row + 1).astype(np.int32), lengths
    )
    block[_FIELD["targets_segmentation"]] = segment
    position = block[_FIELD["inputs_position"]]
    position[destination] = token - np.repeat(begins, lengths)
    block[_FIELD["targets_position"]] = position
    block[_FIELD[SOURCE_ID_FIELD]][destination] = np.repeat(pieces.source.astype(np.int32), lengths)
    np.take(flat, gather, out=block[_FIELD["inputs"]], mode="clip")  # in range: no buffer
    if shift:
        gather += 1
        np.take(flat, gather, out=block[_FIELD["targets"]], mode="clip")
    else:
        block[_FIELD["targets"]] = block[_FIELD["inputs"]]
    return block.reshape(len(FIELDS), rows, row_length)


def fields_of(block: np.ndarray) -> dict[str, np.ndarray]:
    """The named fields of an `assemble_rows` block (views, no copy)."""
    return dict(zip(FIELDS, block, strict=True))
