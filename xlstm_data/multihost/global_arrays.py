"""Host-local numpy batches to one globally sharded `jax.Array` per field.

Every data-loading host holds `rows / host_count` rows of the global batch;
`jax.make_array_from_process_local_data` places them on the devices that hold
those rows, and processes that replicate the same rows pass identical data.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec


def form_global_batch(
    local: Mapping[str, np.ndarray], sharding: NamedSharding, host_count: int
) -> dict[str, jax.Array]:
    """Builds the global arrays from this host's rows.

    Args:
      local: Host batch, each field `[host_rows, ...]`.
      sharding: Batch sharding over the mesh's data axes.
      host_count: Number of data-loading hosts.

    Returns:
      One `jax.Array` per field of shape `[host_rows * host_count, ...]`.
    """
    local = dict(local)
    global_shapes = {
        key: (array.shape[0] * host_count,) + tuple(array.shape[1:]) for key, array in local.items()
    }
    # One call for all fields: on one process it is a single batched transfer.
    return jax.make_array_from_process_local_data(sharding, local, global_shapes)


def form_global_fields(
    block: np.ndarray, names: Sequence[str], sharding: NamedSharding, host_count: int
) -> dict[str, jax.Array]:
    """The global arrays of a step's fields, held by this host as one block `[fields, rows, L]`.

    One transfer of the block and one compiled split into the fields, instead
    of one transfer per field: 0.24 ms against 0.47 ms per step of 8 x 1024
    rows and 7 fields on one CPU device (`form_global_batch`), most of which
    is JAX's per-array dispatch. The split has no collective, so processes
    may run it in any order relative to their train steps.

    Args:
      block: This host's rows of every field, `[len(names), host_rows, L]`.
      names: The fields, in block order.
      sharding: Batch sharding over the mesh's data axes (rows split over them).
      host_count: Number of data-loading hosts.

    Returns:
      `{name: jax.Array of shape [host_rows * host_count, L]}`, sharded by `sharding`.
    """
    block_sharding = NamedSharding(sharding.mesh, PartitionSpec(None, *sharding.spec))
    shape = (block.shape[0], block.shape[1] * host_count, *block.shape[2:])
    whole = jax.make_array_from_process_local_data(block_sharding, block, shape)
    return _splitter(tuple(names), sharding)(whole)


@functools.cache
def _splitter(names: tuple[str, ...], sharding: NamedSharding) -> Any:
    """A compiled `block -> {name: block[i]}` whose outputs have `sharding` (one per layout)."""
    return jax.jit(
        lambda whole: {name: whole[i] for i, name in enumerate(names)}, out_shardings=sharding
    )
