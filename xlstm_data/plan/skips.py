"""Steps of data skipped after a loss spike: which data step each trained step gets.

The plan is a function of the *data step*. `data.skip_steps = [[start, end],
...]` lists ranges of *training* steps whose data is never trained on: at
training step `start` the run jumps ahead by `end - start` data steps, so step
`start` trains on what step `end` would have, and every later step stays that
far ahead (ranges add up). Mixture stages and ramp-up stages are data steps,
so the batches that are trained on are exactly the ones an unskipped run
would have produced, minus the skipped ones.

The map is a pure function of the ranges, so a restart skips the same data on
any number of hosts; a range may be added when resuming from a checkpoint at
or before its start (`check_resume`), since the steps before are unchanged.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Sequence
from typing import Any

from xlstm_data.errors import DataCheckpointError, DataConfigError

DEFAULT_KEY = "data.skip_steps"
_EXAMPLE = "[[41000, 41400]]"


@dataclasses.dataclass(frozen=True)
class StepSkips:
    """Sorted, non-overlapping `[start, end)` ranges of training steps.

    Attributes:
      ranges: `(start, end)` pairs, `0 <= start < end`, each start at or
        after the previous end.
    """

    ranges: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        starts = [start for start, _ in self.ranges]
        object.__setattr__(self, "_starts", starts)
        offsets, total = [], 0
        for start, end in self.ranges:
            total += end - start
            offsets.append(total)
        object.__setattr__(self, "_offsets", offsets)

    def __bool__(self) -> bool:
        return bool(self.ranges)

    def data_step(self, step: int) -> int:
        """The data step whose planned batch training step `step` trains on."""
        passed = bisect.bisect_right(self._starts, step)
        return step + (self._offsets[passed - 1] if passed else 0)

    def train_steps_before(self, data_steps: int) -> int:
        """Training steps whose data step is below `data_steps` (a finite run's length)."""
        low, high = 0, data_steps
        while low < high:  # data_step is increasing: the first step at or past the end
            middle = (low + high) // 2
            if self.data_step(middle) < data_steps:
                low = middle + 1
            else:
                high = middle
        return low

    def skipped_data_steps(self) -> list[tuple[int, int]]:
        """The `[first, end)` ranges of data steps that no training step gets."""
        out, before = [], 0
        for start, end in self.ranges:
            out.append((start + before, end + before))
            before += end - start
        return out

    def to_pairs(self) -> list[list[int]]:
        return [[start, end] for start, end in self.ranges]

    def check_resume(self, saved: StepSkips, step: int, data_step: int) -> None:
        """Refuses ranges that would change steps already trained.

        Args:
          saved: The ranges of the run that saved the checkpoint.
          step: The checkpoint's training step (steps before it are trained).
          data_step: The data step the saved position continues at.

        Raises:
          DataCheckpointError: If a range starting before `step` was added,
            removed or changed.
        """
        before = [r for r in self.ranges if r[0] < step]
        saved_before = [r for r in saved.ranges if r[0] < step]
        if before != saved_before:
            added = sorted(set(before) - set(saved_before))
            removed = sorted(set(saved_before) - set(before))
            what = (
                f"range [{added[0][0]}, {added[0][1]}) starts before"
                if added
                else f"range [{removed[0][0]}, {removed[0][1]}), which the checkpointed run "
                "followed, was removed or changed before"
            )
            raise DataCheckpointError(
                f"{DEFAULT_KEY}={self.to_pairs()}: {what} the checkpoint's step {step}, whose "
                f"steps are trained already (the checkpoint's ranges: {saved.to_pairs()}); "
                f"ranges added on resume must start at step {step} or later"
            )
        if self.data_step(step) < data_step:  # cannot happen with equal past ranges
            raise DataCheckpointError(
                f"{DEFAULT_KEY}={self.to_pairs()} would give step {step} the data of step "
                f"{self.data_step(step)}, before the saved position at data step {data_step}"
            )


#: No step skipped.
NO_SKIPS = StepSkips()


def parse_skip_steps(value: Any, key: str = DEFAULT_KEY) -> StepSkips:
    """Validates `data.skip_steps`: None, or a list of `[start, end]` pairs."""
    if value is None:
        return NO_SKIPS
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise DataConfigError(
            f"{key}={value!r} is invalid; expected a list of [start, end] training-step "
            f"ranges, e.g. {_EXAMPLE}"
        )
    ranges: list[tuple[int, int]] = []
    for entry in value:
        pair = list(entry) if isinstance(entry, Sequence) and not isinstance(entry, str) else None
        valid = (
            pair is not None
            and len(pair) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) for v in pair)
            and 0 <= pair[0] < pair[1]
        )
        if not valid:
            raise DataConfigError(
                f"{key}: entry {entry!r} is invalid; each entry is [start, end] with integer "
                f"steps 0 <= start < end (the data of steps start..end-1 is skipped), e.g. "
                f"{_EXAMPLE}"
            )
        ranges.append((pair[0], pair[1]))
    for (a, b), (c, d) in zip(ranges, ranges[1:], strict=False):
        if c < b:
            order = "unsorted" if c < a else "overlapping"
            raise DataConfigError(
                f"{key}={[list(r) for r in ranges]}: ranges [{a}, {b}) and [{c}, {d}) are "
                f"{order}; give ranges sorted by start that do not overlap, e.g. "
                "[[100, 200], [500, 600]]"
            )
    return StepSkips(tuple(ranges))
