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
from xlstm_data.plan.mixture import MixtureSchedule
from xlstm_data.plan.skips import NO_SKIPS, StepSkips
from xlstm_data.plan.streams import PER_SOURCE_FIELDS, Cursor, GlobalPlan
from xlstm_data.reading.planned_batches import PlannedBatchDataset
from xlstm_data.sources.identity import dataset_files, dataset_identities

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
      skips: Data steps never trained on (`data.skip_steps`); the plan, its
        mixture and ramp-up stages, are indexed by data step.
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
        skips: StepSkips = NO_SKIPS,
    ):
        self.plan = plan
        self.skips = skips
        self._identities: dict[str, dict[str, Any]] | None = None
        self._files: dict[str, dict[str, list[int]]] | None = None
        self._plan_sources = list(sources)
        self._eod_token_id = eod_token_id
        self.worker_count = worker_count
        self._worker_buffer_size = worker_buffer_size
        self._read_threads = read_threads
        data_steps = plan.num_steps()
        num_steps = None if data_steps is None else skips.train_steps_before(data_steps)
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
            num_steps=self.iterator_length,
            read_threads=self._read_threads,
            skips=self.skips,
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
        self._state_of_last = None
        if state is not None:
            self._state_of_last = {
                "data_step": saved_data_step(state),
                "cursors": _cursor_lists(cursors),
            }

    def _produce(self) -> _Prefetched:
        element = next(self._local_iterator)
        host = {k: np.asarray(v) for k, v in element["batch"].items()}
        documents, split = (int(v) for v in element["piece_counts"])
        counts = dataclasses.replace(
            count_batch(host, None, len(self.component_names)),
            component_tokens=np.asarray(element["source_tokens"], dtype=np.int64),
            documents=documents,
            split_documents=split,
        )
        cursors = {int(row[0]): [int(v) for v in row[1:]] for row in element["cursors"]}
        device = form_global_batch(host, self.sharding, self.layout.host_count)
        position = {"data_step": int(element["data_step"]) + 1, "cursors": cursors}
        return _Prefetched(host, device, position, counts)

    @property
    def source_identities(self) -> dict[str, dict[str, Any]]:
        """Per train dataset, its files' digest, lengths checksum and tokenizer (checkpointed)."""
        if self._identities is None:
            plan = self.plan
            self._identities = dataset_identities(self.sources, plan.spec.names, plan.lengths)
        return self._identities

    @property
    def source_files(self) -> dict[str, dict[str, list[int]]]:
        """Per train dataset with files, `{path: [bytes, mtime_ns]}` (process 0 records it)."""
        if self._files is None:
            self._files = dataset_files(self.sources)
        return self._files

    # Steps -------------------------------------------------------------------

    def data_step_at(self, step: int) -> int:
        """The data step (of the plan) behind the batch handed out at training step `step`."""
        return self.skips.data_step(step)

    def mixture_stage_at(self, step: int) -> tuple[int, dict[str, float]]:
        """`(stage index, {dataset: planned token share})` of the batch at training step `step`."""
        stage = self.plan.spec.mixture.stage_at(self.data_step_at(step))
        shares = self.plan.token_shares(stage)
        return stage, dict(zip(self.plan.spec.names, shares.tolist(), strict=True))

    def batch_size_at(self, step: int) -> int:
        return self.plan.spec.batch.global_batch_size_at(self.data_step_at(step))

    def _host_batch_size_at(self, step: int) -> int:
        return self.batch_size_at(step) // self.layout.host_count

    def examples_seen(self, step: int | None = None) -> int:
        """Global rows handed out before training step `step` (skipped steps' rows not counted)."""
        step = self.step_counter if step is None else step
        batch = self.plan.spec.batch
        data_step = self.data_step_at(step)
        seen = batch.examples_seen(data_step)
        for first, end in self.skips.ranges:
            if end <= data_step:
                seen -= batch.examples_seen(end) - batch.examples_seen(first)
        return seen

    # State -------------------------------------------------------------------

    def get_state(self) -> dict[str, Any]:
        """The position after the last batch handed out (JSON-able, host-count free)."""
        position = self._state_of_last
        if position is None:  # nothing handed out since step 0
            start = self.plan.start_cursor().to_list()
            cursors = {s: start for s in self.plan.host_streams(*self._host())}
            position = {"data_step": 0, "cursors": cursors}
        return {
            "format_version": PLAN_STATE_VERSION,
            "kind": PLAN_STATE_KIND,
            "step": self.step_counter,
            # The cursors' position: the data step after the last one handed out.
            "data_step": position["data_step"],
            "skip_steps": self.skips.to_pairs(),
            "streams": self.plan.streams,
            "sources": list(self.plan.spec.names),
            "cursors": {str(s): list(c) for s, c in position["cursors"].items()},
            "batch_schedule": self.plan.spec.batch.rampup.to_pairs(),
            "mixture_schedule": self.plan.spec.mixture.to_pairs(),
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
        step = int(state["step"])
        saved_skips = StepSkips(tuple(tuple(r) for r in state.get("skip_steps", ())))
        self.skips.check_resume(saved_skips, saved_data_step(state))
        self._check_schedule(state)
        cursors = _cursors_from(state)
        missing = [s for s in self.plan.host_streams(*self._host()) if s not in cursors]
        if missing:
            raise DataCheckpointError(
                f"the saved data position at step {step} has no cursor for logical streams "
                f"{missing}, which data host {self.layout.host_index} of "
                f"{self.layout.host_count} reads; the checkpoint is missing process files"
            )
        remapped = cursors_by_name(state, self.plan.spec.names)
        self._restart({"step": step, "data_step": saved_data_step(state), "cursors": remapped})
        counters = state.get("data_counters")
        if counters is not None:
            self.data_counters.set_state(counters)
        self.state_set = True

    def earliest_exact_stage_step(self, state: Mapping[str, Any]) -> int | None:
        """Where new mixture stages would have to start for a saved position to resume exactly.

        Each stream's cursor is the start of the block holding the saved data
        step. If this plan's stages plan that block's rows before the step
        otherwise than the saved stages did, returns the first step after the
        block (over the saved streams); None when they agree (or the saved
        position records no stages: then nothing can be compared).
        """
        spec = self.plan.spec
        saved = state.get("mixture_schedule")
        if not saved or {n for n in saved[0][1]} != set(spec.names):
            return None
        old = MixtureSchedule(
            spec.names,
            tuple(int(start) for start, _ in saved),
            tuple(tuple(float(weights[n]) for n in spec.names) for _, weights in saved),
        )
        if old == spec.mixture:
            return None
        old_plan = GlobalPlan(dataclasses.replace(spec, mixture=old), self.plan.lengths)
        row, _ = self.plan.stream_rows(saved_data_step(state))
        latest = None
        for stream, cursor in _cursors_from(
            {"cursors": cursors_by_name(state, spec.names)}
        ).items():
            trained = row - cursor.row
            if trained <= 0:  # the checkpoint is at the block's start: nothing trained of it
                continue
            before, following, _ = old_plan.plan_block(stream, cursor)
            after, _, _ = self.plan.plan_block(stream, cursor)
            if after.rows < trained or not before.row_slice(0, trained).equals(
                after.row_slice(0, trained)
            ):
                end = old_plan.step_of_stream_row(following.row - 1) + 1
                latest = end if latest is None else max(latest, end)
        return latest

    def _check_schedule(self, state: Mapping[str, Any]) -> None:
        step = saved_data_step(state)  # ramp-up stages are data steps
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


def cursors_by_name(state: Mapping[str, Any], names: Sequence[str]) -> dict[str, list[int]]:
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


def saved_data_step(state: Mapping[str, Any]) -> int:
    """The data step a saved position continues at (its step, before skips existed)."""
    return int(state.get("data_step", state["step"]))


def _cursors_from(state: Mapping[str, Any]) -> dict[int, Cursor]:
    return {int(s): Cursor.from_list(c) for s, c in state["cursors"].items()}


def _cursor_lists(cursors: Mapping[int, Cursor]) -> dict[int, list[int]]:
    return {s: c.to_list() for s, c in cursors.items()}
