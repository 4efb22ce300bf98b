"""Which batch rows each process loads, derived from the mesh.

A process loads the rows its devices hold. Processes whose devices hold the
same rows (replicas over `tp`/`sp`, which may span processes) form one
data-loading host and read identical data. The index and count of those hosts,
not `jax.process_index()`, decide the dataset shard. Which mesh axes split the
batch is decided once here (`batch_axis_names`) and kept in the layout, so the
rows a host loads and the sharding its global arrays get cannot disagree.
"""

from __future__ import annotations

import dataclasses
import math

import jax
from jax.sharding import Mesh, NamedSharding

from xlstm_data.errors import DataConfigError
from xlstm_data.multihost.mesh import DATA_AXIS_NAMES, BatchAxisNames, data_axes, data_sharding


@dataclasses.dataclass(frozen=True)
class DataHostLayout:
    """How the batch dimension is split over processes.

    Attributes:
      host_index: Data-loading host of this process.
      host_count: Number of distinct data-loading hosts.
      data_parallel_size: Number of batch shards on the mesh.
      process_index: `jax.process_index()` of this process.
      process_count: Number of processes holding mesh devices.
      batch_axis_names: The mesh axes that split the batch (`()` when it is
        replicated); shard global arrays with `sharding(mesh)` to match.
    """

    host_index: int
    host_count: int
    data_parallel_size: int
    process_index: int
    process_count: int
    batch_axis_names: tuple[str, ...] = DATA_AXIS_NAMES

    def host_batch_size(self, global_batch_size: int, what: str = "global_batch_size") -> int:
        """Rows one host loads for a global batch; errors if it does not divide."""
        if global_batch_size <= 0 or global_batch_size % self.data_parallel_size:
            raise DataConfigError(
                f"{what}={global_batch_size} must be a positive multiple of the mesh's "
                f"data-parallel size {self.data_parallel_size} (product of the sizes of the "
                f"batch axes {self.batch_axis_names})"
            )
        return global_batch_size // self.host_count

    def sharding(self, mesh: Mesh) -> NamedSharding:
        """The batch sharding over `mesh` on the same axes this layout was computed for.

        Args:
          mesh: The mesh the layout was computed from.

        Returns:
          `data_sharding(mesh, self.batch_axis_names)`.
        """
        return data_sharding(mesh, self.batch_axis_names)


def data_host_layout(mesh: Mesh, batch_axis_names: BatchAxisNames = None) -> DataHostLayout:
    """Computes this process's data-loading host from the mesh.

    Args:
      mesh: The global mesh; batches are sharded with
        `data_sharding(mesh, batch_axis_names)` (or the layout's `sharding(mesh)`).
      batch_axis_names: The mesh axes that split the batch, as in
        `xlstm_data.multihost.mesh.data_axes`: None (default) for the `data`/`dp`/`fsdp` axes
        present (an error if there are none), a name or names such as
        `("data",)`, or `()` to replicate the batch on every device.

    Returns:
      The layout of data-loading hosts over the processes of the mesh.
    """
    axes = data_axes(mesh, batch_axis_names)
    dp_size = math.prod(mesh.shape[name] for name in axes)
    shard_of = data_sharding(mesh, axes).devices_indices_map((dp_size,))
    rows_by_process: dict[int, set[int]] = {}
    for device, (row_slice,) in shard_of.items():
        rows_by_process.setdefault(device.process_index, set()).add(row_slice.start or 0)
    me = jax.process_index()
    if me not in rows_by_process:
        raise DataConfigError(
            f"the mesh holds no device of process {me}; build the mesh over all processes' "
            "devices (e.g. xlstm_data.create_mesh())"
        )
    groups = sorted({frozenset(rows) for rows in rows_by_process.values()}, key=min)
    sizes = {len(group) for group in groups}
    covered = sorted(row for group in groups for row in group)
    if len(sizes) != 1 or covered != list(range(dp_size)):
        raise DataConfigError(
            f"mesh {dict(mesh.shape)} with batch axes {axes} splits the batch unevenly over "
            "processes "
            f"({ {p: sorted(r) for p, r in rows_by_process.items()} }); each process must hold "
            "the same number of batch shards and processes may only share whole shard sets"
        )
    return DataHostLayout(
        host_index=groups.index(frozenset(rows_by_process[me])),
        host_count=len(groups),
        data_parallel_size=dp_size,
        process_index=me,
        process_count=len(rows_by_process),
        batch_axis_names=axes,
    )
