"""Which documents fill each row of a step: the plan asked directly, nothing read.

After a loss spike the question is which documents were in the steps before
it. The plan answers from document lengths alone, for any step, without
reading any data and without a running iterator: a planner over the whole
global batch (one "host") walks the plan forward to the step, from its
start or from a checkpoint's cursor. The rows it lists are the
rows the iterator hands out at that step, on any number of processes; which
data host (and so which process) holds a row follows from the host count.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator

from xlstm_data.errors import DataConfigError
from xlstm_data.plan.global_plan import Cursor, GlobalPlan, HostPlanner
from xlstm_data.plan.skips import NO_SKIPS, StepSkips


@dataclasses.dataclass(frozen=True)
class Piece:
    """Positions `[start, stop)` of one document's example stream in a row.

    The example stream is the document's tokens followed by the
    end-of-document id, and preceded by it too (`offset` 1) when inputs are
    shifted right (`data.shift_target=False`).
    """

    source: str
    document: int
    start: int
    stop: int
    tokens: int
    offset: int = 0

    @property
    def token_range(self) -> tuple[int, int]:
        """`[first, last)` of the document's tokens in the piece (EOD positions left out)."""
        first = min(max(self.start - self.offset, 0), self.tokens)
        return first, min(max(self.stop - self.offset, 0), self.tokens)


@dataclasses.dataclass(frozen=True)
class RowContents:
    """One row of the global batch at a training step."""

    step: int
    data_step: int
    row: int
    data_host: int
    pieces: tuple[Piece, ...]

    def to_json(self) -> dict:
        return {
            "step": self.step,
            "data_step": self.data_step,
            "row": self.row,
            "data_host": self.data_host,
            "process": self.data_host,
            "documents": [dataclasses.asdict(p) for p in self.pieces],
        }


def check_host_count(plan: GlobalPlan, skips: StepSkips, steps: Iterable[int], hosts: int) -> None:
    """Refuses a host count that does not divide some listed step's batch."""
    for step in steps:
        batch = plan.spec.batch.global_batch_size_at(skips.data_step(step))
        if hosts < 1 or batch % hosts:
            divisors = [d for d in range(1, batch + 1) if batch % d == 0]
            raise DataConfigError(
                f"--processes={hosts}: step {step} has a global batch of {batch} rows, which "
                f"does not divide over {hosts} data hosts; valid: {divisors}"
            )


def step_rows(
    plan: GlobalPlan,
    steps: Iterable[int],
    *,
    skips: StepSkips = NO_SKIPS,
    hosts: int = 1,
    cursor: Cursor | None = None,
) -> Iterator[RowContents]:
    """The rows of each training step in `steps` (increasing), with their pieces.

    Args:
      plan: The run's plan.
      steps: Training steps, increasing (an earlier one plans again from the cursor).
      skips: The run's skipped steps (`data.skip_steps`).
      hosts: Data hosts the rows are dealt to (one per process, usually).
      cursor: The plan's cursor at a data step at or before the first step's
        (a checkpoint's), or None to plan from step 0.
    """
    steps = list(steps)
    check_host_count(plan, skips, steps, hosts)
    num_steps = plan.num_steps()
    planner = HostPlanner(plan, 0, 1, cursor)
    names = plan.spec.names
    offset = 1 if plan.spec.shift and not plan.spec.shift_target else 0
    for step in steps:
        data_step = skips.data_step(step)
        if num_steps is not None and data_step >= num_steps:
            raise DataConfigError(
                f"step {step} (--step/--steps): the run ends after "
                f"{skips.train_steps_before(num_steps)} steps "
                f"(data.num_epochs={plan.spec.num_epochs}); valid steps: 0.."
                f"{skips.train_steps_before(num_steps) - 1}"
            )
        pieces = planner.pieces_at(data_step)
        per_host = pieces.rows // hosts
        for row in range(pieces.rows):
            listed = tuple(
                Piece(
                    names[source],
                    document,
                    start,
                    stop,
                    int(plan.lengths[source][document]),
                    offset,
                )
                for source, document, start, stop in pieces.row_list(row)
            )
            yield RowContents(step, data_step, row, row // per_host, listed)
