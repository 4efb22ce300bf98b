"""Mesh creation, the batch sharding, and the data-host layout in one process."""

from __future__ import annotations

import jax
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
