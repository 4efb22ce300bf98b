"""A one-line progress report for the training loop, logged periodically.

Shows how far the run is, its speed and ETA, the latest loss, the current
batch size and how much of the wall time went into waiting for data, which
is what one looks at first when a run seems slow or stuck.

The line goes to the standard logger `trainer_hooks.progress` at INFO, and
that logger's level is INFO unless it was set before this module was
imported. absl's own threshold is WARNING outside `app.run`, so logging
through absl would hide the line in a plain script or notebook unless the
user knew to pass `--verbosity`; progress is the one INFO line a run should
always show. To silence it: `logging.getLogger("trainer_hooks.progress")
.setLevel(logging.WARNING)`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from trainer_hooks.periodic import StepAnchoredAction

logger = logging.getLogger(__name__)
if logger.level == logging.NOTSET:  # a level the user set first wins
    logger.setLevel(logging.INFO)


class ProgressHook(StepAnchoredAction):
    """Logs `step/total, steps/s, ETA, metrics, batch size, data wait`.

    The line is logged to `trainer_hooks.progress` (see the module docstring)
    and kept in `line`.

    Args:
      num_train_steps: Total steps of the run (for percent and ETA).
      every_steps: Report when the step is a multiple of this.
      every_secs: Report when this long has passed since the last report.
      iterator: The train iterator, for the batch size and data wait.
      metrics: Returns the latest scalar metrics to show (e.g. the loss);
        called only when a report is due.
      on_steps: Also report at these steps (the last step always reports).
      start_step: Steps already done when the loop starts.
    """

    def __init__(
        self,
        num_train_steps: int,
        *,
        every_steps: int | None = None,
        every_secs: float | None = 30.0,
        iterator: Any = None,
        metrics: Callable[[], Mapping[str, float]] | None = None,
        on_steps: Iterable[int] | None = None,
        start_step: int = 0,
    ):
        on_steps = {*(on_steps or ()), num_train_steps}
        super().__init__(
            every_steps=every_steps, every_secs=every_secs, on_steps=on_steps, start_step=start_step
        )
        self.num_train_steps = num_train_steps
        self.iterator = iterator
        self.metrics = metrics
        self._wait_at_previous = 0.0 if iterator is None else iterator.data_counters.wait_secs
        #: The latest report line.
        self.line = ""

    def _apply(self, step: int, t: float) -> None:
        elapsed = max(t - self._previous_time, 1e-9)
        rate = (step - self._previous_step) / elapsed
        eta = (self.num_train_steps - step) / rate if rate > 0 else float("inf")
        parts = [
            f"step {step}/{self.num_train_steps} ({100 * step / self.num_train_steps:.0f}%)",
            f"{rate:.1f} steps/s",
            f"ETA {_format_secs(eta)}",
        ]
        if self.metrics is not None:
            parts += [f"{k} {v:.4g}" for k, v in self.metrics().items()]
        if self.iterator is not None:
            parts.append(f"batch {self.iterator.last_batch_size()}")
            waited = self.iterator.data_counters.wait_secs
            parts.append(f"data wait {100 * (waited - self._wait_at_previous) / elapsed:.1f}%")
            self._wait_at_previous = waited
        self.line = " | ".join(parts)
        if not logging.root.handlers:
            # No logging set up (a plain script): absl.logging's own fallback.
            logging.basicConfig()
        logger.info("%s", self.line)


def _format_secs(secs: float) -> str:
    if secs == float("inf"):
        return "?"
    minutes, seconds = divmod(int(round(secs)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}" if hours else f"{minutes}:{seconds:02d}"
