"""Hypothesis tests of chunking, packing, padding and shifting over whole epochs."""

from __future__ import annotations

import collections

import grain
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers import unique_token_docs
from xlstm_data.streaming.chunking import document_to_examples
from xlstm_data.streaming.factories import make_grain_llm_dataset
from xlstm_data.streaming.packing import pack_examples

EOD = 1

pipeline_settings = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def _rows(lengths, max_len, packing, shift, shift_target, bins=3, shuffle=True):
    docs = unique_token_docs(lengths)
    ds = make_grain_llm_dataset(
        0,
        1,
        docs,
        global_batch_size=4,
        max_target_length=max_len,
        shuffle=shuffle,
        data_shuffle_seed=7,
        num_epochs=1,
        grain_packing=packing,
        grain_packing_bin_count=bins,
        shift=shift,
        shift_target=shift_target,
        eod_token_id=EOD,
    )
    return docs, list(ds)


def _real(row, field):
    return row[field][row[f"{field}_segmentation"] != 0].tolist()


@pipeline_settings
@given(
    lengths=st.lists(st.integers(0, 50), min_size=1, max_size=25),
    max_len=st.integers(2, 24),
    packing=st.booleans(),
    shift_mode=st.sampled_from(["left", "right", "none"]),
)
def test_no_token_lost_or_duplicated(lengths, max_len, packing, shift_mode):
    shift, shift_target = shift_mode != "none", shift_mode != "right"
    docs, rows = _rows(lengths, max_len, packing, shift, shift_target)
    tokens = [t for d in docs for t in d["tokens"].tolist()]
    n = len(docs)
    if shift_mode == "left":
        # A document's first token is never a target; its EOD is (an empty
        # document has nothing to predict).
        want_inputs = tokens
        want_targets = [
            t for d in docs if len(d["tokens"]) for t in d["tokens"].tolist()[1:] + [EOD]
        ]
    elif shift_mode == "right":
        want_inputs, want_targets = tokens + [EOD] * n, tokens + [EOD] * n
    else:
        want_inputs = want_targets = tokens + [EOD] * n
    got_inputs = [t for r in rows for t in _real(r, "inputs")]
    got_targets = [t for r in rows for t in _real(r, "targets")]
    assert collections.Counter(got_inputs) == collections.Counter(want_inputs)
    assert collections.Counter(got_targets) == collections.Counter(want_targets)
    for row in rows:
        for key, value in row.items():
            assert value.dtype == np.int32, key
            assert value.shape == (max_len,), key


@pipeline_settings
@given(
    lengths=st.lists(st.integers(0, 40), min_size=1, max_size=20),
    max_len=st.integers(2, 20),
    packing=st.booleans(),
    shift_target=st.booleans(),
)
def test_rows_are_consistent(lengths, max_len, packing, shift_target):
    _, rows = _rows(lengths, max_len, packing, True, shift_target)
    for row in rows:
        seg, pos = row["inputs_segmentation"], row["inputs_position"]
        np.testing.assert_array_equal(seg, row["targets_segmentation"])
        np.testing.assert_array_equal(pos, row["targets_position"])
        pad = seg == 0
        assert not row["inputs"][pad].any() and not row["targets"][pad].any()
        assert not pos[pad].any()
        real = np.flatnonzero(~pad)
        # Padding only at the end; segments numbered 1, 2, ... in order.
        assert real.tolist() == list(range(len(real)))
        segments = seg[real]
        assert segments[0] == 1 and np.all(np.diff(segments) >= 0)
        assert np.all(np.diff(segments) <= 1)
        for s in np.unique(segments):
            idx = real[segments == s]
            assert pos[idx].tolist() == list(range(len(idx)))
            inputs, targets = row["inputs"][idx], row["targets"][idx]
            # Within a document the targets are the inputs shifted left by one.
            np.testing.assert_array_equal(inputs[1:], targets[:-1])


@given(n=st.integers(0, 100), max_len=st.integers(2, 16), shift_mode=st.sampled_from([0, 1, 2]))
def test_document_split_never_truncates(n, max_len, shift_mode):
    tokens = np.arange(10, 10 + n, dtype=np.int32)
    shift, shift_target = shift_mode != 2, shift_mode != 1
    examples = document_to_examples(tokens, max_len, shift, shift_target, EOD)
    assert all(1 <= len(e["inputs"]) <= max_len for e in examples)
    joined = np.concatenate([e["inputs"] for e in examples]) if examples else np.array([])
    expected = {0: tokens, 1: np.concatenate([[EOD], tokens]), 2: np.concatenate([tokens, [EOD]])}
    np.testing.assert_array_equal(joined, expected[shift_mode])


def test_packing_fills_rows():
    lengths = np.random.default_rng(0).integers(1, 30, size=300)
    _, packed = _rows(lengths, 64, True, True, True, bins=16)
    _, padded = _rows(lengths, 64, False, True, True)
    fill = lambda rows: np.mean([(r["inputs_segmentation"] != 0).mean() for r in rows])  # noqa: E731
    assert len(packed) < len(padded) / 2
    assert fill(packed) > 0.9 > fill(padded)


def _documents_in(row) -> list[int]:
    """The first input token of each segment of a row, in row order."""
    seg = row["inputs_segmentation"]
    return [int(row["inputs"][seg == s][0]) for s in np.unique(seg[seg != 0])]


@pipeline_settings
@given(
    lengths=st.lists(st.integers(1, 30), min_size=1, max_size=25),
    max_len=st.integers(2, 16),
    bins=st.integers(1, 5),
)
def test_unshuffled_packing_keeps_first_fit_order(lengths, max_len, bins):
    docs, rows = _rows(lengths, max_len, True, True, True, bins=bins, shuffle=False)
    doc_of = {int(t): i for i, d in enumerate(docs) for t in d["tokens"]}
    per_row = [[doc_of[t] for t in _documents_in(row)] for row in rows]
    # First fit fills rows in order; unshuffled, they come out in that order:
    # every row's documents ascend, and each row starts no earlier than the last.
    for documents in per_row:
        assert documents == sorted(documents)
    firsts = [documents[0] for documents in per_row]
    assert firsts == sorted(firsts)


def test_unshuffled_packing_gives_documents_in_source_order():
    # Equal documents fill the rows one after the other: exactly source order.
    docs, rows = _rows([3] * 40, 8, True, True, True, bins=16, shuffle=False)
    starts = [t for row in rows for t in _documents_in(row)]
    assert starts == [int(d["tokens"][0]) for d in docs]


def test_pack_examples_shuffles_rows_only_when_asked():
    examples = grain.MapDataset.source(
        [{"inputs": np.full(3, i, np.int32), "targets": np.full(3, i, np.int32)} for i in range(40)]
    ).to_iter_dataset()
    order = {
        shuffle: [d for row in pack_examples(examples, 8, 16, 0, shuffle=shuffle) for d in
                  _documents_in(row)]
        for shuffle in (False, True)
    }  # fmt: skip
    assert order[False] == list(range(40))
    assert sorted(order[True]) == list(range(40)) and order[True] != order[False]
