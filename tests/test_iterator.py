"""Single-process behaviour of MultiHostDataLoadIterator and LLMBatch."""

from __future__ import annotations

import itertools
import json

import clu.data
import grain
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xlstm_data as xd
from tests.helpers import assert_batches_equal, to_numpy, unique_token_docs
from xlstm_data.batch import LLM_BATCH_FIELDS
from xlstm_data.streaming.batching import ScheduledBatchIterDataset


@pytest.fixture(scope="module")
def mesh():
    return xd.create_mesh()


def _eval_iterator(mesh, **kwargs):
    docs = unique_token_docs(range(1, 23))
    return xd.make_grain_llm_iterator(
        None, None, mesh, docs, 4, 8, False, 0, num_epochs=1, worker_count=0,
        drop_remainder=False, **kwargs,
    )  # fmt: skip


def test_global_batch_is_sharded_over_data_axes(mesh):
    iterator = _eval_iterator(mesh)
    batch = next(iterator)
    assert isinstance(batch, xd.LLMBatch)
    for name, value in batch.to_dict().items():
        assert isinstance(value, jax.Array), name
        assert value.shape == (4, 8) and value.dtype == jnp.int32
        assert value.sharding == xd.data_sharding(mesh)
        assert len(value.addressable_shards) == 4
    assert iterator.layout.host_count == 1


def test_epoch_pads_last_batch_and_stops(mesh):
    batches = [to_numpy(b) for b in _eval_iterator(mesh)]
    # 22 documents, the longest 22 tokens: 1 + 1 + ... chunks of 8.
    rows = sum(int((b["inputs_segmentation"].any(axis=1)).sum()) for b in batches)
    chunks = sum(-(-n // 8) for n in range(1, 23))
    assert rows == chunks
    assert len(batches) == -(-chunks // 4)
    last = batches[-1]
    empty = ~last["inputs_segmentation"].any(axis=1)
    assert empty.sum() == len(batches) * 4 - chunks
    assert not last["inputs"][empty].any()


def test_reset_after_epoch_repeats_the_same_pass(mesh):
    iterator = _eval_iterator(mesh, reset_after_epoch=True)
    first = [to_numpy(b) for b in iterator]
    second = [to_numpy(b) for b in iterator]
    assert len(first) == len(second) > 0
    for a, b in zip(first, second, strict=True):
        assert_batches_equal(a, b)


def test_every_for_loop_over_an_eval_iterator_is_one_full_pass(mesh):
    full = [to_numpy(b) for b in _eval_iterator(mesh)]
    iterator = _eval_iterator(mesh, reset_after_epoch=True)
    for _ in iterator:
        break  # a loop that stops early
    assert len(list(itertools.islice(iterator, 2))) == 2  # so does islice
    again = [to_numpy(b) for b in iterator]
    assert len(again) == len(full) > 2
    for a, b in zip(again, full, strict=True):
        assert_batches_equal(a, b)
    # Right after a restore, a loop continues from the restored position.
    next(iterator)
    state = iterator.get_state()
    fresh = _eval_iterator(mesh, reset_after_epoch=True)
    fresh.set_state(state)
    assert len([b for b in fresh]) == len(full) - 1
    # A train iterator (no reset_after_epoch) just goes on.
    train = _eval_iterator(mesh)
    for _ in train:
        break
    assert len(list(train)) == len(full) - 1


def test_extra_row_fields_reach_the_batch(mesh):
    rows = grain.MapDataset.source(
        [
            {
                "inputs": np.full(4, i, np.int32),
                "targets": np.full(4, i + 1, np.int32),
                "inputs_segmentation": np.ones(4, np.int32),
                "targets_segmentation": np.ones(4, np.int32),
                "inputs_position": np.arange(4, dtype=np.int32),
                "targets_position": np.arange(4, dtype=np.int32),
                "loss_weights": np.full(4, 0.5, np.float32),
            }
            for i in range(6)
        ]
    ).to_iter_dataset()
    seen = []

    class RecordingBatch(dict):
        @classmethod
        def from_dict(cls, data):
            seen.append(sorted(data))
            return cls(data)

    iterator = xd.make_grain_multihost_iterator(
        rows, None, mesh, 4, worker_count=0, batch_class=RecordingBatch, drop_remainder=False
    )
    batches = list(iterator)
    assert all(isinstance(b, RecordingBatch) for b in batches) and len(batches) == 2
    assert seen[0] == sorted(["loss_weights", *LLM_BATCH_FIELDS])
    weights = np.asarray(batches[1]["loss_weights"])
    assert weights.dtype == np.float32 and weights.shape == (4, 4)
    assert batches[1]["loss_weights"].sharding == xd.data_sharding(mesh)
    np.testing.assert_array_equal(weights[:2], 0.5)
    np.testing.assert_array_equal(weights[2:], 0.0)  # padding rows weigh nothing
    plain = xd.make_grain_multihost_iterator(rows, None, mesh, 4, worker_count=0, batch_class=dict)
    assert "loss_weights" in next(plain)


def test_iterator_length_stops_and_resets(mesh):
    rows = grain.MapDataset.source([{"x": np.full(3, i, np.int32)} for i in range(40)])
    loader = ScheduledBatchIterDataset(rows.to_iter_dataset(), 4)
    iterator = xd.MultiHostDataLoadIterator(loader, mesh, iterator_length=3, reset_after_epoch=True)
    first = [np.asarray(b["x"])[:, 0].tolist() for b in iterator]
    again = [np.asarray(b["x"])[:, 0].tolist() for b in iterator]
    assert first == again == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    no_reset = xd.MultiHostDataLoadIterator(loader, mesh, iterator_length=2)
    assert len(list(no_reset)) == 2 and list(no_reset) == []


def test_plain_iterable_dataloader_and_pad_shapes(mesh):
    def host_batches():
        for n in (3, 5):
            yield {"x": np.ones((4, n), np.int32)}

    class Loader:
        def __iter__(self):
            return host_batches()

    iterator = xd.MultiHostDataLoadIterator(Loader(), mesh, pad_shapes=True, pad_value=-1)
    shapes = [b["x"].shape for b in iterator]
    assert shapes == [(4, 3), (4, 5)]
    state = iterator.get_state()
    assert state["iterator"] is None and state["local_batches"] == 2


def test_plain_iterable_resumes_by_replaying(mesh):
    loader = [{"x": np.full((4, 2), i, np.int32)} for i in range(5)]
    iterator = xd.MultiHostDataLoadIterator(loader, mesh)
    next(iterator)
    next(iterator)
    state = iterator.get_state()
    fresh = xd.MultiHostDataLoadIterator(loader, mesh)
    fresh.set_state(state)
    assert [int(np.asarray(b["x"])[0, 0]) for b in fresh] == [2, 3, 4]


def test_prefetch_starts_on_demand_so_a_restore_wastes_no_batch(mesh):
    produced = []

    class CountingLoader:
        def __iter__(self):
            for i in range(6):
                produced.append(i)
                yield {"x": np.full((4, 2), i, np.int32)}

    iterator = xd.MultiHostDataLoadIterator(CountingLoader(), mesh, prefetch=2)
    assert produced == []  # nothing read at construction
    iterator.set_state({**iterator.get_state(), "step": 2, "local_batches": 2})
    assert produced == [0, 1]  # the replayed batches only, nothing prepared ahead
    iterator.start_prefetch()
    iterator.start_prefetch()  # idempotent
    assert int(np.asarray(next(iterator)["x"])[0, 0]) == 2
    assert produced[:3] == [0, 1, 2] and len(produced) <= 5


def test_clu_surface_save_restore_and_element_spec(mesh, tmp_path):
    iterator = _eval_iterator(mesh)
    assert isinstance(iterator, clu.data.DatasetIterator)
    spec = iterator.element_spec
    assert isinstance(spec, xd.LLMBatch)
    assert spec.inputs == clu.data.ArraySpec(dtype=np.int32, shape=(4, 8))
    next(iterator)
    iterator.save(tmp_path / "state.json")
    expected = to_numpy(iterator.get_next())
    fresh = _eval_iterator(mesh)
    fresh.restore(tmp_path / "state.json")
    assert_batches_equal(next(fresh), expected)


def test_restore_refuses_another_process_layout(mesh, tmp_path):
    iterator = _eval_iterator(mesh)
    state = iterator.get_state()
    with pytest.raises(
        xd.DataConfigError, match="process_count=2 but this run has process_count=1"
    ):
        iterator.set_state(dict(state, process_count=2))
    with pytest.raises(xd.DataConfigError, match="format_version=99"):
        iterator.set_state(dict(state, format_version=99))
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(xd.DataConfigError, match="bad.json"):
        iterator.restore(tmp_path / "bad.json")


def test_errors_in_the_pipeline_reach_the_caller(mesh):
    def broken():
        yield {"x": np.ones((4, 2), np.int32)}
        raise RuntimeError("disk on fire")

    class Loader:
        def __iter__(self):
            return broken()

    iterator = xd.MultiHostDataLoadIterator(Loader(), mesh)
    next(iterator)
    with pytest.raises(RuntimeError, match="disk on fire"):
        next(iterator)


def test_llm_batch_is_a_pytree():
    batch = xd.LLMBatch(*(jnp.full((2, 3), i, jnp.int32) for i in range(6)))
    doubled = jax.tree.map(lambda x: x * 2, batch)
    assert isinstance(doubled, xd.LLMBatch) and int(doubled.targets[0, 0]) == 2

    @jax.jit
    def masked_sum(b: xd.LLMBatch):
        return jnp.sum(jnp.where(b.targets_segmentation != 0, b.targets, 0))

    assert int(masked_sum(batch)) == 6
    with pytest.raises(dataclasses_frozen_error()):
        batch.inputs = None  # type: ignore[misc]
    assert batch.shape == (2, 3)
    assert json.dumps(sorted(batch.to_dict())) is not None


def dataclasses_frozen_error():
    import dataclasses

    return dataclasses.FrozenInstanceError
