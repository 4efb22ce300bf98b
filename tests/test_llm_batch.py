"""LLMBatch: extra fields in the pytree, and the methods the xlstm-jax trainer calls."""

from __future__ import annotations

import copy
import pickle

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xlstm_data as xd
from xlstm_data.batch import LLM_BATCH_FIELDS
from xlstm_data.multihost.global_arrays import form_global_batch

SEGMENTATION = np.array(
    [
        [1, 1, 2, 2, 2, 3, 0, 0],
        [1, 1, 1, 1, 1, 1, 1, 1],
        [1, 2, 2, 2, 2, 0, 0, 0],
        [0, 0, 0, 0, 0, 0, 0, 0],
    ],
    dtype=np.int32,
)
BORDERS = np.array(
    [
        [1, 0, 1, 0, 0, 1, 1, 0],
        [1, 0, 0, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 1, 0, 0],
        [1, 0, 0, 0, 0, 0, 0, 0],
    ],
    dtype=bool,
)


def _fields(rows: int = 4, length: int = 8) -> dict[str, np.ndarray]:
    tokens = np.arange(rows * length, dtype=np.int32).reshape(rows, length)
    return {
        "inputs": tokens,
        "targets": tokens + 1000,
        "inputs_segmentation": SEGMENTATION[:rows, :length],
        "targets_segmentation": SEGMENTATION[:rows, :length],
        "inputs_position": np.tile(np.arange(length, dtype=np.int32), (rows, 1)),
        "targets_position": np.tile(np.arange(length, dtype=np.int32), (rows, 1)),
    }


def _with_extras() -> dict[str, np.ndarray]:
    data = _fields()
    data["loss_weights"] = np.linspace(0.0, 1.0, 32, dtype=np.float32).reshape(4, 8)
    data["document_idx"] = np.array([7, 8, 9, 10], dtype=np.int32)
    return data


# Construction, from_dict / to_dict ----------------------------------------------


def test_six_field_construction_still_works():
    data = _fields()
    by_keyword = xd.LLMBatch(**data)
    by_position = xd.LLMBatch(*(data[name] for name in LLM_BATCH_FIELDS))
    for batch in (by_keyword, by_position, xd.LLMBatch.from_dict(data)):
        assert batch.extra == {}
        assert list(batch.to_dict()) == list(LLM_BATCH_FIELDS)
        assert batch.shape == (4, 8)
        np.testing.assert_array_equal(batch.targets, data["targets"])
    assert len(jax.tree.leaves(by_keyword)) == 6


def test_from_dict_keeps_extra_fields_and_to_dict_gives_them_back():
    data = _with_extras()
    batch = xd.LLMBatch.from_dict(data)
    assert sorted(batch.extra) == ["document_idx", "loss_weights"]
    assert batch.extra["loss_weights"] is data["loss_weights"]
    assert batch.loss_weights is data["loss_weights"]  # attribute access
    assert batch.document_idx is data["document_idx"]
    out = batch.to_dict()
    assert list(out)[:6] == list(LLM_BATCH_FIELDS) and set(out) == set(data)
    assert all(out[key] is data[key] for key in data)
    again = xd.LLMBatch.from_dict(out)
    assert again.to_dict().keys() == out.keys()
    # The batch holds its own dict: changing the caller's mapping later does not reach it.
    extra = {"loss_weights": data["loss_weights"]}
    built = xd.LLMBatch(**_fields(), extra=extra)
    extra["other"] = 1
    assert list(built.extra) == ["loss_weights"]


def test_extra_fields_are_part_of_the_pytree():
    batch = xd.LLMBatch.from_dict(_with_extras())
    assert len(jax.tree.leaves(batch)) == 8
    doubled = jax.tree.map(lambda x: x * 2, batch)
    assert isinstance(doubled, xd.LLMBatch)
    np.testing.assert_allclose(doubled.loss_weights, batch.loss_weights * 2)
    np.testing.assert_array_equal(doubled.extra["document_idx"], [14, 16, 18, 20])
    assert jax.tree.structure(batch) != jax.tree.structure(xd.LLMBatch.from_dict(_fields()))

    @jax.jit
    def weighted_loss(b: xd.LLMBatch) -> jax.Array:
        mask = b.targets_segmentation != 0
        return jnp.sum(jnp.where(mask, b.loss_weights * b.targets, 0.0)) + b.document_idx.sum()

    data = _with_extras()
    expected = (
        np.sum(np.where(SEGMENTATION != 0, data["loss_weights"] * data["targets"], 0.0))
        + data["document_idx"].sum()
    )
    np.testing.assert_allclose(weighted_loss(batch), expected, rtol=1e-6)

    @jax.jit
    def scale(b: xd.LLMBatch) -> xd.LLMBatch:
        return b.__class__.from_dict({**b.to_dict(), "loss_weights": b.loss_weights * 3})

    np.testing.assert_allclose(scale(batch).loss_weights, data["loss_weights"] * 3, rtol=1e-6)


def test_extra_fields_are_sharded_like_the_six():
    """The multihost iterator forms global arrays of every field, then calls from_dict."""
    mesh = xd.create_mesh()
    sharding = xd.data_sharding(mesh)
    arrays = form_global_batch(_with_extras(), sharding, host_count=1)
    batch = xd.LLMBatch.from_dict(arrays)
    assert batch.loss_weights.sharding == sharding
    assert batch.document_idx.sharding.spec == sharding.spec
    rows = sorted(
        tuple(np.asarray(shard.data).tolist()) for shard in batch.document_idx.addressable_shards
    )
    assert rows == [(7,), (8,), (9,), (10,)]  # one row per device, not all rows on each
    # device_put of the whole pytree shards the extras too.
    placed = jax.device_put(xd.LLMBatch.from_dict(_with_extras()), sharding)
    assert placed.loss_weights.sharding == sharding


def test_from_dict_names_missing_fields():
    data = _with_extras()
    del data["targets_position"], data["inputs"]
    with pytest.raises(xd.DataConfigError) as info:
        xd.LLMBatch.from_dict(data)
    message = str(info.value)
    assert "['inputs', 'targets_position']" in message and "loss_weights" in message


@pytest.mark.parametrize("name", ["shape", "to_dict", "extra", "_document_borders", "1x", 3])
def test_extra_names_that_would_shadow_or_are_not_identifiers_are_refused(name):
    with pytest.raises(xd.DataConfigError, match=f"extra field name {name!r} is invalid"):
        xd.LLMBatch(**_fields(), extra={name: np.zeros(4)})
    with pytest.raises(xd.DataConfigError, match="extra=.*must be a mapping"):
        xd.LLMBatch(**_fields(), extra=[("loss_weights", np.zeros(4))])


def test_unknown_attribute_lists_the_fields_and_pickle_keeps_extras():
    batch = xd.LLMBatch.from_dict(_with_extras())
    with pytest.raises(AttributeError, match=r"no field 'loss_weight'.*'loss_weights'"):
        _ = batch.loss_weight
    assert not hasattr(batch, "loss_weight")
    for restored in (pickle.loads(pickle.dumps(batch)), copy.deepcopy(batch)):
        np.testing.assert_array_equal(restored.loss_weights, batch.loss_weights)
        assert sorted(restored.extra) == sorted(batch.extra)


# get_document_borders ------------------------------------------------------------


def test_document_borders_follow_the_target_segmentation():
    batch = xd.LLMBatch(**_fields())
    borders = batch.get_document_borders()
    assert isinstance(borders, np.ndarray) and borders.dtype == bool
    np.testing.assert_array_equal(borders, BORDERS)
    traced = jax.jit(lambda b: b.get_document_borders())(batch)
    assert isinstance(traced, jax.Array)
    np.testing.assert_array_equal(traced, BORDERS)
    # The reference's own example.
    row = np.array([[1, 1, 2, 2, 2, 3]], dtype=np.int32)
    one = xd.LLMBatch(row, row, row, row, row, row)
    assert one.get_document_borders().tolist() == [[True, False, True, False, False, True]]


# Slicing -------------------------------------------------------------------------


def test_slicing_rows_indexes_every_field_extras_included():
    data = _with_extras()
    batch = xd.LLMBatch.from_dict(data)
    part = batch[1:3]
    assert isinstance(part, xd.LLMBatch) and part.shape == (2, 8)
    for name, value in part.to_dict().items():
        np.testing.assert_array_equal(value, data[name][1:3])
    np.testing.assert_array_equal(part.get_document_borders(), BORDERS[1:3])
    row = batch[2]
    assert row.shape == (8,) and row.document_idx.shape == ()
    np.testing.assert_array_equal(row.get_document_borders(), BORDERS[2])
    picked = batch[np.array([3, 0])]
    np.testing.assert_array_equal(picked.document_idx, [10, 7])


def test_slicing_the_sequence_keeps_the_borders_of_the_whole_row():
    data = _with_extras()
    batch = xd.LLMBatch.from_dict(data)
    window = batch[:, 3:7]
    assert window.shape == (4, 4)
    np.testing.assert_array_equal(window.inputs, data["inputs"][:, 3:7])
    np.testing.assert_array_equal(window.loss_weights, data["loss_weights"][:, 3:7])
    # Per-row extras are indexed by the row part of the key only.
    np.testing.assert_array_equal(window.document_idx, data["document_idx"])
    # Column 3 of row 0 continues document 2: no border there, unlike a fresh row.
    np.testing.assert_array_equal(window.get_document_borders(), BORDERS[:, 3:7])
    assert not window.get_document_borders()[0, 0]
    np.testing.assert_array_equal(window[1:, 1:].get_document_borders(), BORDERS[1:, 4:7])
    # The carried borders are a pytree field: they survive jit and tree.map.
    through_jit = jax.jit(lambda b: b)(window)
    np.testing.assert_array_equal(through_jit.get_document_borders(), BORDERS[:, 3:7])
    # to_dict holds the batch fields only.
    assert "_document_borders" not in window.to_dict()


def test_slicing_keeps_fields_that_are_not_arrays():
    spec = jax.ShapeDtypeStruct((4, 8), jnp.int32)
    batch = xd.LLMBatch.from_dict({**dict.fromkeys(LLM_BATCH_FIELDS, spec), "note": None})
    assert batch[1:2].inputs is spec and batch[:, 1:].note is None


# get_dtype_struct / get_sample / from_inputs -------------------------------------


def test_dtype_struct_traces_a_step_without_data():
    struct = xd.LLMBatch.get_dtype_struct(4, 8)
    assert isinstance(struct, xd.LLMBatch)
    for value in struct.to_dict().values():
        assert value == jax.ShapeDtypeStruct((4, 8), jnp.int32)

    def step(b: xd.LLMBatch) -> jax.Array:
        return jnp.sum((b.targets_segmentation != 0) * b.targets)

    lowered = jax.jit(step).lower(struct)
    assert lowered.compile() is not None
    sharding = xd.data_sharding(xd.create_mesh())
    sharded = xd.LLMBatch.get_dtype_struct(4, 8, sharding=sharding)
    assert sharded.inputs.sharding == sharding
    with pytest.raises(xd.DataConfigError, match="batch_size=0 is invalid"):
        xd.LLMBatch.get_dtype_struct(0, 8)
    with pytest.raises(xd.DataConfigError, match="max_length=2.5 is invalid"):
        xd.LLMBatch.get_dtype_struct(4, 2.5)


def test_sample_is_a_concrete_batch_of_zeros():
    sample = xd.LLMBatch.get_sample(2, 5)
    assert isinstance(sample, xd.LLMBatch) and sample.shape == (2, 5)
    for value in sample.to_dict().values():
        assert isinstance(value, jax.Array) and value.dtype == jnp.int32
        assert not np.asarray(value).any()
    assert int(jax.jit(lambda b: b.inputs.sum())(sample)) == 0


def test_from_inputs_shifts_right_with_one_document_per_row():
    tokens = np.array([[5, 6, 7], [8, 9, 10]], dtype=np.int32)
    batch = xd.LLMBatch.from_inputs(tokens)
    np.testing.assert_array_equal(batch.inputs, [[0, 5, 6], [0, 8, 9]])
    np.testing.assert_array_equal(batch.targets, tokens)
    np.testing.assert_array_equal(batch.targets_position, [[0, 1, 2], [0, 1, 2]])
    assert np.asarray(batch.targets_segmentation).tolist() == [[1, 1, 1], [1, 1, 1]]
    explicit = xd.LLMBatch.from_inputs(tokens, tokens + 1)
    np.testing.assert_array_equal(explicit.inputs, tokens)
    with pytest.raises(xd.DataConfigError, match=r"targets of shape \(2, 2\)"):
        xd.LLMBatch.from_inputs(tokens, tokens[:, :2])
    with pytest.raises(xd.DataConfigError, match=r"inputs of shape \(3,\)"):
        xd.LLMBatch.from_inputs(np.arange(3))


def test_a_batch_reads_as_a_mapping_of_its_fields_for_dict_style_loops():
    from collections.abc import Mapping

    from xlstm_data import LLMBatch

    fields = {name: np.full((2, 4), i, np.int32) for i, name in enumerate(LLM_BATCH_FIELDS)}
    batch = LLMBatch.from_dict({**fields, "loss_weights": np.ones((2, 4), np.float32)})
    assert isinstance(batch, Mapping)
    assert list(batch) == [*LLM_BATCH_FIELDS, "loss_weights"] == list(batch.keys())
    assert len(batch) == 7 and batch.shape == (2, 4)
    assert batch["inputs"] is batch.inputs and batch.get("inputs") is batch.inputs
    assert batch["loss_weights"] is batch.loss_weights
    assert batch.get("nope") is None and batch.get("nope", 3) == 3
    assert "targets" in batch and "nope" not in batch and 0 not in batch
    assert dict(batch)["targets"] is batch.targets and dict(**batch).keys() == batch.keys()
    assert [k for k, _ in batch.items()] == list(batch)
    with pytest.raises(KeyError, match="has no field 'nope'"):
        batch["nope"]
    # Still a pytree, and integer/slice keys still index every field.
    assert len(jax.tree.leaves(batch)) == 7
    assert batch[:1].shape == (1, 4)
    doubled = jax.jit(lambda b: {k: v * 2 for k, v in b.items()})(batch)
    assert np.array_equal(doubled["inputs_segmentation"], fields["inputs_segmentation"] * 2)
