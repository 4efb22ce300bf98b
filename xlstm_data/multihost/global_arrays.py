"""Host-local numpy batches to one globally sharded `jax.Array` per field.

Every data-loading host holds `rows / host_count` rows of the global batch;
`jax.make_array_from_process_local_data` places them on the devices that hold
those rows, and processes that replicate the same rows pass identical data.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from concurrent import futures
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
    """Sends several steps' fields, held as `[steps, fields, rows, L]`, to the devices.

    One transfer and one compiled split into the fields for all the steps:
    per step of 8 x 1024 rows and 7 fields on one CPU device, 0.66 ms CPU
    sent alone and 0.16 ms sent 8 at a time (most of it is JAX's dispatch,
    not the copy). Compiling that split takes 0.1-0.5 s, more than a whole
    cold start should, so it compiles in a background thread; until it is
    ready each step is sent as a pytree of fields, which needs no compile.
    The split has no collective, so processes may run it in any order
    relative to their train steps.

    Args:
      names: The fields, in block order.
      sharding: Batch sharding over the mesh's data axes (rows split over them).
      host_count: Number of data-loading hosts.
    """

    def __init__(self, names: Sequence[str], sharding: NamedSharding, host_count: int):
        self._names = tuple(names)
        self._sharding = sharding
        self._host_count = host_count

    def __call__(self, blocks: np.ndarray) -> list[dict[str, jax.Array]]:
        """Per step, `{name: jax.Array [host_rows * host_count, L]}`, sharded by `sharding`."""
        shape = (*blocks.shape[:2], blocks.shape[2] * self._host_count, *blocks.shape[3:])
        key = (self._names, self._sharding, shape, blocks.dtype.str)
        split = _SPLITS.get(key)
        if split is None:
            split = _SPLITS[key] = _compile_in_background(*key)
        if not split.done():
            return [
                form_global_batch(
                    dict(zip(self._names, block, strict=True)), self._sharding, self._host_count
                )
                for block in blocks
            ]
        whole_sharding = NamedSharding(
            self._sharding.mesh, PartitionSpec(None, None, *self._sharding.spec)
        )
        whole = jax.make_array_from_process_local_data(whole_sharding, blocks, shape)
        return split.result()(whole)


#: Splits by (names, sharding, shape, dtype), shared by every iterator of the
#: process (an eval iterator rebuilt per pass compiles nothing again).
_SPLITS: dict[tuple[Any, ...], futures.Future] = {}


def _compile_in_background(*key: Any) -> futures.Future:
    """`_compiled_split(*key)` in a daemon thread: a compile never delays an exit.

    A pool's thread is joined at exit; a process of a multi-process run that
    waited there for a compile reached JAX's shutdown barrier late.
    """
    split: futures.Future = futures.Future()

    def compile_split() -> None:
        try:
            split.set_result(_compiled_split(*key))
        except BaseException as error:  # noqa: BLE001 - raised where the split is used
            split.set_exception(error)

    threading.Thread(target=compile_split, name="xlstm-data-compile", daemon=True).start()
    return split


def _compiled_split(
    names: tuple[str, ...], sharding: NamedSharding, shape: tuple[int, ...], dtype: str
) -> Any:
    """The compiled `blocks -> [{name: blocks[s, i]}]` whose outputs have `sharding`."""
    whole_sharding = NamedSharding(sharding.mesh, PartitionSpec(None, None, *sharding.spec))
    steps = shape[0]
    split = jax.jit(
        lambda whole: [{name: whole[s, i] for i, name in enumerate(names)} for s in range(steps)],
        out_shardings=sharding,
    )
    return split.lower(jax.ShapeDtypeStruct(shape, dtype, sharding=whole_sharding)).compile()
