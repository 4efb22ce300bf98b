"""Everything the plan depends on besides document lengths, validated once.

The spec is a pure value: two runs with equal specs and equal lengths plan
exactly the same rows at every step. It holds no host count, worker count or
process layout; those decide only who computes which part of the plan.
"""

from __future__ import annotations

import dataclasses

from xlstm_data.errors import DataConfigError
from xlstm_data.plan.mixture import UNITS, MixtureSchedule
from xlstm_data.plan.packing import MODES
from xlstm_data.plan.schedule import BatchSizeSchedule

#: Default documents per planned block (`data.block_documents`).
DEFAULT_BLOCK_DOCUMENTS = 2048


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
      block_documents: K, documents per planned block of a source (never across an epoch).
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
        if self.block_documents < 1:
            raise DataConfigError(f"data.block_documents={self.block_documents} must be >= 1")
        if self.num_epochs is not None and len(self.names) != 1:
            raise DataConfigError("data.num_epochs bounds a single dataset, not a mixture")
