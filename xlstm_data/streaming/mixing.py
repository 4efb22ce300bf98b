"""Weighted mixtures of named row pipelines.

Components are mixed with grain's `IterDataset.mix` in its Mapping form, so a
restored run may change weights or add components (grain matches states by
name). Weights are validated and normalised here; a weight of 0 drops its
component before it is built into the pipeline, since grain forbids zeros.
grain's mix stops as soon as any component runs out, so components should
repeat forever (`num_epochs=None`); `mix_components` refuses finite ones
unless told that stopping at the first end is intended.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import grain
import numpy as np

from xlstm_data.errors import DataConfigError
from xlstm_data.multihost.data_stats import COMPONENT_ID_FIELD
from xlstm_data.multihost.iterator import is_infinite_stream
from xlstm_data.streaming.row_map import RowMapIterDataset


def component_names(count: int) -> list[str]:
    """Default names for unnamed components: `"0"`, `"1"`, ..."""
    return [str(i) for i in range(count)]


def check_weight(what: str, weight: object) -> float:
    """Returns `weight` as a float if it is a finite number >= 0, else raises.

    Args:
      what: How the error names the value, e.g. `"data.train.web.weight=-1"`.
      weight: The value to check.
    """
    if (
        isinstance(weight, bool)
        or not isinstance(weight, numbers.Real)
        or not math.isfinite(weight)
        or weight < 0
    ):
        raise DataConfigError(f"{what} is invalid; weights must be finite numbers >= 0")
    return float(weight)


def normalize_weights(
    names: Sequence[str],
    weights: Sequence[float] | Mapping[str, float] | None,
    key: str = "dataset_weights",
) -> dict[str, float]:
    """Validates mixture weights and scales them to sum to 1.

    Args:
      names: Names of the components, in order.
      weights: One weight per component (sequence in `names` order, or a
        mapping by name; missing names get 0), or None for equal weights.
      key: Config key or argument name used in error messages.

    Returns:
      Normalised weights of the components with a positive weight, by name.
    """
    if weights is None:
        return {name: 1.0 / len(names) for name in names}
    if isinstance(weights, Mapping):
        unknown = sorted(set(weights) - set(names))
        if unknown:
            raise DataConfigError(
                f"{key} has weights for unknown datasets {unknown}; known datasets: {list(names)}"
            )
        raw = {name: weights.get(name, 0.0) for name in names}
    else:
        weights = list(weights)
        if len(weights) != len(names):
            raise DataConfigError(
                f"{key} has {len(weights)} weights for {len(names)} datasets {list(names)}; "
                "give one weight per dataset"
            )
        raw = dict(zip(names, weights, strict=True))
    for name, weight in raw.items():
        check_weight(f"{key}: weight {weight!r} of dataset {name!r}", weight)
    total = float(sum(raw.values()))
    if total <= 0:
        raise DataConfigError(
            f"{key}: all weights are zero ({raw}); at least one dataset needs a positive weight"
        )
    return {name: float(w) / total for name, w in raw.items() if w > 0}


def mix_components(
    components: Mapping[str, grain.IterDataset],
    weights: Mapping[str, float],
    allow_finite: bool = False,
) -> grain.IterDataset:
    """Interleaves named components in proportion to their weights.

    Args:
      components: Row pipelines by name.
      weights: Normalised positive weights by name (from `normalize_weights`);
        components without a weight are dropped.
      allow_finite: Accept components that end (the mix then ends with the
        first of them, and later rows of the others are not read).

    Returns:
      The mixed pipeline (the component itself if only one remains).
    """
    kept = {name: components[name] for name in kept_component_names(components, weights)}
    if not allow_finite:
        finite = [name for name, ds in kept.items() if not is_infinite_stream(ds)]
        if finite and len(kept) > 1:
            raise DataConfigError(
                f"mixture components {finite} end after a finite number of epochs, so the mix "
                "would stop at the first one's end and silently skip the rest of the others; "
                "build mixture components with num_epochs=None and bound the run by steps"
            )
    if len(kept) == 1:
        return next(iter(kept.values()))
    tagged = {
        name: RowMapIterDataset(ds, TagComponent(index))
        for index, (name, ds) in enumerate(kept.items())
    }
    return grain.IterDataset.mix(tagged, weights={name: weights[name] for name in kept})


def kept_component_names(
    components: Mapping[str, Any], weights: Mapping[str, float]
) -> tuple[str, ...]:
    """Names of the components `mix_components` keeps, in component-id order."""
    return tuple(name for name in components if weights.get(name, 0) > 0)


class TagComponent:
    """Marks each row with its component's index, for per-component metrics."""

    def __init__(self, index: int):
        self.index = index
        self._value = np.int32(index)

    def __call__(self, row: Any) -> Any:
        if not isinstance(row, Mapping):
            return row
        return {**row, COMPONENT_ID_FIELD: self._value}

    def __repr__(self) -> str:
        return f"TagComponent({self.index})"
