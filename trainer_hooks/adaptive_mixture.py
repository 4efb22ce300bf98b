"""An adaptive mixture: the weights follow each dataset's loss, by exponentiated gradient.

Every `every_steps` steps the hook takes each dataset's mean loss L_i over
those steps and moves the weights w (the ones in force) as DoReMi does
(Xie et al., 2023, Algorithm 1; ADO, Jiang et al., 2024, adapts the same
mixture online):

    excess_i = max(L_i - reference_i, 0)
    a_i      = w_i * exp(step_size * excess_i)
    w'_i     = (1 - smoothing) * a_i / sum(a) + smoothing * p_i

where `reference_i` is the loss a reference model reaches on dataset i (0
when not configured: the hardest dataset then gains weight) and p the
configured weights at that step (`data.train.*.weight` or the mixture
stage). A dataset the config turns off stays off. The new weights, rounded to
1e-6, apply from the next data step through `iterator.set_mixture`, so they
are saved with the data position and a resumed run replays them.

What the hook sums between updates (loss and tokens per dataset) is its only
state; `CheckpointHook` saves it in the same orbax step as the model and the
data (`extra_items`), so a run resumed at any step, on any number of
processes, updates at the same steps from the same sums.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from absl import logging

from trainer_hooks.periodic import StepAnchoredAction
from trainer_hooks.source_losses import SourceLossMeter, mean_losses
from xlstm_data import DataConfigError

#: Name of the hook's item in a checkpoint step.
ADAPTIVE_MIXTURE_ITEM = "adaptive_mixture"
#: Weights are rounded to this, so a last-digit difference in a loss (another
#: process count sums in another order) rarely changes the batches.
WEIGHT_DECIMALS = 6


class AdaptiveMixtureHook(StepAnchoredAction):
    """Updates the train iterator's mixture every `every_steps` steps from per-dataset loss.

    Call `record_loss` after every train step, then the hook itself with the
    number of steps done, before `CheckpointHook` (so a checkpoint at an update
    step holds the update).

    Args:
      iterator: The planned train iterator (`set_mixture`, `source_names`).
      every_steps: Steps between updates.
      step_size: The exponentiated-gradient step (DoReMi: 1.0).
      smoothing: Weight of the configured mixture in each update, in [0, 1).
      reference_loss: `{dataset: loss}` of a reference model; 0 for the others.
      start_step: Steps already done when the loop starts.
    """

    def __init__(
        self,
        iterator: Any,
        *,
        every_steps: int,
        step_size: float = 1.0,
        smoothing: float = 0.1,
        reference_loss: Mapping[str, float] | None = None,
        start_step: int = 0,
    ):
        names = tuple(iterator.source_names)
        check_adaptive_mixture(every_steps, step_size, smoothing, reference_loss, names)
        super().__init__(every_steps=every_steps, start_step=start_step)
        self.iterator = iterator
        self.step_size = float(step_size)
        self.smoothing = float(smoothing)
        reference = dict(reference_loss or {})
        self.reference = np.array([float(reference.get(n, 0.0)) for n in names])
        self._losses = SourceLossMeter(names, iterator.global_mesh)
        self._restored: np.ndarray | None = None
        #: `{dataset: weight}` of the latest update (empty before the first).
        self.latest: dict[str, float] = {}

    def record_loss(self, token_loss: jax.Array, source_ids: jax.Array) -> None:
        """Adds a step's per-token loss (every step, on every process)."""
        self._losses.add(token_loss, source_ids)

    def next_weights(self, losses: np.ndarray, current: np.ndarray, prior: np.ndarray):
        """The update rule: new normalised weights from mean losses (NaN: no tokens)."""
        excess = np.where(np.isfinite(losses), np.maximum(losses - self.reference, 0.0), 0.0)
        raised = current * np.exp(self.step_size * (excess - excess.max()))
        raised = raised / raised.sum() if raised.sum() > 0 else prior
        mixed = (1.0 - self.smoothing) * raised + self.smoothing * prior
        return np.round(mixed / mixed.sum(), WEIGHT_DECIMALS)

    def _apply(self, step: int, t: float) -> None:
        del t
        totals = self._totals()
        if totals is None or not np.any(totals[1] > 0):
            return
        iterator = self.iterator
        from_step = iterator.data_step_at(iterator.step_counter)
        names = iterator.source_names
        current = iterator.mixture_weights_at(from_step)
        prior = iterator.mixture_weights_at(from_step, configured=True)
        weights = self.next_weights(
            mean_losses(totals),
            np.array([current[n] for n in names]),
            np.array([prior[n] for n in names]),
        )
        self.latest = dict(zip(names, weights.tolist(), strict=True))
        iterator.set_mixture(self.latest, from_step)
        logging.info("adaptive mixture at step %d: %s", step, self.latest)

    def _totals(self) -> np.ndarray | None:
        taken = self._losses.take()
        restored, self._restored = self._restored, None
        if restored is None:
            return taken
        return restored if taken is None else restored + taken

    # Checkpointing (CheckpointHook's extra_items) --------------------------------

    def state(self) -> dict[str, Any]:
        """The sums since the last update, JSON-able (fetched from the device)."""
        totals = self._totals()
        self._restored = totals
        return {"totals": None if totals is None else totals.tolist()}

    def set_state(self, state: Mapping[str, Any]) -> None:
        totals = state.get("totals")
        self._losses.take()
        self._restored = None if totals is None else np.asarray(totals, dtype=np.float64)


def check_adaptive_mixture(
    every_steps: Any, step_size: Any, smoothing: Any, reference_loss: Any, names: tuple[str, ...]
) -> None:
    """Refuses a bad `adaptive_mixture` section by key, before any data is read."""
    key = "adaptive_mixture"
    if isinstance(every_steps, bool) or not isinstance(every_steps, int) or every_steps < 1:
        raise DataConfigError(f"{key}.every_steps={every_steps!r} must be an int >= 1")
    if len(names) < 2:
        raise DataConfigError(
            f"{key}.every_steps={every_steps} adapts a mixture, but data.train declares "
            f"{len(names)} dataset {list(names)}; declare two or more, or set it to 0 (off)"
        )
    if not _number(step_size) or not 0 < step_size < math.inf:
        raise DataConfigError(
            f"{key}.step_size={step_size!r} is invalid; expected a finite number > 0"
        )
    if not _number(smoothing) or not 0 <= smoothing < 1:
        raise DataConfigError(
            f"{key}.smoothing={smoothing!r} is invalid; expected a number in [0, 1)"
        )
    if reference_loss is None:
        return
    if hasattr(reference_loss, "to_dict"):
        reference_loss = reference_loss.to_dict()
    if not isinstance(reference_loss, Mapping):
        raise DataConfigError(
            f"{key}.reference_loss={reference_loss!r} must be a dict {{dataset: loss}} or None"
        )
    unknown = sorted(set(reference_loss) - set(names))
    if unknown:
        raise DataConfigError(
            f"{key}.reference_loss names unknown datasets {unknown}; data.train declares "
            f"{sorted(names)}"
        )
    for name, value in reference_loss.items():
        if not _number(value) or not math.isfinite(value):
            raise DataConfigError(
                f"{key}.reference_loss[{name!r}]={value!r} is invalid; expected a finite number"
            )


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
