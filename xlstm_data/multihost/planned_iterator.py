"""The multi-host iterator on the plan: its position is a step and V cursors.

Unlike the streaming iterator, whose state is one opaque grain state per
process, this one saves a record that does not mention hosts or workers: the
step, the logical-stream cursors (each process saves those of its own
streams; a restore merges all processes' files), a format version and the
plan's batch schedule. A checkpoint therefore resumes on another number of
processes, data hosts or workers with bitwise-identical global batches, and a
restore at step 10^7 costs one block of planning per stream, like one at 10.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import grain
import numpy as np
from absl import logging
from jax.sharding import Mesh

from xlstm_data.config.rampup import BatchSizeSchedule
from xlstm_data.errors import DataCheckpointError, DataConfigError
from xlstm_data.multihost.data_stats import count_batch
from xlstm_data.multihost.epoch_length import EpochLength
from xlstm_data.multihost.global_arrays import form_global_batch
from xlstm_data.multihost.host_layout import data_host_layout
from xlstm_data.multihost.iterator import MultiHostDataLoadIterator, _Prefetched
from xlstm_data.multihost.workers import prefetch_in_workers
from xlstm_data.plan.streams import PER_SOURCE_FIELDS, Cursor, GlobalPlan
from xlstm_data.reading.planned_batches import PlannedBatchDataset

#: Version of the planned state record; bump on format changes.
PLAN_STATE_VERSION = 3
PLAN_STATE_KIND = "plan"


def is_plan_state(state: Mapping[str, Any]) -> bool:
    return state.get("kind") == PLAN_STATE_KIND


class PlannedDataIterator(MultiHostDataLoadIterator):
    """Global batches of the plan, sharded over the mesh's data axes.

    Args:
      plan: The global plan (the same on every process).
      sources: Document sources in plan order.
      mesh: The global mesh.
      eod_token_id: Appended to every document.
      worker_count: Worker processes computing whole steps (speed only).
      worker_buffer_size: Steps each worker prepares ahead (the config's
        default, 4: see `data_config`'s defaults for the measurement).
      prefetch: Global batches prepared ahead in a background thread.
      read_threads: Threads reading a batch's documents.
      reset_after_epoch: Restart at step 0 after the last step (eval).
      batch_class: Class the field dict is turned into (e.g. `LLMBatch`).
      batch_axis_names: Mesh axes the batch rows are split over.
      data_config: The validated data config (fingerprinted in checkpoints).
      sources_by_name: Sources by name (for `source_documents` and tools).
    """

    def __init__(
        self,
        plan: GlobalPlan,
        sources: Sequence[Any],
        mesh: Mesh,
        *,
        eod_token_id: int,
        worker_count: int = 0,
        worker_buffer_size: int = 4,
        prefetch: int = 2,
        read_threads: int = 0,
        reset_after_epoch: bool = False,
        batch_class: Any = None,
        batch_axis_names: str | Sequence[str] | None = None,
        data_config: Any = None,
        sources_by_name: Mapping[str, Any] | None = None,
    ):
        self.plan = plan
        self._plan_sources = list(sources)
        self._eod_token_id = eod_token_id
        self.worker_count = worker_count
        self._worker_buffer_size = worker_buffer_size
        self._read_threads = read_threads
        num_steps = plan.num_steps()
        spec = plan.spec
        layout = data_host_layout(mesh, batch_axis_names)
        super().__init__(
            None,
            mesh,
            iterator_length=num_steps,
            dataset_size=sum(len(x) for x in plan.lengths),
            reset_after_epoch=reset_after_epoch,
            batch_class=batch_class,
            drop_remainder=spec.drop_remainder,
            prefetch=prefetch,
            sync_end=False,
            batch_schedule=BatchSizeSchedule(
                spec.batch.global_batch_size,
                spec.batch.rampup,
                data_parallel_size=layout.data_parallel_size,
                host_count=layout.host_count,
            ),
            component_names=spec.names,
            batch_axis_names=batch_axis_names,
            data_config=data_config,
            sources=sources_by_name,
        )
        if num_steps is not None:
            self.epoch_length = EpochLength(num_steps, exact=True)

    # Local pipeline ----------------------------------------------------------

    def _dataset(self, step: int, cursors: Mapping[int, Cursor] | None) -> grain.IterDataset:
        batches = PlannedBatchDataset(
            self.plan,
            self._plan_sources,
            self.layout.host_index,
            self.layout.host_count,
            self._eod_token_id,
            start_step=step,
            cursors=cursors,
            num_steps=self.plan.num_steps(),
            read_threads=self._read_threads,
        )
        dataset = batches.to_iter_dataset(grain.ReadOptions(num_threads=0))
        options = grain.MultiprocessingOptions(
            num_workers=self.worker_count, per_worker_buffer_size=self._worker_buffer_size
        )
        return prefetch_in_workers(dataset, options)

    def _restart(self, state: Mapping[str, Any] | None) -> None:
        self._check_open()
        self._stop_prefetch()
        self._close_local()
        step = 0 if state is None else int(state["step"])
        cursors = None if state is None else _cursors_from(state)
        self._owned.local_iterator = iter(self._dataset(step, cursors))
        self._stateful = False
        self._start_at(step)
        self._state_of_last = None if cursors is None else _cursor_lists(cursors)

    def _produce(self) -> _Prefetched:
        element = next(self._local_iterator)
        host = {k: np.asarray(v) for k, v in element["batch"].items()}
        counts = dataclasses.replace(
            count_batch(host, None, len(self.component_names)),
            component_tokens=np.asarray(element["source_tokens"], dtype=np.int64),
        )
        cursors = {int(row[0]): [int(v) for v in row[1:]] for row in element["cursors"]}
        device = form_global_batch(host, self.sharding, self.layout.host_count)
        return _Prefetched(host, device, cursors, counts)

    # State -------------------------------------------------------------------

    def get_state(self) -> dict[str, Any]:
        """The position after the last batch handed out (JSON-able, host-count free)."""
        cursors = self._state_of_last
        if cursors is None:  # nothing handed out since step 0
            start = self.plan.start_cursor().to_list()
            cursors = {s: start for s in self.plan.host_streams(*self._host())}
        return {
            "format_version": PLAN_STATE_VERSION,
            "kind": PLAN_STATE_KIND,
            "step": self.step_counter,
            "streams": self.plan.streams,
            "sources": list(self.plan.spec.names),
            "cursors": {str(s): list(c) for s, c in cursors.items()},
            "batch_schedule": self.plan.spec.batch.rampup.to_pairs(),
            "global_batch_size": self.plan.spec.batch.global_batch_size,
            "process_index": self.layout.process_index,
            "process_count": self.layout.process_count,
            "data_host_index": self.layout.host_index,
            "data_host_count": self.layout.host_count,
            "data_counters": self.data_counters.to_state(),
        }

    def _host(self) -> tuple[int, int]:
        return self.layout.host_index, self.layout.host_count

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Continues at a saved position, on any process, host or worker count.

        `state` is one process's `get_state()`, or several merged with
        `merge_plan_states` (a restore on another layout needs the cursors of
        every stream this host reads).
        """
        if is_plan_state(state) and state.get("format_version") != PLAN_STATE_VERSION:
            raise DataCheckpointError(
                f"the data position was saved in plan state format "
                f"{state.get('format_version')!r}; this version reads format "
                f"{PLAN_STATE_VERSION} only (format 3 added the rest of a document cut at a "
                "mixture stage boundary to each cursor). Resume with the xlstm-data version "
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
        self._check_schedule(state)
        step = int(state["step"])
        cursors = _cursors_from(state)
        missing = [s for s in self.plan.host_streams(*self._host()) if s not in cursors]
        if missing:
            raise DataCheckpointError(
                f"the saved data position at step {step} has no cursor for logical streams "
                f"{missing}, which data host {self.layout.host_index} of "
                f"{self.layout.host_count} reads; the checkpoint is missing process files"
            )
        remapped = _cursors_by_name(state, self.plan.spec.names)
        self._restart({"step": step, "cursors": remapped})
        counters = state.get("data_counters")
        if counters is not None:
            self.data_counters.set_state(counters)
        self.state_set = True

    def _check_schedule(self, state: Mapping[str, Any]) -> None:
        step = int(state["step"])
        saved = BatchSizeSchedule(int(state["global_batch_size"]), state["batch_schedule"])
        mine = self.plan.spec.batch
        changed = [
            s
            for s in {0, step - 1, *(t.start_step for t in saved.stages())}
            if 0 <= s < step and saved.global_batch_size_at(s) != mine.global_batch_size_at(s)
        ]
        if changed or saved.examples_seen(step) != mine.examples_seen(step):
            first = min(changed) if changed else step
            raise DataConfigError(
                f"data.rampup/data.global_batch_size changed the global batch size at already "
                f"trained step {first} (saved {saved.global_batch_size_at(first)} rows, now "
                f"{mine.global_batch_size_at(first)}); only stages after the checkpoint's step "
                f"{step} may change"
            )
        streams = int(state["streams"])
        if streams != self.plan.streams:
            raise DataCheckpointError(
                f"the checkpoint's plan has {streams} logical streams but this run's has "
                f"{self.plan.streams}; set data.logical_streams={streams} to resume it"
            )


def merge_plan_states(states: Sequence[Mapping[str, Any]], process_index: int) -> dict[str, Any]:
    """One state with every stream's cursor, from the files of all saving processes.

    The processes' steps must agree. Data counters are this process's if it
    saved one (same index), else started over (they are per-process totals).
    """
    steps = sorted({int(s["step"]) for s in states})
    if len(steps) != 1:
        raise DataCheckpointError(f"the processes' saved data steps disagree: {steps}")
    merged: dict[str, Any] = dict(states[0])
    cursors: dict[str, list[int]] = {}
    for state in states:
        for stream, cursor in state["cursors"].items():
            if cursors.setdefault(stream, cursor) != cursor:
                raise DataCheckpointError(
                    f"two processes saved different cursors for logical stream {stream} at "
                    f"step {steps[0]}: {cursors[stream]} and {cursor}"
                )
    merged["cursors"] = cursors
    own = [s for s in states if int(s["process_index"]) == process_index]
    same_layout = own and int(own[0]["process_count"]) == len(states)
    merged["data_counters"] = own[0].get("data_counters") if same_layout else None
    if not same_layout:
        logging.info("data counters start over: the process layout changed on restore")
    return merged


def _cursors_by_name(state: Mapping[str, Any], names: Sequence[str]) -> dict[str, list[int]]:
    """The saved cursors with their per-dataset counts in this plan's dataset order.

    A cursor's counts follow the saving run's datasets (`state["sources"]`);
    an allowed change of the datasets (one added, or one whose weight became 0
    in every stage and is no longer read) must not hand one dataset's position
    to another. A dataset new to the plan starts at its beginning.
    """
    saved = list(state.get("sources") or names)
    fields = len(PER_SOURCE_FIELDS)
    width = 2 + fields * len(saved)
    out = {}
    for stream, values in state["cursors"].items():
        if len(values) != width:
            raise DataCheckpointError(
                f"the saved cursor of logical stream {stream} holds {len(values)} values, not "
                f"{width} for the datasets {saved}; the data-state file is corrupted"
            )
        remapped = list(values[:2])
        for f, (_, default) in enumerate(PER_SOURCE_FIELDS):
            start = 2 + f * len(saved)
            by_name = dict(zip(saved, values[start : start + len(saved)], strict=True))
            remapped += [by_name.get(name, default) for name in names]
        out[stream] = remapped
    added, dropped = sorted(set(names) - set(saved)), sorted(set(saved) - set(names))
    if added or dropped:
        logging.warning(
            "resuming with other datasets: %s start at their beginning; %s are no longer read",
            added or "none",
            dropped or "none",
        )
    return out


def _cursors_from(state: Mapping[str, Any]) -> dict[int, Cursor]:
    return {int(s): Cursor.from_list(c) for s, c in state["cursors"].items()}


def _cursor_lists(cursors: Mapping[int, Cursor]) -> dict[int, list[int]]:
    return {s: c.to_list() for s, c in cursors.items()}
