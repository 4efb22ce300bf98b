"""Batching in grain worker processes keeps the ramp-up exact and loses no row."""

from __future__ import annotations

import grain
import jax
import numpy as np
import pytest

import xlstm_data as xd
from tests.helpers import assert_batches_equal, to_numpy, unique_token_docs
from xlstm_data.multihost.workers import batch_in_workers, join_batches, micro_batch_size

RAMPUP = {0: 0.5, 3: 0.75, 6: 1.0}  # host batches 4, 6, 8: micro-batches of 2


@pytest.fixture(scope="module")
def mesh():
    return xd.create_mesh(devices=jax.devices()[:2])  # batches of 6 must divide over it


def _iterator(mesh, num_epochs=None, shuffle=False, worker_count=2):
    docs = unique_token_docs([3] * 20)  # one document per row, first tokens 10, 13, 16, ...
    return xd.make_grain_llm_iterator(
        None, None, mesh, docs, 8, 8, shuffle, 3, num_epochs=num_epochs,
        worker_count=worker_count, batch_rampup_factors=RAMPUP, drop_remainder=False,
    )  # fmt: skip


def _documents_of(batch) -> list[int]:
    """Index of the document in each row (-1 for a padding row)."""
    inputs = to_numpy(batch)["inputs"]
    return [int((row[0] - 10) // 3) if row.any() else -1 for row in inputs]


def test_micro_batch_size_divides_every_stage():
    assert micro_batch_size([4, 6, 8]) == 2
    assert micro_batch_size([16]) == 16
    assert micro_batch_size([3, 4]) == 1


def test_join_pads_ragged_parts_with_each_fields_padding():
    parts = [
        {"inputs": np.full((2, 3), 7), "inputs_segmentation": np.ones((2, 3), int)},
        {"inputs": np.full((2, 5), 8), "inputs_segmentation": np.ones((2, 5), int)},
    ]
    joined = join_batches(parts, pad_value=-1)
    assert joined["inputs"].shape == (4, 5)
    np.testing.assert_array_equal(joined["inputs"][0], [7, 7, 7, -1, -1])
    np.testing.assert_array_equal(joined["inputs_segmentation"][1], [1, 1, 1, 0, 0])
    np.testing.assert_array_equal(joined["inputs"][3], [8] * 5)


def test_workers_send_micro_batches_in_turn_and_the_step_sets_the_size(mesh):
    iterator = _iterator(mesh)
    assert "JoinedBatchIterDataset" in str(type(iterator.dataloader))
    batches = [next(iterator) for _ in range(8)]
    iterator.close()
    assert [to_numpy(b)["inputs"].shape[0] for b in batches] == [4, 4, 4, 6, 6, 6, 8, 8]
    order = [d for b in batches for d in _documents_of(b)]
    # Worker 0 reads documents 0, 2, 4, ..., worker 1 reads 1, 3, 5, ...; they
    # take turns, two rows at a time, and the stream repeats after 20.
    expected = []
    for start in range(0, 48, 4):
        expected += [(start + k) % 20 for k in (0, 2, 1, 3)]
    assert len(order) == 3 * 4 + 3 * 6 + 2 * 8
    assert order == expected[: len(order)]


def test_restore_inside_and_across_the_rampup_with_workers(mesh):
    reference = _iterator(mesh, shuffle=True)
    states, batches = [], []
    for _ in range(8):
        states.append(reference.get_state())
        batches.append(to_numpy(next(reference)))
    reference.close()
    restored = _iterator(mesh, shuffle=True)
    for step in (5, 2, 3):
        restored.set_state(states[step])
        for later in range(step, step + 3):
            assert_batches_equal(next(restored), batches[later])
    restored.close()


def test_a_finite_stream_with_workers_keeps_every_document_once(mesh):
    iterator = _iterator(mesh, num_epochs=1, shuffle=True)
    batches = list(iterator)
    sizes = [to_numpy(b)["inputs"].shape[0] for b in batches]
    assert sizes == [4, 4, 4, 6, 6]  # 20 rows; the last batch holds 2 and 4 padding rows
    seen = [d for b in batches for d in _documents_of(b) if d >= 0]
    assert sorted(seen) == list(range(20))


def test_batch_in_workers_refuses_a_finite_stream():
    rows = grain.MapDataset.range(4).map(lambda i: {"x": np.array([i])}).to_iter_dataset()
    with pytest.raises(xd.DataConfigError, match="repeats forever"):
        batch_in_workers(
            rows, lambda step: 2, [2], grain.MultiprocessingOptions(2), drop_remainder=True
        )


def test_extra_row_fields_cross_the_workers(mesh):
    row = {
        "inputs": np.arange(8, dtype=np.int32),
        "targets": np.arange(1, 9, dtype=np.int32),
        **{f: np.ones(8, np.int32) for f in ("inputs_segmentation", "targets_segmentation")},
        **{f: np.arange(8, dtype=np.int32) for f in ("inputs_position", "targets_position")},
        "loss_weights": np.linspace(0, 1, 8, dtype=np.float32),
    }
    rows = grain.MapDataset.source([row] * 6).repeat(None).to_iter_dataset()
    iterator = xd.make_grain_multihost_iterator(
        rows, None, mesh, 4, worker_count=2, batch_class=dict, batch_rampup_factors={0: 0.5, 2: 1}
    )
    batches = [next(iterator) for _ in range(3)]
    iterator.close()
    assert [b["loss_weights"].shape for b in batches] == [(2, 8), (2, 8), (4, 8)]
    for batch in batches:
        weights = np.asarray(batch["loss_weights"])
        assert weights.dtype == np.float32
        np.testing.assert_array_equal(weights, np.broadcast_to(row["loss_weights"], weights.shape))
