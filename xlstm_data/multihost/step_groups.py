"""A host pipeline's steps as global arrays, several small steps per transfer.

A step of 8 rows of 1024 spent more of its time in JAX's dispatch of the
transfer and of the split into fields than in copying its bytes; steps sent
to the devices together share that cost. Steps are grouped up to
`CHUNK_ROWS` rows, only while the batch size stays the same (a ramp-up
boundary starts a new group), and handed out one by one in order, so a
group changes when a step's arrays are made, never what they hold.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding

from xlstm_data.multihost.global_arrays import StepTransfer
from xlstm_data.reading.planned_batches import CHUNK_ROWS
from xlstm_data.reading.row_assembly import fields_of

#: One step: its host pipeline element, its host fields by name, its global arrays.
Step = tuple[dict[str, Any], dict[str, np.ndarray], dict[str, jax.Array]]


class StepGroups:
    """Iterates over `pipeline`'s steps, each with its global arrays.

    Args:
      pipeline: The host pipeline: elements with `"fields"` `[fields, rows, L]`.
      names: The fields, in block order.
      sharding: Batch sharding over the mesh's data axes.
      host_count: Number of data-loading hosts.
    """

    def __init__(
        self,
        pipeline: Iterator[dict[str, Any]],
        names: Sequence[str],
        sharding: NamedSharding,
        host_count: int,
    ):
        self.pipeline = pipeline
        self._transfer = StepTransfer(names, sharding, host_count)
        self._ready: collections.deque[Step] = collections.deque()
        self._held: dict[str, Any] | None = None  # the first step of the next group
        self._ended = False

    def __iter__(self) -> StepGroups:
        return self

    def __next__(self) -> Step:
        if not self._ready:
            self._ready.extend(self._next_group())
        return self._ready.popleft()

    def _next_group(self) -> list[Step]:
        if self._held is not None:
            elements, self._held = [self._held], None
        elif self._ended:
            raise StopIteration
        else:
            elements = [next(self.pipeline)]
        rows = elements[0]["fields"].shape[1]
        while not self._ended and (len(elements) + 1) * rows <= CHUNK_ROWS:
            try:
                element = next(self.pipeline)
            except StopIteration:
                self._ended = True
                break
            if element["fields"].shape[1] != rows:
                self._held = element
                break
            elements.append(element)
        # One copy, into the block the transfer reads: out of the workers'
        # shared memory (grain unlinks it) or of steps assembled together.
        blocks = np.stack([element["fields"] for element in elements])
        arrays = self._transfer(blocks)
        return [
            (element, fields_of(block), device)
            for element, block, device in zip(elements, blocks, arrays, strict=True)
        ]
