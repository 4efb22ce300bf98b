"""Steps of data skipped after a loss spike: which data step each trained step gets.

The plan is a function of the *data step*: the batch planned for step s.
`data.skip_steps = [[start, end], ...]` lists ranges of data steps that are
never trained on. Training steps walk the data steps in order and jump over
each range: without earlier ranges, training step `start` trains on the batch
planned for step `end`. Ranges are data steps, the numbers `xlstm-data batch`
and the batch log (`data_step`) show, so a second spike after a first skip is
named in the same numbers. Mixture and ramp-up stages are data steps too, so
the batches that are trained on are exactly those of an unskipped run, minus
the skipped ones.

The map is a pure function of the ranges, so a restart skips the same data on
any number of hosts. A range may be added when resuming from a checkpoint
whose data position is at or before its start (`check_resume`): the data
before it is unchanged.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from xlstm_data.errors import DataCheckpointError, DataConfigError

DEFAULT_KEY = "data.skip_steps"
_EXAMPLE = "[[41000, 41400]]"


@dataclasses.dataclass(frozen=True)
class StepSkips:
    """Sorted, non-overlapping `[start, end)` ranges of data steps never trained on.

    Attributes:
      ranges: `(start, end)` pairs, `0 <= start < end`, each start at or
        after the previous end.
    """

    ranges: tuple[tuple[int, int], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.ranges)

    def data_step(self, step: int) -> int:
        """The data step whose planned batch training step `step` trains on."""
        data_step = step
        for start, end in self.ranges:  # sorted: each jump can only reach later ranges
            if data_step >= start:
                data_step += end - start
        return data_step

    def train_steps_before(self, data_steps: int) -> int:
        """Training steps whose data step is below `data_steps` (a finite run's length).

        Every data step outside the ranges is trained on exactly once.
        """
        skipped = sum(
            min(end, data_steps) - start for start, end in self.ranges if start < data_steps
        )
        return data_steps - skipped

    def to_pairs(self) -> list[list[int]]:
        return [[start, end] for start, end in self.ranges]

    def check_resume(self, saved: StepSkips, data_step: int) -> None:
        """Refuses ranges that would change data already trained on.

        Args:
          saved: The ranges of the run that saved the checkpoint.
          data_step: The data step the saved position continues at (every
            data step before it was trained on or skipped already).

        Raises:
          DataCheckpointError: If a range starting before `data_step` was
            added, removed or changed.
        """
        before = [r for r in self.ranges if r[0] < data_step]
        saved_before = [r for r in saved.ranges if r[0] < data_step]
        if before == saved_before:
            return
        added = sorted(set(before) - set(saved_before))
        removed = sorted(set(saved_before) - set(before))
        what = (
            f"range [{added[0][0]}, {added[0][1]}) starts before"
            if added
            else f"range [{removed[0][0]}, {removed[0][1]}), which the checkpointed run "
            "followed, was removed or changed before"
        )
        raise DataCheckpointError(
            f"{DEFAULT_KEY}={self.to_pairs()}: {what} the checkpoint's data step {data_step}, "
            f"whose data is trained on already (the checkpoint's ranges: {saved.to_pairs()}); "
            f"ranges added on resume must start at data step {data_step} or later"
        )


#: No step skipped.
NO_SKIPS = StepSkips()


def parse_skip_steps(value: Any, key: str = DEFAULT_KEY) -> StepSkips:
    """Validates `data.skip_steps`: None, or a list of `[start, end]` pairs."""
    if value is None:
        return NO_SKIPS
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise DataConfigError(
            f"{key}={value!r} is invalid; expected a list of [start, end] ranges of data "
            f"steps, e.g. {_EXAMPLE}"
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
                f"data steps 0 <= start < end (the data of steps start..end-1 is skipped), e.g. "
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
