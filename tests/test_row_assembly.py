"""`assemble_rows` against the element-wise definition it replaced, on random rows.

`_reference_assemble_rows` is the previous implementation (a scatter into the
padded block from one concatenation of whole example streams), kept here as
the specification: the one-pass version must give the same block for any rows
of pieces, any shift mode, documents of any integer dtype, empty rows and
repeated documents.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xlstm_data.batch import SOURCE_ID_FIELD, SOURCE_ID_PADDING
from xlstm_data.plan.pieces import Pieces, example_tokens
from xlstm_data.reading.row_assembly import FIELDS, ReadDocuments, assemble_rows

_FIELD = {name: index for index, name in enumerate(FIELDS)}
_DOCUMENT_BITS = 40


def _reference_example_streams(
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


def _reference_assemble_rows(
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
    flat, sizes = _reference_example_streams(tokens, shift, shift_target, eod_token_id, 2)
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


MODES = [(True, True), (True, False), (False, True)]


@st.composite
def batches(draw):
    """Documents of two sources and rows of pieces of them (each row at most L tokens)."""
    shift, shift_target = draw(st.sampled_from(MODES))
    row_length = draw(st.integers(1, 24))
    dtypes = [np.int32, np.uint16, np.uint32]
    documents = [
        [
            np.arange(n, dtype=draw(st.sampled_from(dtypes))) + 3 + 100 * s
            for n in draw(st.lists(st.integers(0, 40), min_size=1, max_size=6))
        ]
        for s in range(2)
    ]
    rows = draw(st.integers(1, 5))
    offsets, source, document, start, stop = [0], [], [], [], []
    for _ in range(rows):
        room = row_length
        for _ in range(draw(st.integers(0, 4))):
            if room == 0:
                break
            s = draw(st.integers(0, 1))
            d = draw(st.integers(0, len(documents[s]) - 1))
            size = int(example_tokens(np.array([len(documents[s][d])]), shift, shift_target)[0])
            if size == 0:
                continue
            a = draw(st.integers(0, size - 1))
            b = draw(st.integers(a + 1, min(size, a + room)))
            source.append(s), document.append(d), start.append(a), stop.append(b)
            room -= b - a
        offsets.append(len(source))
    pieces = Pieces(
        np.array(offsets, dtype=np.int64),
        np.array(source, dtype=np.int32),
        np.array(document, dtype=np.int64),
        np.array(start, dtype=np.int64),
        np.array(stop, dtype=np.int64),
    )
    return documents, pieces, row_length, shift, shift_target


@settings(max_examples=300, deadline=None)
@given(batches(), st.integers(0, 2**31 - 1))
def test_assemble_rows_matches_the_reference(batch, eod):
    documents, pieces, row_length, shift, shift_target = batch

    def read(source: int, chosen: np.ndarray) -> Sequence[np.ndarray]:
        return [documents[source][d] for d in chosen.tolist()]

    def read_int32(source: int, chosen: np.ndarray) -> Sequence[np.ndarray]:
        return [documents[source][d].astype(np.int32) for d in chosen.tolist()]

    options = {"shift": shift, "shift_target": shift_target, "eod_token_id": eod}
    got = assemble_rows(pieces, read, row_length, **options)
    want = _reference_assemble_rows(pieces, read_int32, row_length, **options)
    assert got.dtype == np.int32 and got.shape == (len(FIELDS), pieces.rows, row_length)
    np.testing.assert_array_equal(got, want)
    # The counts take each row's tokens from its pieces: exactly what its loss mask sets.
    mask = got[_FIELD["targets_segmentation"]]
    np.testing.assert_array_equal(pieces.row_tokens(), np.count_nonzero(mask, axis=1))


@pytest.mark.parametrize(
    ("row_length", "host_rows", "rows", "steps"),
    [
        (1024, 8, 256, 32),  # bench/peers: 2^18 tokens
        (8192, 8, 32, 4),  # long rows keep the bytes
        (64, 8, 256, 32),  # short rows keep at most 256 rows
        (1024, 512, 256, 1),  # a host batch larger than a chunk: one step
    ],
)
def test_a_chunk_holds_2_18_tokens_of_rows_and_at_most_256_rows(row_length, host_rows, rows, steps):
    from xlstm_data import create_mesh, iterators_from_config
    from xlstm_data.reading.planned_batches import chunk_rows

    assert chunk_rows(row_length) == rows
    data = {
        "train": {  # documents enough for one step
            "a": {"kind": "synthetic", "num_documents": host_rows * row_length // 10}
        },
        "global_batch_size": host_rows,
        "max_target_length": row_length,
    }
    train, _ = iterators_from_config(data, create_mesh())
    try:
        assert train._per_chunk == steps  # noqa: SLF001
    finally:
        train.close()
