"""Config changes a resume accepts without being told: they only touch untrained steps.

A checkpoint's data position is the plan's position at a data step. The plan
before that step is what the run trained on; after it, the plan may differ.
New mixture stages (or new weights) from the checkpoint's data step on, and
new `data.skip_steps` ranges from it on, are accepted here; a change that
reaches back before the checkpoint is refused, naming the first step it
changes, unless `allow_data_config_change` allows it. The iterator refuses
skip ranges before its data step. Stages are causal (`plan.mixing`): a stage
from the checkpoint's step on changes no row before it, so such a change
resumes exactly.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

#: The changed keys this module judges (the iterator checks `data.skip_steps` itself).
SKIP_KEY = "data.skip_steps"
SCHEDULE_KEY = "data.mixture_schedule"


def is_mixture_key(key: str) -> bool:
    return key == SCHEDULE_KEY or (key.startswith("data.train.") and key.endswith(".weight"))


def mixture_stages(flat: Mapping[str, Any]) -> list[tuple[int, dict[str, float]]]:
    """`[(first step, {name: normalised weight})]` of a flattened data config."""
    pairs = flat.get(SCHEDULE_KEY)
    if pairs:
        stages = [(int(s), {n: float(w) for n, w in weights.items()}) for s, weights in pairs]
    else:
        weights = {
            key[len("data.train.") : -len(".weight")]: float(value)
            for key, value in flat.items()
            if key.startswith("data.train.") and key.endswith(".weight") and key.count(".") == 3
        }
        stages = [(0, weights)]
    out = []
    for start, weights in stages:
        total = sum(weights.values()) or 1.0
        out.append((start, {n: w / total for n, w in weights.items() if w > 0}))
    return out


def first_mixture_difference(
    saved: Mapping[str, Any], current: Mapping[str, Any], before: int
) -> int | None:
    """The first step before `before` whose mixture weights differ (None: none do)."""
    old, new = mixture_stages(saved), mixture_stages(current)
    steps = sorted({s for s, _ in old} | {s for s, _ in new})
    for step in (s for s in steps if s < before):
        a, b = _weights_at(old, step), _weights_at(new, step)
        names = set(a) | set(b)
        if any(not math.isclose(a.get(n, 0.0), b.get(n, 0.0), abs_tol=1e-12) for n in names):
            return step
    return None


def _weights_at(stages: Sequence[tuple[int, dict[str, float]]], step: int) -> dict[str, float]:
    current = stages[0][1]
    for start, weights in stages:
        if start <= step:
            current = weights
    return current


def future_only_changes(
    changes: Sequence[tuple[str, Any, Any]],
    saved: Mapping[str, Any],
    current: Mapping[str, Any],
    data_step: int,
) -> tuple[list[tuple[str, Any, Any]], str | None]:
    """Splits off the changes that only concern steps not trained yet.

    Args:
      changes: `(key, saved, current)` of every changed key.
      saved: The checkpoint's flattened data config.
      current: This run's.
      data_step: The data step the checkpoint continues at.

    Returns:
      `(accepted changes, why the mixture change is not accepted, or None)`.
      The mixture keys are accepted when the weights agree at every step
      before `data_step`; `data.skip_steps` always is (the iterator refuses
      ranges before the checkpoint's step).
    """
    mixture = [c for c in changes if is_mixture_key(c[0])]
    accepted = [c for c in changes if c[0] == SKIP_KEY]
    reason = None
    if mixture:
        step = first_mixture_difference(saved, current, data_step)
        if step is None:
            accepted += mixture
        else:
            reason = (
                f"the mixture weights change at step {step}, before the checkpoint's data step "
                f"{data_step} (already trained); only stages from step {data_step} on may change "
                "on resume"
            )
    return accepted, reason
