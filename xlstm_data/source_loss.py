"""The loss of each dataset in a batch, inside a jitted step.

Every planned batch carries `source_ids`: per token, the index of its dataset
in the iterator's `source_names`, and `SOURCE_ID_PADDING` (-1) on padding. A
one-hot contraction (rather than a segment sum) keeps the reduction a plain
all-reduce when the batch is sharded over many devices, and `one_hot(-1)` is
all zeros, so padding counts nowhere without a mask.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def loss_by_source(token_loss: jax.Array, source_ids: jax.Array, num_sources: int) -> jax.Array:
    """Per dataset, the summed loss and the number of tokens: float32 `[2, num_sources]`.

    Args:
      token_loss: Per-token loss, any shape (e.g. `[batch, length]`).
      source_ids: The batch's `source_ids`, the same shape.
      num_sources: `len(iterator.source_names)`.

    Returns:
      Row 0: loss summed over each dataset's tokens; row 1: their count.
      Divide row 0 by row 1 for each dataset's mean loss.
    """
    one_hot = jax.nn.one_hot(source_ids, num_sources, dtype=jnp.float32)
    losses = jnp.einsum("...,...n->n", token_loss.astype(jnp.float32), one_hot)
    return jnp.stack([losses, one_hot.sum(axis=tuple(range(one_hot.ndim - 1)))])
