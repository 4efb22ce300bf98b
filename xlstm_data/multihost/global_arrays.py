"""Host-local numpy batches to one globally sharded `jax.Array` per field.

Every data-loading host holds `rows / host_count` rows of the global batch;
`jax.make_array_from_process_local_data` places them on the devices that hold
those rows, and processes that replicate the same rows pass identical data.
"""

from __future__ import annotations

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


class StepTransfer:
    """Sends a step's fields, held as one block `[fields, rows, L]`, to the devices.

    One transfer of the block and one compiled split into its fields. Per
    step of 8 x 1024 rows and 7 fields on one CPU device: 0.77 ms CPU sent as
    a pytree of fields (`form_global_batch`, JAX's per-array dispatch), 0.08
    ms as one block through the compiled split, which on one process takes
    the numpy block itself (its C++ argument transfer). Sending 8 steps per
    transfer saved nothing more and took 1.4 s to compile (56 outputs)
    against 0.27 s for one step's 7.

    The first `PYTREE_STEPS` steps of a transfer go as pytrees, which need
    no compile: a cold start or a short eval pass does not wait for one. The
    split is then compiled in the calling thread (the prefetch thread), once
    per shape and process. A background compile was tried: a process then
    either waited for it at exit or ended inside it. The split has no
    collective, so processes may run it in any order relative to their
    train steps.

    Args:
      names: The fields, in block order.
      sharding: Batch sharding over the mesh's data axes (rows split over them).
      host_count: Number of data-loading hosts.
    """

    def __init__(self, names: Sequence[str], sharding: NamedSharding, host_count: int):
        self._names = tuple(names)
        self._sharding = sharding
        self._host_count = host_count
        self._block_sharding = _block_sharding(sharding)
        # One process holds the whole global block: the split's own argument
        # transfer places it. Several make it from their local rows.
        self._local_is_global = jax.process_count() == 1
        self._calls = 0

    def __call__(self, block: np.ndarray) -> dict[str, jax.Array]:
        """`{name: jax.Array [host_rows * host_count, L]}`, sharded by `sharding`."""
        shape = (block.shape[0], block.shape[1] * self._host_count, *block.shape[2:])
        key = (self._names, self._sharding, shape, block.dtype.str)
        self._calls += 1
        split = _SPLITS.get(key)
        if split is None and self._calls <= PYTREE_STEPS:
            fields = dict(zip(self._names, block, strict=True))
            return form_global_batch(fields, self._sharding, self._host_count)
        if split is None:
            split = _SPLITS[key] = _compiled_split(*key)
        if self._local_is_global:
            return split(block)
        return split(jax.make_array_from_process_local_data(self._block_sharding, block, shape))


#: Steps sent as pytrees before the split is compiled (per transfer).
PYTREE_STEPS = 64
#: Compiled splits by (names, sharding, shape, dtype), shared by every iterator
#: of the process (an eval iterator rebuilt per pass compiles nothing again).
_SPLITS: dict[tuple[Any, ...], Any] = {}


def _compiled_split(
    names: tuple[str, ...], sharding: NamedSharding, shape: tuple[int, ...], dtype: str
) -> Any:
    """The compiled `block -> {name: block[i]}` whose outputs have `sharding`."""
    block_sharding = _block_sharding(sharding)
    split = jax.jit(
        lambda block: {name: block[i] for i, name in enumerate(names)},
        in_shardings=block_sharding,
        out_shardings=sharding,
    )
    return split.lower(jax.ShapeDtypeStruct(shape, dtype, sharding=block_sharding)).compile()


def _block_sharding(sharding: NamedSharding) -> NamedSharding:
    """`sharding` of a field's rows, for a block `[fields, rows, L]` of them."""
    return NamedSharding(sharding.mesh, PartitionSpec(None, *sharding.spec))
