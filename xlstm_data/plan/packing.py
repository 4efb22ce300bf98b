"""Packing a block's documents into rows, planned on lengths alone.

Modes (`data.packing`):
- `best_fit` (default): documents of at most L example positions are placed
  whole; longer ones are cut into L-sized pieces (each a full row) plus a
  remainder. Pieces shorter than L are packed best-fit-decreasing. BFD leaves
  well under 1 % padding on realistic length mixes while never cutting a
  document that fits in a row.
- `first_fit`: the same pieces, each into the first row with room, in block
  order (the reference pipeline's packer, without its bounded bin count).
- `concat`: the block's documents concatenated and cut at row boundaries, as
  Megatron does; documents are cut anywhere, and segment ids still mark them.
  `source_rows` completes each block's last row from the documents after it,
  so every row is full but at the end of a finite run.
- `none`: one piece per row, padded.

No token is ever dropped: every example position of every document lands in
exactly one row.
"""

from __future__ import annotations

import bisect

import numpy as np

from xlstm_data.errors import DataConfigError
from xlstm_data.plan.pieces import Pieces, _ranges

MODES = ("best_fit", "first_fit", "concat", "none")
ALIASES = {True: "best_fit", False: "none"}


def packing_mode(value: object, key: str = "data.packing") -> str:
    """Normalises `data.packing` (True/False are aliases of best_fit/none)."""
    if isinstance(value, bool):
        return ALIASES[value]
    if isinstance(value, str) and value in MODES:
        return value
    raise DataConfigError(
        f"{key}={value!r} is invalid; expected one of {list(MODES)} (or True = 'best_fit', "
        "False = 'none')"
    )


def _chunks(
    sources: np.ndarray,
    documents: np.ndarray,
    sizes: np.ndarray,
    first: np.ndarray,
    row_length: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Cuts each document's positions `[first, size)` into pieces of at most `row_length`."""
    per_doc = -(-(sizes - first) // row_length)
    owner = np.repeat(np.arange(len(sizes)), per_doc)
    index_in_doc = _ranges(np.zeros(len(sizes), np.int64), per_doc)
    start = first[owner] + index_in_doc * row_length
    stop = np.minimum(start + row_length, sizes[owner])
    return sources[owner], documents[owner], start, stop


def _rows_from_assignment(
    row_of: np.ndarray, src: np.ndarray, doc: np.ndarray, start: np.ndarray, stop: np.ndarray
) -> Pieces:
    order = np.argsort(row_of, kind="stable")
    rows = int(row_of.max()) + 1 if len(row_of) else 0
    offsets = np.concatenate([[0], np.cumsum(np.bincount(row_of, minlength=rows))])
    return Pieces(offsets.astype(np.int64), src[order], doc[order], start[order], stop[order])


def _best_fit_decreasing(sizes: np.ndarray, row_length: int) -> np.ndarray:
    """Row index of each item (sizes <= row_length), BFD.

    Items over half a row come first in decreasing order and each opens a row
    (no open row has room for one), so they are placed with numpy; the rest go
    one by one into the open row with the least room that fits. Open rows are
    one sorted list of `room * scale + row` ints (the order of `(room, row)`:
    the lowest row on ties). Against a loop over every item with `(room,
    row)` tuples this takes a block of 2048 documents from 4.3 to 0.8 ms, and
    this loop is most of planning's CPU (cProfile, rows of 1024).
    """
    order = np.argsort(-sizes, kind="stable")
    scale = len(sizes) + 1  # rows < scale
    row_of = np.empty(len(sizes), dtype=np.int64)
    big = int(np.count_nonzero(sizes[order] * 2 > row_length))
    row_of[order[:big]] = np.arange(big)
    rooms = row_length - sizes[order[:big]]
    free = np.sort((rooms * scale + np.arange(big))[rooms > 0]).tolist()
    rows = big
    rest = order[big:]
    placed = []
    find, insert, take, keep = bisect.bisect_left, bisect.insort, free.pop, placed.append
    for size in sizes[rest].tolist():
        at = find(free, size * scale)
        if at < len(free):
            room, row = divmod(take(at), scale)
        else:
            room, row = row_length, rows
            rows += 1
        keep(row)
        if room > size:
            insert(free, (room - size) * scale + row)
    row_of[rest] = placed
    return row_of


def _first_fit(sizes: np.ndarray, row_length: int) -> np.ndarray:
    """Row index of each item, in order, into the first row with room.

    Only rows with room left are searched (`open_ids`, increasing, with their
    `open_room`): a full row never takes another item (items of size 0 go to
    row 0, the first row with room >= 0). An item larger than any open room
    (`most_room` bounds them: a room only shrinks once its row is open) opens
    a row without a search. Documents of many rows are mostly whole-row
    pieces, which then cost nothing. A block of 2048 lognormal documents
    (median 512 tokens) cut into 27,024 pieces for rows of 64 took 354 ms
    when every row was searched for every item, now 26 ms (rows of 1024: 21
    against 17 ms); bench/resume's first batch, three such blocks, went from
    5.2 to 0.1 s. Same rows as the textbook first fit (tests/test_plan.py).
    """
    row_of = np.empty(len(sizes), dtype=np.int64)
    open_ids = np.empty(max(len(sizes), 1), dtype=np.int64)
    open_room = np.empty(max(len(sizes), 1), dtype=np.int64)
    n_open = rows = 0
    most_room = -1
    for item, size in enumerate(sizes.tolist()):
        if size == 0 and rows:
            row_of[item] = 0
            continue
        fits = np.flatnonzero(open_room[:n_open] >= size) if size <= most_room else ()
        if len(fits):
            k = int(fits[0])
            row = int(open_ids[k])
            open_room[k] -= size
            if open_room[k] == 0:  # full: never searched again
                open_ids[k : n_open - 1] = open_ids[k + 1 : n_open]
                open_room[k : n_open - 1] = open_room[k + 1 : n_open]
                n_open -= 1
        else:
            row, rows = rows, rows + 1
            if size < row_length:
                open_ids[n_open], open_room[n_open] = row, row_length - size
                n_open += 1
                most_room = max(most_room, row_length - size)
        row_of[item] = row
    return row_of


def _concat(
    src: np.ndarray, doc: np.ndarray, sizes: np.ndarray, first: np.ndarray, row_length: int
) -> tuple[np.ndarray, ...]:
    """Pieces of the documents' `[first, size)` laid end to end, cut every `row_length`."""
    lengths = sizes - first
    doc_start = np.concatenate([[0], np.cumsum(lengths)[:-1]]) if len(lengths) else lengths
    total = int(lengths.sum())
    cuts = np.union1d(doc_start, np.arange(0, total, row_length))
    cuts = cuts[cuts < total]
    owner = np.searchsorted(doc_start, cuts, side="right") - 1
    # Documents of size 0 share a start with the next one; searchsorted picks the last.
    ends = np.concatenate([cuts[1:], [total]])
    start = cuts - doc_start[owner] + first[owner]
    stop = ends - doc_start[owner] + first[owner]
    row_of = cuts // row_length
    return row_of, src[owner], doc[owner], start, stop


def pack_block(
    sources: np.ndarray,
    documents: np.ndarray,
    sizes: np.ndarray,
    row_length: int,
    mode: str,
    rng: np.random.Generator | None,
    first: np.ndarray | None = None,
) -> Pieces:
    """Packs one block's documents (in block order) into rows.

    Args:
      sources: Source index of each document.
      documents: Document index of each.
      sizes: Example positions of each (`example_tokens`).
      row_length: L, positions per row.
      mode: One of `MODES`.
      rng: Shuffles the rows of best_fit/first_fit (BFD emits them by size);
        None keeps them in packing order.
      first: First position of each document to place (default 0): the rest
        of a document whose start ended the previous mixture stage.

    Returns:
      The block's rows.
    """
    sources = np.asarray(sources, dtype=np.int32)
    documents = np.asarray(documents, dtype=np.int64)
    sizes = np.asarray(sizes, dtype=np.int64)
    first = np.zeros_like(sizes) if first is None else np.asarray(first, dtype=np.int64)
    keep = sizes > first
    sources, documents, sizes, first = sources[keep], documents[keep], sizes[keep], first[keep]
    if mode == "concat":
        return _rows_from_assignment(*_concat(sources, documents, sizes, first, row_length))
    src, doc, start, stop = _chunks(sources, documents, sizes, first, row_length)
    lengths = stop - start
    if mode == "none":
        row_of = np.arange(len(lengths), dtype=np.int64)
    elif mode == "first_fit":
        row_of = _first_fit(lengths, row_length)
    else:
        full = lengths == row_length
        row_of = np.empty(len(lengths), dtype=np.int64)
        full_rows = int(full.sum())
        row_of[full] = np.arange(full_rows)
        row_of[~full] = full_rows + _best_fit_decreasing(lengths[~full], row_length)
    pieces = _rows_from_assignment(row_of, src, doc, start, stop)
    if rng is not None and mode in ("best_fit", "first_fit") and pieces.rows > 1:
        pieces = pieces.take_rows(rng.permutation(pieces.rows))
    return pieces
