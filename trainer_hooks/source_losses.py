"""Per-dataset loss summed over the steps of a report interval, on the device.

The loop hands each step's per-token loss and the batch's `source_ids`; one
small jitted reduction (`xlstm_data.loss_by_source`) and an add run on the
device, so nothing waits for the step to finish until a report reads the
totals. The totals are replicated over the mesh, so every process reads the
same figures without a collective of its own.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from xlstm_data import loss_by_source


class SourceLossMeter:
    """Sums `[loss, tokens]` per dataset over the steps since the last `take`.

    Args:
      names: The iterator's `source_names`.
      mesh: The mesh the batches live on (the totals are replicated over it).
    """

    def __init__(self, names: Sequence[str], mesh: Mesh):
        self.names = tuple(names)
        self._reduce = jax.jit(
            functools.partial(loss_by_source, num_sources=len(self.names)),
            out_shardings=NamedSharding(mesh, PartitionSpec()),
        )
        self._totals: jax.Array | None = None

    def add(self, token_loss: jax.Array, source_ids: jax.Array) -> None:
        """Adds one step's per-token loss (padding is recognised by `source_ids`)."""
        sums = self._reduce(token_loss, source_ids)
        self._totals = sums if self._totals is None else self._totals + sums

    def take(self) -> np.ndarray | None:
        """`[2, sources]` totals since the last call (None if nothing was added); resets."""
        totals, self._totals = self._totals, None
        return None if totals is None else np.asarray(totals, dtype=np.float64)


def mean_losses(totals: np.ndarray) -> np.ndarray:
    """Each dataset's mean loss from `[2, sources]` totals (NaN where it had no tokens)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(totals[1] > 0, totals[0] / totals[1], np.nan)
