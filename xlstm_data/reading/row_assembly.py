"""Turns planned rows (pieces of documents) into the arrays of a host batch.

Each document of the batch is read once; its example stream is built as in
`chunking.document_to_examples` (`tokens + [EOD]`, or `[EOD] + tokens + [EOD]`
when inputs are shifted right); then all fields of all rows are filled with a
handful of whole-batch numpy operations (index arithmetic for placement,
segment ids and positions), not a loop per token.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent import futures

import numpy as np

from xlstm_data.batch import LLM_BATCH_FIELDS
from xlstm_data.plan.pieces import Pieces, _ranges

#: Reads document `document` of plan source `source` as int32 tokens.
ReadDocument = Callable[[int, int], np.ndarray]

FIELDS = LLM_BATCH_FIELDS


def _example_stream(
    tokens: np.ndarray, shift: bool, shift_target: bool, eod_token_id: int
) -> np.ndarray:
    eod = np.array([eod_token_id], dtype=np.int32)
    tokens = np.asarray(tokens, dtype=np.int32).reshape(-1)
    if shift and not shift_target:
        return np.concatenate([eod, tokens, eod])
    return np.concatenate([tokens, eod])


def assemble_rows(
    pieces: Pieces,
    read_document: ReadDocument,
    row_length: int,
    *,
    shift: bool,
    shift_target: bool,
    eod_token_id: int,
    executor: futures.Executor | None = None,
) -> dict[str, np.ndarray]:
    """The `LLMBatch` fields of the planned rows, int32 `[rows, row_length]`.

    Args:
      pieces: The rows to fill.
      read_document: Reads one document's tokens.
      row_length: L.
      shift: Targets are the inputs shifted by one.
      shift_target: Shift targets left (else inputs right, EOD as BOS).
      eod_token_id: Appended to every document.
      executor: Reads documents in parallel when given.

    Returns:
      Zero-filled (segmentation 0) where a row has no tokens.
    """
    rows = pieces.rows
    out = {name: np.zeros((rows, row_length), dtype=np.int32) for name in FIELDS}
    if len(pieces.source) == 0:
        return out
    keys = pieces.source.astype(np.int64) << 40 | pieces.document
    unique, which = np.unique(keys, return_inverse=True)
    wanted = [(int(k >> 40), int(k & ((1 << 40) - 1))) for k in unique]

    def read(item: tuple[int, int]) -> np.ndarray:
        return _example_stream(read_document(*item), shift, shift_target, eod_token_id)

    streams = list(executor.map(read, wanted)) if executor else [read(w) for w in wanted]
    sizes = np.fromiter((len(s) for s in streams), dtype=np.int64, count=len(streams))
    flat = np.concatenate(streams)
    stream_offset = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    lengths = pieces.stop - pieces.start
    if np.any(pieces.stop + (1 if shift else 0) > sizes[which]):
        raise ValueError(
            "a planned piece lies beyond its document's end: the document lengths the plan "
            "used do not match the documents read (stale lengths index or cache?)"
        )
    row_of_piece = pieces.row_of_piece()
    first_piece_of_row = pieces.row_offsets[:-1][row_of_piece]
    ends = np.cumsum(lengths)
    piece_col = ends - lengths - (ends - lengths)[first_piece_of_row]
    row = np.repeat(row_of_piece, lengths)
    position = _ranges(np.zeros(len(lengths), np.int64), lengths)
    col = np.repeat(piece_col, lengths) + position
    source_index = np.repeat(stream_offset[which] + pieces.start, lengths) + position
    segment = np.repeat(np.arange(len(lengths)) - first_piece_of_row + 1, lengths)
    out["inputs"][row, col] = flat[source_index]
    out["targets"][row, col] = flat[source_index + 1] if shift else flat[source_index]
    for prefix in ("inputs", "targets"):
        out[f"{prefix}_segmentation"][row, col] = segment
        out[f"{prefix}_position"][row, col] = position
    return out
