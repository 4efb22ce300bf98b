"""Mixture weights by step: the configured stages and the updates made online.

`data.mixture_schedule = [[step, {name: weight, ...}], ...]` changes the
weights at the given steps; without it, `data.train.<name>.weight` holds for
the whole run. A component left out of a stage, or given weight 0, is off for
that stage.

Which source fills each row is decided by `mixing` (fair queueing on served
units), from the weights of the stage a step is in.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

from xlstm_data.errors import DataConfigError

KEY = "data.mixture_schedule"
UNITS = ("tokens", "documents")


@dataclasses.dataclass(frozen=True)
class MixtureSchedule:
    """Weights per component for each stage of the run.

    Attributes:
      names: Component names, in plan order.
      starts: First step of each stage (the first is 0), increasing.
      weights: Per stage, the normalised weight of each component.
    """

    names: tuple[str, ...]
    starts: tuple[int, ...]
    weights: tuple[tuple[float, ...], ...]

    def stage_at(self, step: int) -> int:
        """Index of the stage in force at `step`."""
        return bisect.bisect_right(self.starts, step) - 1

    def to_pairs(self) -> list[list[Any]]:
        """The JSON form `[[step, {name: weight}], ...]` (normalised weights)."""
        return [
            [start, dict(zip(self.names, weights, strict=True))]
            for start, weights in zip(self.starts, self.weights, strict=True)
        ]


def check_weight(key: str, value: Any) -> float:
    """A mixture weight as a float: a finite number >= 0 (`key` names it in errors)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise DataConfigError(f"{key}={value!r} is invalid; expected a number >= 0")
    value = float(value)
    if not math.isfinite(value) or value < 0:
        raise DataConfigError(f"{key}={value!r} is invalid; expected a finite number >= 0")
    return value


def _normalised(key: str, weights: Sequence[float]) -> tuple[float, ...]:
    total = sum(weights)
    if total <= 0:
        raise DataConfigError(
            f"{key}: all weights are zero; at least one dataset needs a weight > 0"
        )
    return tuple(w / total for w in weights)


def parse_mixture_schedule(
    value: Any, names: Sequence[str], static_weights: Mapping[str, float], key: str = KEY
) -> MixtureSchedule:
    """Validates `data.mixture_schedule` (or builds one stage from the static weights).

    Args:
      value: None, or a list of `[step, {name: weight}]` pairs.
      names: The train datasets declared in `data.train`.
      static_weights: `data.train.<name>.weight`, used when `value` is None.
      key: Config key for error messages.
    """
    names = tuple(names)
    if value is None:
        weights = [float(static_weights.get(n, 0.0)) for n in names]
        return MixtureSchedule(names, (0,), (_normalised("data.train.*.weight", weights),))
    if isinstance(value, Mapping):
        value = sorted(value.items(), key=lambda item: _stage_step(key, item[0]))
    if not isinstance(value, list | tuple) or not value:
        raise DataConfigError(
            f"{key}={value!r} is invalid; expected a non-empty list of [step, {{name: weight}}] "
            "pairs starting at step 0"
        )
    starts: list[int] = []
    stages: list[tuple[float, ...]] = []
    for index, entry in enumerate(value):
        where = f"{key}[{index}]"
        if not isinstance(entry, list | tuple) or len(entry) != 2:
            raise DataConfigError(
                f"{where}={entry!r} is invalid; expected [step, {{name: weight}}]"
            )
        step = _stage_step(where, entry[0])
        if starts and step <= starts[-1]:
            raise DataConfigError(
                f"{where} starts at step {step}, not after the previous stage's step "
                f"{starts[-1]}; stages must be sorted by strictly increasing step"
            )
        if not starts and step != 0:
            raise DataConfigError(f"{where} starts at step {step}; the first stage must start at 0")
        weights = entry[1]
        if hasattr(weights, "to_dict"):
            weights = weights.to_dict()
        if not isinstance(weights, Mapping):
            raise DataConfigError(f"{where} weights {weights!r} must be a dict {{name: weight}}")
        unknown = sorted(set(weights) - set(names))
        if unknown:
            raise DataConfigError(
                f"{where} names unknown components {unknown}; data.train declares {sorted(names)}"
            )
        row = [check_weight(f"{where}[{name!r}]", weights.get(name, 0.0)) for name in names]
        starts.append(step)
        stages.append(_normalised(f"{where} (step {step})", row))
    return MixtureSchedule(names, tuple(starts), tuple(stages))


def _stage_step(where: str, raw: Any) -> int:
    if isinstance(raw, str) and raw.strip().isdigit():
        raw = int(raw)  # JSON round trips turn dict keys into strings
    if isinstance(raw, bool) or not isinstance(raw, numbers.Integral) or raw < 0:
        raise DataConfigError(f"{where} has step {raw!r}; a stage step must be an int >= 0")
    return int(raw)


#: An online mixture update: from this data step on, these normalised weights.
MixtureUpdate = tuple[int, tuple[float, ...]]


def parse_mixture_weights(value: Any, names: Sequence[str], key: str) -> tuple[float, ...]:
    """`{name: weight}` validated against the datasets, normalised, in plan order.

    A dataset left out gets weight 0, as in a `data.mixture_schedule` stage.
    """
    if hasattr(value, "to_dict"):
        value = value.to_dict()
    if not isinstance(value, Mapping) or not value:
        raise DataConfigError(
            f"{key}={value!r} is invalid; expected a dict {{dataset name: weight}} over "
            f"{sorted(names)}"
        )
    unknown = sorted(set(value) - set(names))
    if unknown:
        raise DataConfigError(
            f"{key} names unknown datasets {unknown}; data.train declares {sorted(names)}"
        )
    row = [check_weight(f"{key}[{name!r}]", value.get(name, 0.0)) for name in names]
    return _normalised(key, row)


def with_updates(configured: MixtureSchedule, updates: Sequence[MixtureUpdate]) -> MixtureSchedule:
    """The configured stages with online updates laid over them.

    Each update holds from its step until the next update or the next
    configured stage, whichever starts first; at the same step the update
    wins. So an update never changes a step before its own, and configured
    stages (an annealing phase, say) still start where the config says.
    """
    entries: dict[int, tuple[float, ...]] = dict(
        zip(configured.starts, configured.weights, strict=True)
    )
    for start, weights in updates:
        entries[int(start)] = tuple(weights)
    starts = sorted(entries)
    return MixtureSchedule(configured.names, tuple(starts), tuple(entries[s] for s in starts))


def updates_to_pairs(names: Sequence[str], updates: Sequence[MixtureUpdate]) -> list[list[Any]]:
    """The JSON form `[[step, {name: weight}], ...]` of online updates."""
    return [[start, dict(zip(names, weights, strict=True))] for start, weights in updates]


def updates_from_pairs(pairs: Any, names: Sequence[str], key: str) -> list[MixtureUpdate]:
    """Online updates read back from their JSON form, in this plan's dataset order.

    A dataset the saving run did not have gets weight 0 in its updates; one
    it had and this run lacks is left out (the checkpoint's config check has
    already decided whether that change is allowed).
    """
    updates: list[MixtureUpdate] = []
    for index, entry in enumerate(pairs or ()):
        where = f"{key}[{index}]"
        if not isinstance(entry, list | tuple) or len(entry) != 2:
            raise DataConfigError(f"{where}={entry!r} is invalid; expected [step, {{name: w}}]")
        step = _stage_step(where, entry[0])
        if updates and step <= updates[-1][0]:
            raise DataConfigError(f"{where} at step {step} is not after the previous update")
        weights = entry[1] if isinstance(entry[1], Mapping) else {}
        kept = {name: w for name, w in weights.items() if name in names}
        updates.append((step, parse_mixture_weights(kept, names, where)))
    return updates
