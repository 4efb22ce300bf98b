"""The saved position of a data iterator: a step and one cursor of the plan.

The record does not mention hosts or workers: the step, the plan's cursor
(the same in every process's file), a format version, the plan's batch
schedule and the mixture in force, online updates included. A checkpoint
therefore resumes on another number of processes, data hosts or workers
with bitwise-identical global batches, and a restore at step 10^7 costs one
block of planning per source, like one at 10.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from absl import logging

from xlstm_data.errors import DataCheckpointError
from xlstm_data.plan.global_plan import HEADER_FIELDS, PER_SOURCE_FIELDS

#: Version of the planned state record; bump on format changes.
PLAN_STATE_VERSION = 5
PLAN_STATE_KIND = "plan"
#: Format 4 cursors lack the per-source `offset` of format 5 (a `concat` block
#: completing its last row from the next documents): they read as offset 0,
#: which is exact for every packing but `concat`, whose blocks it changed.
_FORMAT_4 = 4


def is_plan_state(state: Mapping[str, Any]) -> bool:
    return state.get("kind") == PLAN_STATE_KIND


def check_state_format(state: Mapping[str, Any], packing: str) -> None:
    """Refuses a position this version cannot continue, saying what to do instead.

    Args:
      state: The saved position.
      packing: The plan's `data.packing` (format 4 continues only without `concat`).
    """
    version = state.get("format_version")
    readable = version == PLAN_STATE_VERSION or (version == _FORMAT_4 and packing != "concat")
    if is_plan_state(state) and not readable:
        raise DataCheckpointError(
            f"the data position was saved in plan state format {version!r}; this version "
            f"reads format {PLAN_STATE_VERSION}, and format {_FORMAT_4} without "
            "data.packing='concat' (format 5 fills every concat row from the next "
            "documents, so concat plans differ). Resume with the xlstm-data version "
            "that saved it, or restore the model only and restart the data deliberately "
            "(--start_data_fresh)"
        )
    if not is_plan_state(state):
        raise DataCheckpointError(
            f"the data position (format_version={state.get('format_version')!r}, kind="
            f"{state.get('kind')!r}) was not saved by the planned iterator (format_version="
            f"{PLAN_STATE_VERSION}); it was written by the streaming pipeline of an older "
            "version, which cannot be carried over. Restore the model only and restart the "
            "data deliberately (--start_data_fresh)"
        )
    if "cursor" not in state:
        raise DataCheckpointError(
            f"the saved data position at step {state.get('step')} has no cursor; the "
            "data-state file is corrupted"
        )


def merge_plan_states(states: Sequence[Mapping[str, Any]], process_index: int) -> dict[str, Any]:
    """One state from the files of all saving processes (they must agree).

    Data counters are this process's if it saved one (same index), else
    started over (they are per-process totals).
    """
    steps = sorted({int(s["step"]) for s in states})
    if len(steps) != 1:
        raise DataCheckpointError(f"the processes' saved data steps disagree: {steps}")
    merged: dict[str, Any] = dict(states[0])
    for state in states[1:]:
        if state.get("mixture_updates") != merged.get("mixture_updates"):
            raise DataCheckpointError(
                f"two processes saved different online mixture updates at step {steps[0]} "
                f"(processes {merged.get('process_index')} and {state.get('process_index')}); "
                "set_mixture must be called with the same arguments on every process"
            )
        if state.get("cursor") != merged.get("cursor"):
            raise DataCheckpointError(
                f"two processes saved different data cursors at step {steps[0]}: "
                f"{merged.get('cursor')} (process {merged.get('process_index')}) and "
                f"{state.get('cursor')} (process {state.get('process_index')})"
            )
    own = [s for s in states if int(s["process_index"]) == process_index]
    same_layout = own and int(own[0]["process_count"]) == len(states)
    merged["data_counters"] = own[0].get("data_counters") if same_layout else None
    if not same_layout:
        logging.info("data counters start over: the process layout changed on restore")
    return merged


def cursor_by_name(state: Mapping[str, Any], names: Sequence[str]) -> list[int]:
    """The saved cursor with its per-dataset values in this plan's dataset order.

    A cursor's values follow the saving run's datasets (`state["sources"]`);
    an allowed change of the datasets (one added, or one whose weight became 0
    in every stage and is no longer read) must not hand one dataset's position
    to another. A dataset new to the plan starts at its beginning.
    """
    saved = list(state.get("sources") or names)
    values = list(state["cursor"])
    fields = len(PER_SOURCE_FIELDS) - int(state.get("format_version") == _FORMAT_4)
    width = HEADER_FIELDS + fields * len(saved)
    if len(values) != width:
        raise DataCheckpointError(
            f"the saved data cursor holds {len(values)} values, not {width} for the datasets "
            f"{saved}; the data-state file is corrupted"
        )
    remapped = values[:HEADER_FIELDS]
    for f, (_, default) in enumerate(PER_SOURCE_FIELDS):
        start = HEADER_FIELDS + f * len(saved)
        held = values[start : start + len(saved)] if f < fields else [default] * len(saved)
        by_name = dict(zip(saved, held, strict=True))
        remapped += [by_name.get(name, default) for name in names]
    added, dropped = sorted(set(names) - set(saved)), sorted(set(saved) - set(names))
    if added or dropped:
        logging.warning(
            "resuming with other datasets: %s start at their beginning; %s are no longer read",
            added or "none",
            dropped or "none",
        )
    return remapped


def saved_data_step(state: Mapping[str, Any]) -> int:
    """The data step a saved position continues at (its step, before skips existed)."""
    return int(state.get("data_step", state["step"]))
