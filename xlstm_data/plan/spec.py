"""Everything the plan depends on besides document lengths, validated once.

The spec is a pure value: two runs with equal specs and equal lengths plan
exactly the same rows at every step. It holds no host count, worker count or
process layout; those decide only who computes which part of the plan.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from xlstm_data.config.rampup import BatchSizeSchedule
from xlstm_data.errors import DataConfigError
from xlstm_data.plan.mixture import UNITS, MixtureSchedule
from xlstm_data.plan.packing import MODES

#: Default cap on the number of logical streams (`data.logical_streams=None`).
MAX_AUTO_STREAMS = 64
#: Default documents per planned block (`data.block_documents`).
DEFAULT_BLOCK_DOCUMENTS = 2048


def auto_streams(batch_sizes: Sequence[int], cap: int = MAX_AUTO_STREAMS) -> int:
    """The largest divisor of every stage's global batch that is <= `cap`."""
    common = math.gcd(*batch_sizes)
    return max(d for d in range(1, min(common, cap) + 1) if common % d == 0)


@dataclasses.dataclass(frozen=True)
class PlanSpec:
    """The inputs of the plan (see the package docstring).

    Attributes:
      names: Source names, in plan order (a piece's `source` indexes this).
      mixture: Weights by step.
      mixture_unit: "tokens" (token shares follow the weights) or "documents".
      row_length: L, example positions per row (`max_target_length`).
      packing: One of `packing.MODES`.
      shift: As `data.shift`.
      shift_target: As `data.shift_target`.
      seed: `data.data_shuffle_seed`.
      shuffle: Shuffle documents (per epoch, per block) and packed rows.
      batch: Global rows per step (`BatchSizeSchedule` with host_count 1).
      streams: V, logical streams; divides every stage's global batch.
      block_documents: K, documents per planned block.
      num_epochs: Passes over the (single) source, or None to repeat forever.
      drop_remainder: At the end of a finite run, drop a partial last step
        (True) or pad it with empty rows (False).
    """

    names: tuple[str, ...]
    mixture: MixtureSchedule
    mixture_unit: str
    row_length: int
    packing: str
    shift: bool
    shift_target: bool
    seed: int
    shuffle: bool
    batch: BatchSizeSchedule
    streams: int
    block_documents: int = DEFAULT_BLOCK_DOCUMENTS
    num_epochs: int | None = None
    drop_remainder: bool = True

    def __post_init__(self) -> None:
        if self.packing not in MODES:
            raise DataConfigError(f"data.packing={self.packing!r}; expected one of {list(MODES)}")
        if self.mixture_unit not in UNITS:
            raise DataConfigError(
                f"data.mixture_unit={self.mixture_unit!r} is invalid; expected one of {list(UNITS)}"
            )
        bad = [
            s.global_batch_size for s in self.batch.stages() if s.global_batch_size % self.streams
        ]
        if self.streams < 1 or bad:
            raise DataConfigError(
                f"data.logical_streams={self.streams} must divide every stage's global batch "
                f"size ({[s.global_batch_size for s in self.batch.stages()]}); valid values: "
                f"divisors of {math.gcd(*[s.global_batch_size for s in self.batch.stages()])}"
            )
        if self.block_documents < 1:
            raise DataConfigError(f"data.block_documents={self.block_documents} must be >= 1")
        if self.num_epochs is not None and len(self.names) != 1:
            raise DataConfigError("data.num_epochs bounds a single dataset, not a mixture")

    def describe(self) -> dict[str, Any]:
        """A JSON-able summary (checkpoints record it; tools print it)."""
        return {
            "names": list(self.names),
            "mixture_schedule": self.mixture.to_pairs(),
            "mixture_unit": self.mixture_unit,
            "row_length": self.row_length,
            "packing": self.packing,
            "shift": self.shift,
            "shift_target": self.shift_target,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "batch": self.batch.rampup.to_pairs(),
            "global_batch_size": self.batch.global_batch_size,
            "streams": self.streams,
            "block_documents": self.block_documents,
            "num_epochs": self.num_epochs,
            "drop_remainder": self.drop_remainder,
        }
