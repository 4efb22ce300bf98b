"""A periodic action that knows the step it starts from.

jax-loop-utils' `PeriodicAction` treats its first call as the reference point
and never triggers on it. A resumed run's first step can be exactly the one
that should save, report or be the last, so our hooks take `start_step` (the
steps already done) and count from there: the first call can trigger, and
intervals are measured from construction.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from jax_loop_utils import periodic_actions


class StepAnchoredAction(periodic_actions.PeriodicAction):
    """`PeriodicAction` whose reference point is `start_step`, set at construction.

    Args:
      every_steps: Trigger when the step is a multiple of this.
      every_secs: Trigger when this long has passed since the last trigger.
      on_steps: Also trigger at these steps.
      start_step: Steps already done when the loop starts (0, or the
        restored step); the first call is expected with `start_step + 1`.
    """

    def __init__(
        self,
        *,
        every_steps: int | None = None,
        every_secs: float | None = None,
        on_steps: Iterable[int] | None = None,
        start_step: int = 0,
    ):
        super().__init__(every_steps=every_steps, every_secs=every_secs, on_steps=on_steps)
        self._previous_step = start_step
        self._last_step = start_step
        self._previous_time = time.monotonic()
