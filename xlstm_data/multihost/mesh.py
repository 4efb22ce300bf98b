"""Device meshes for data and model parallelism, and the sharding of a batch.

The mesh decides where batch rows live. Its batch axes split the batch; every
other axis (`tp`, `sp`, ...) replicates it. The batch axes default to the `dp`
and `fsdp` axes the mesh has; a mesh named otherwise (MaxText's
`jax.make_mesh((8,), ("data",))`) must name them with `batch_axis_names`, since
falling back to "no batch axis" would silently give every device the whole
batch. Everything else in the data path (which rows a process loads, the
per-host batch size) is derived from the mesh, never from
`jax.process_index()`, so model axes may span processes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypeAlias

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from xlstm_data.errors import DataConfigError

DEFAULT_AXIS_NAMES: tuple[str, ...] = ("dp", "fsdp", "tp", "sp")
DEFAULT_AXIS_DIMS: tuple[int, ...] = (1, -1, 1, 1)
#: Mesh axes that split the batch dimension by default; the others replicate it.
DATA_AXIS_NAMES: tuple[str, ...] = ("data", "dp", "fsdp")

#: How callers name the batch axes: one axis name, a sequence of them (`()` to
#: replicate the batch on purpose), or None for the `data`/`dp`/`fsdp` axes present.
BatchAxisNames: TypeAlias = str | Sequence[str] | None


def parse_axis_spec(spec: str) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """Parses `"dp:1,fsdp:-1,tp:1,sp:1"` into axis dims and names.

    Args:
      spec: Comma-separated `name:dim` pairs.

    Returns:
      `(axis_dims, axis_names)`.
    """
    dims: list[int] = []
    names: list[str] = []
    for part in spec.split(","):
        name, sep, dim = part.strip().partition(":")
        if not sep or not name.strip():
            raise DataConfigError(
                f"mesh axis spec {spec!r}: entry {part!r} is not 'name:dim'; "
                "expected e.g. 'dp:1,fsdp:-1,tp:1,sp:1'"
            )
        try:
            dims.append(int(dim))
        except ValueError:
            raise DataConfigError(
                f"mesh axis spec {spec!r}: dim {dim!r} of axis {name!r} is not an integer"
            ) from None
        names.append(name.strip())
    return tuple(dims), tuple(names)


def resolve_axis_dims(axis_dims: Sequence[int], num_devices: int) -> tuple[int, ...]:
    """Infers a single -1 entry so that the product equals `num_devices`."""
    dims = [int(d) for d in axis_dims]
    unknown = [i for i, d in enumerate(dims) if d == -1]
    bad = [d for d in dims if d == 0 or d < -1]
    if bad or len(unknown) > 1:
        raise DataConfigError(
            f"axis_dims={tuple(dims)}: each dim must be a positive integer, with at most one -1 "
            "to be inferred"
        )
    known = math.prod(d for d in dims if d != -1)
    if unknown:
        if num_devices % known:
            raise DataConfigError(
                f"axis_dims={tuple(dims)}: the known dims multiply to {known}, which does not "
                f"divide the {num_devices} devices, so the -1 axis cannot be inferred"
            )
        dims[unknown[0]] = num_devices // known
    elif known != num_devices:
        raise DataConfigError(
            f"axis_dims={tuple(dims)} multiply to {known} but there are {num_devices} devices; "
            "make the product equal the device count or use -1 for one axis"
        )
    return tuple(dims)


def create_mesh(
    axis_dims: Sequence[int] | str = DEFAULT_AXIS_DIMS,
    axis_names: Sequence[str] = DEFAULT_AXIS_NAMES,
    devices: Sequence[jax.Device] | None = None,
) -> Mesh:
    """Creates a mesh with Auto axis types over all (or the given) devices.

    Args:
      axis_dims: Size of each axis, one of which may be -1 (inferred); or a
        string like `"dp:1,fsdp:-1,tp:1,sp:1"` that also names the axes.
      axis_names: Names of the axes (ignored when `axis_dims` is a string).
      devices: Devices in mesh order; defaults to `jax.devices()`. Pass an
        explicit order to place an axis across processes.

    Returns:
      A `jax.sharding.Mesh` whose axes are all `AxisType.Auto`.
    """
    if isinstance(axis_dims, str):
        axis_dims, axis_names = parse_axis_spec(axis_dims)
    axis_names = tuple(axis_names)
    if len(axis_names) != len(axis_dims):
        raise DataConfigError(
            f"axis_dims={tuple(axis_dims)} and axis_names={axis_names} differ in length"
        )
    if len(set(axis_names)) != len(axis_names):
        raise DataConfigError(f"axis_names={axis_names} contains duplicates")
    axis_types = (jax.sharding.AxisType.Auto,) * len(axis_dims)
    if devices is None:
        # jax.make_mesh orders devices by physical topology (ICI rings on TPU).
        dims = resolve_axis_dims(axis_dims, jax.device_count())
        return jax.make_mesh(dims, axis_names, axis_types=axis_types)
    devices = list(devices)
    dims = resolve_axis_dims(axis_dims, len(devices))
    device_array = np.asarray(devices, dtype=object).reshape(dims)
    return Mesh(device_array, axis_names, axis_types=axis_types)


def data_axes(mesh: Mesh, batch_axis_names: BatchAxisNames = None) -> tuple[str, ...]:
    """The mesh axes that split the batch, in the order rows are laid out over them.

    Args:
      mesh: The global mesh.
      batch_axis_names: The axes that split the batch: one name, a sequence of
        names (major to minor), or `()` to replicate the whole batch on every
        device on purpose. None (the default) means every axis the mesh has
        among `data` (MaxText's and Flax lm1b's name), `dp` and `fsdp`, in that
        order, and is an error when it has none, rather than silently
        replicating the batch: on lm1b's mesh `('data', 'fsdp', 'tensor')` the
        batch once split over `fsdp` alone, so every `data` replica held all of it.

    Returns:
      The batch axes, each an axis of `mesh`.

    Raises:
      DataConfigError: if a named axis is not on the mesh, is named twice or is
        not a string, or if None is given and the mesh has no `data`/`dp`/`fsdp` axis.
    """
    names = tuple(mesh.axis_names)
    if batch_axis_names is None:
        axes = tuple(name for name in DATA_AXIS_NAMES if name in names)
        if not axes:
            raise DataConfigError(
                f"batch_axis_names=None: the mesh's axes {dict(mesh.shape)} include none of "
                f"the default batch axes {DATA_AXIS_NAMES}, so the batch would be copied "
                "whole to every device; name the axes that split the batch, e.g. "
                f"batch_axis_names={names[:1]!r} (any of {names}), or batch_axis_names=() "
                "to replicate it on purpose"
            )
        return axes
    axes = (batch_axis_names,) if isinstance(batch_axis_names, str) else batch_axis_names
    try:
        axes = tuple(axes)
    except TypeError:
        raise DataConfigError(
            f"batch_axis_names={batch_axis_names!r} (type {type(batch_axis_names).__name__}) "
            f"must be an axis name, a sequence of axis names of the mesh {names}, or None"
        ) from None
    for axis in axes:
        if not isinstance(axis, str) or axis not in names:
            raise DataConfigError(
                f"batch_axis_names={batch_axis_names!r}: {axis!r} is not an axis of the mesh; "
                f"valid axes are {names}"
            )
    if len(set(axes)) != len(axes):
        raise DataConfigError(
            f"batch_axis_names={batch_axis_names!r} names an axis twice; name each of "
            f"{names} at most once"
        )
    return axes


def data_parallel_size(mesh: Mesh, batch_axis_names: BatchAxisNames = None) -> int:
    """Number of distinct batch shards: the product of the batch axes' sizes.

    Args:
      mesh: The global mesh.
      batch_axis_names: As in `data_axes` (default: the `data`/`dp`/`fsdp` axes present).

    Returns:
      The number of shards the batch dimension is split into (1 if replicated).
    """
    return math.prod(mesh.shape[name] for name in data_axes(mesh, batch_axis_names))


def data_sharding(mesh: Mesh, batch_axis_names: BatchAxisNames = None) -> NamedSharding:
    """The sharding of a `[batch, ...]` array: rows over the batch axes.

    The batch is replicated over every other axis (`tp`, `sp`, ...).

    Args:
      mesh: The global mesh.
      batch_axis_names: As in `data_axes` (default: the `data`/`dp`/`fsdp` axes present).

    Returns:
      A `NamedSharding` splitting dimension 0 over the batch axes.
    """
    axes = data_axes(mesh, batch_axis_names)
    spec = PartitionSpec(axes if axes else None)
    return NamedSharding(mesh, spec)
