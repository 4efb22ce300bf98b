"""Host-local numpy batches to one globally sharded `jax.Array` per field.

Every data-loading host holds `rows / host_count` rows of the global batch;
`jax.make_array_from_process_local_data` places them on the devices that hold
those rows, and processes that replicate the same rows pass identical data.
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
import numpy as np
from jax.sharding import NamedSharding


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
