"""Single-process behaviour of the data iterator and LLMBatch."""

from __future__ import annotations

import itertools
import json

import clu.data
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xlstm_data as xd
from tests.helpers import assert_batches_equal, to_numpy, unique_token_docs


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


def test_iterator_length_stops_and_resets(mesh):
    evaluation = _eval_iterator(mesh, reset_after_epoch=True)
    first = [to_numpy(b)["inputs"] for b in evaluation]
    again = [to_numpy(b)["inputs"] for b in evaluation]
    assert len(first) == evaluation.iterator_length > 1
    for x, y in zip(first, again, strict=True):
        np.testing.assert_array_equal(x, y)
    once = _eval_iterator(mesh)
    assert len(list(once)) == len(first) and list(once) == []


class _CountingDocuments:
    """Documents that record which were read."""

    def __init__(self, count):
        self.read = []
        self._docs = unique_token_docs(range(1, count + 1))

    def __len__(self):
        return len(self._docs)

    def __getitem__(self, index):
        self.read.append(index)
        return self._docs[index]


def test_prefetch_starts_on_demand_so_a_restore_wastes_no_batch(mesh):
    documents = _CountingDocuments(200)
    iterator = xd.make_grain_llm_iterator(
        None, None, mesh, documents, 4, 8, True, 0, worker_count=0, prefetch=2
    )
    state = None
    for _ in range(2):
        next(iterator)
        state = iterator.get_state()
    expected = to_numpy(next(iterator))
    iterator.close()
    documents.read.clear()
    fresh = xd.make_grain_llm_iterator(
        None, None, mesh, documents, 4, 8, True, 0, worker_count=0, prefetch=2
    )
    counted = len(documents.read)  # the lengths of every document, once
    fresh.set_state(state)
    assert len(documents.read) == counted  # no batch prepared ahead, none replayed
    fresh.start_prefetch()
    fresh.start_prefetch()  # idempotent
    assert_batches_equal(next(fresh), expected)
    fresh.close()


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


def test_restore_refuses_what_it_cannot_continue(mesh, tmp_path):
    iterator = _eval_iterator(mesh)
    state = iterator.get_state()
    with pytest.raises(xd.DataCheckpointError, match="plan state format 99"):
        iterator.set_state(dict(state, format_version=99))
    with pytest.raises(xd.DataCheckpointError, match="streaming pipeline of an older version"):
        iterator.set_state({"format_version": 1, "step": 3, "iterator": {}})
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(xd.DataCheckpointError, match="bad.json"):
        iterator.restore(tmp_path / "bad.json")
    iterator.close()


class _BrokenDocuments(_CountingDocuments):
    """Fails once the documents were counted (200 reads) and 10 more were read."""

    def __getitem__(self, index):
        if len(self.read) > 210:
            raise RuntimeError("disk on fire")
        return super().__getitem__(index)


def test_errors_in_the_pipeline_reach_the_caller(mesh):
    documents = _BrokenDocuments(200)
    iterator = xd.make_grain_llm_iterator(
        None, None, mesh, documents, 4, 8, True, 0, worker_count=0
    )
    with pytest.raises(RuntimeError, match="disk on fire"):
        for _ in range(100):
            next(iterator)
    iterator.close()


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
