"""Host-local numpy batches to one globally sharded `jax.Array` per field.

Every data-loading host holds `rows / host_count` rows of the global batch;
`jax.make_array_from_process_local_data` places them on the devices that hold
those rows, and processes that replicate the same rows pass identical data.
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding


def pad_to_shape(array: np.ndarray, shape: tuple[int, ...], pad_value: int | float = 0):
    """Pads `array` at the end of each dimension up to `shape`."""
    if tuple(array.shape) == tuple(shape):
        return array
    widths = [(0, target - size) for size, target in zip(array.shape, shape, strict=True)]
    if any(w < 0 for _, w in widths):
        raise ValueError(f"cannot pad an array of shape {array.shape} down to {shape}")
    return np.pad(array, widths, constant_values=pad_value)


def common_shapes(local: Mapping[str, np.ndarray]) -> dict[str, tuple[int, ...]]:
    """The per-field maximum shape over all processes (a collective)."""
    keys = sorted(local)
    ranks = {len(local[k].shape) for k in keys}
    width = max(ranks) if ranks else 0
    table = np.zeros((len(keys), width), dtype=np.int64)
    for i, key in enumerate(keys):
        table[i, : local[key].ndim] = local[key].shape
    gathered = np.asarray(multihost_utils.process_allgather(table))
    maxima = gathered.max(axis=0) if gathered.ndim == 3 else table
    return {key: tuple(int(x) for x in maxima[i, : local[key].ndim]) for i, key in enumerate(keys)}


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
