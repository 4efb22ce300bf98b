"""Mesh creation, the batch sharding, and the data-host layout in one process."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec

import xlstm_data as xd


def test_default_mesh_infers_fsdp():
    mesh = xd.create_mesh()
    assert dict(mesh.shape) == {"dp": 1, "fsdp": 4, "tp": 1, "sp": 1}
    assert all(t == jax.sharding.AxisType.Auto for t in mesh.axis_types)


def test_mesh_from_string_and_data_sharding():
    mesh = xd.create_mesh("dp:2,fsdp:1,tp:-1,sp:1")
    assert dict(mesh.shape) == {"dp": 2, "fsdp": 1, "tp": 2, "sp": 1}
    assert xd.data_sharding(mesh).spec == PartitionSpec(("dp", "fsdp"))
    assert xd.data_parallel_size(mesh) == 2
    layout = xd.data_host_layout(mesh)
    assert (layout.host_index, layout.host_count, layout.data_parallel_size) == (0, 1, 2)


@pytest.mark.parametrize(
    "dims,match",
    [
        ((1, 3, 1, 1), "multiply to 3 but there are 4 devices"),
        ((1, -1, -1, 1), "at most one -1"),
        ((3, -1, 1, 1), "does not divide the 4 devices"),
        ((1, 0, 1, 1), "positive integer"),
    ],
)
def test_bad_axis_dims(dims, match):
    with pytest.raises(xd.DataConfigError, match=match):
        xd.create_mesh(dims)


def test_bad_axis_strings_and_names():
    with pytest.raises(xd.DataConfigError, match="not 'name:dim'"):
        xd.create_mesh("dp1,fsdp:-1")
    with pytest.raises(xd.DataConfigError, match="not an integer"):
        xd.create_mesh("dp:x,fsdp:-1")
    with pytest.raises(xd.DataConfigError, match="differ in length"):
        xd.create_mesh((1, -1), ("dp", "fsdp", "tp"))


def test_host_batch_size_must_divide_data_parallel_size():
    layout = xd.data_host_layout(xd.create_mesh())
    assert layout.host_batch_size(8) == 8
    with pytest.raises(xd.DataConfigError, match="global_batch_size=6 must be a positive multiple"):
        layout.host_batch_size(6)


# Meshes whose batch axes are not called dp/fsdp (e.g. MaxText's ("data",)).


def _auto_mesh(dims: tuple[int, ...], names: tuple[str, ...]) -> jax.sharding.Mesh:
    return jax.make_mesh(dims, names, axis_types=(jax.sharding.AxisType.Auto,) * len(dims))


def test_mesh_without_data_dp_or_fsdp_is_refused_rather_than_replicated():
    mesh = _auto_mesh((4,), ("batch",))
    for call in (xd.data_sharding, xd.data_parallel_size, xd.data_host_layout):
        with pytest.raises(xd.DataConfigError) as info:
            call(mesh)
        message = str(info.value)
        assert "batch_axis_names=None" in message
        assert "('data', 'dp', 'fsdp')" in message and "{'batch': 4}" in message
        assert "batch_axis_names=('batch',)" in message and "batch_axis_names=()" in message


@pytest.mark.parametrize(
    ("dims", "names", "axes"),
    [
        ((4,), ("data",), ("data",)),  # a plain data-parallel mesh
        ((2, 2, 1), ("data", "fsdp", "tensor"), ("data", "fsdp")),  # Flax lm1b's
        ((1, 2, 2), ("tensor", "data", "fsdp"), ("data", "fsdp")),
    ],
)
def test_default_batch_axes_split_the_batch_on_lm1b_and_maxtext_meshes(dims, names, axes):
    mesh = _auto_mesh(dims, names)
    layout = xd.data_host_layout(mesh)
    assert layout.batch_axis_names == axes
    assert layout.data_parallel_size == 4
    array = jax.make_array_from_process_local_data(layout.sharding(mesh), np.arange(8), (8,))
    # Every device holds 2 of the 8 rows: the batch is split, never copied whole.
    assert sorted(len(r) for r in _rows_by_device(array).values()) == [2, 2, 2, 2]


def _rows_by_device(array: jax.Array) -> dict[int, list[int]]:
    return {shard.device.id: np.asarray(shard.data).tolist() for shard in array.addressable_shards}


@pytest.mark.parametrize("names", ["data", ("data",), ["data"]])
def test_named_batch_axis_splits_the_batch(names):
    mesh = jax.make_mesh((4,), ("data",))  # jax's default (Explicit) axis types work too
    assert xd.data_parallel_size(mesh, names) == 4
    assert xd.data_sharding(mesh, names).spec == PartitionSpec(("data",))
    layout = xd.data_host_layout(mesh, batch_axis_names=names)
    assert layout.batch_axis_names == ("data",)
    assert (layout.host_index, layout.host_count, layout.data_parallel_size) == (0, 1, 4)
    assert layout.host_batch_size(8) == 8
    rows = np.arange(8, dtype=np.int32)
    array = jax.make_array_from_process_local_data(layout.sharding(mesh), rows, (8,))
    shards = _rows_by_device(array)
    # Each device holds its own 2 rows, not the whole batch.
    assert sorted(len(r) for r in shards.values()) == [2, 2, 2, 2]
    assert sorted(row for r in shards.values() for row in r) == list(range(8))


def test_named_batch_axis_replicates_over_the_other_axes():
    mesh = _auto_mesh((2, 2), ("data", "model"))
    layout = xd.data_host_layout(mesh, ("data",))
    assert layout.data_parallel_size == 2
    array = jax.make_array_from_process_local_data(layout.sharding(mesh), np.arange(4), (4,))
    by_data_index = {}
    for device, (row_slice,) in layout.sharding(mesh).devices_indices_map((4,)).items():
        by_data_index.setdefault((row_slice.start, row_slice.stop), []).append(device.id)
    assert sorted(by_data_index) == [(0, 2), (2, 4)]
    assert all(len(devices) == 2 for devices in by_data_index.values())  # copies over "model"
    assert sorted(len(r) for r in _rows_by_device(array).values()) == [2, 2, 2, 2]
    # Two batch axes: the batch splits over both, in the order named.
    assert xd.data_parallel_size(mesh, ("model", "data")) == 4
    assert xd.data_sharding(mesh, ("model", "data")).spec == PartitionSpec(("model", "data"))


def test_empty_batch_axes_replicate_on_purpose():
    mesh = _auto_mesh((4,), ("model",))
    layout = xd.data_host_layout(mesh, ())
    assert layout.data_parallel_size == 1 and layout.batch_axis_names == ()
    assert xd.data_sharding(mesh, ()).is_fully_replicated
    with pytest.raises(xd.DataConfigError, match=r"batch axes \(\)"):
        layout.host_batch_size(0)


def test_default_batch_axes_are_the_dp_fsdp_axes_present():
    mesh = xd.create_mesh((2, 2), ("fsdp", "tp"))
    assert xd.data_sharding(mesh).spec == PartitionSpec(("fsdp",))
    assert xd.data_host_layout(mesh).batch_axis_names == ("fsdp",)
    assert xd.data_host_layout(mesh).sharding(mesh) == xd.data_sharding(mesh)
    default = xd.data_host_layout(xd.create_mesh())
    assert default.batch_axis_names == ("dp", "fsdp")
    with pytest.raises(xd.DataConfigError, match=r"batch axes \('dp', 'fsdp'\)"):
        default.host_batch_size(6)


@pytest.mark.parametrize(
    ("names", "match"),
    [
        (("nope",), r"batch_axis_names=\('nope',\): 'nope' is not an axis .* \('data', 'model'\)"),
        ("tp", r"batch_axis_names='tp': 'tp' is not an axis"),
        (("data", "data"), r"batch_axis_names=\('data', 'data'\) names an axis twice"),
        ([1], r"batch_axis_names=\[1\]: 1 is not an axis"),
        (5, r"batch_axis_names=5 \(type int\) must be an axis name"),
    ],
)
def test_bad_batch_axis_names(names, match):
    mesh = _auto_mesh((2, 2), ("data", "model"))
    for call in (xd.data_sharding, xd.data_parallel_size, xd.data_host_layout):
        with pytest.raises(xd.DataConfigError, match=match):
            call(mesh, names)
