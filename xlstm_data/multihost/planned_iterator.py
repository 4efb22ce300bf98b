"""The multi-host iterator on the plan: its position is a step and one cursor.

Unlike the streaming iterator, whose state is one opaque grain state per
process, this one saves a record that does not mention hosts or workers: the
step, the plan's cursor (the same in every process's file), a format version,
the plan's batch schedule and the mixture in force, online updates included.
A checkpoint therefore resumes on another number of processes, data hosts or
workers with bitwise-identical global batches, and a restore at step 10^7
costs one block of planning per source, like one at 10.
"""

from __future__ import annotations

import dataclasses
import hashlib
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import grain
import numpy as np
from absl import logging
from jax.experimental import multihost_utils
from jax.sharding import Mesh

from xlstm_data.config.rampup import BatchSizeSchedule
from xlstm_data.errors import DataCheckpointError, DataConfigError
from xlstm_data.multihost.data_stats import count_batch
from xlstm_data.multihost.epoch_length import EpochLength
from xlstm_data.multihost.global_arrays import form_global_batch
from xlstm_data.multihost.host_layout import data_host_layout
from xlstm_data.multihost.iterator import MultiHostDataLoadIterator, _Prefetched
from xlstm_data.multihost.worker_handover import WorkerHandover
from xlstm_data.multihost.workers import prefetch_in_workers
from xlstm_data.plan.global_plan import HEADER_FIELDS, PER_SOURCE_FIELDS, Cursor, GlobalPlan
from xlstm_data.plan.mixture import (
    MixtureUpdate,
    parse_mixture_weights,
    updates_from_pairs,
    updates_to_pairs,
    with_updates,
)
from xlstm_data.plan.skips import NO_SKIPS, StepSkips
from xlstm_data.reading.planned_batches import PlannedBatchDataset
from xlstm_data.reading.row_assembly import fields_of
from xlstm_data.sources.identity import dataset_files, dataset_identities
from xlstm_data.sources.lengths_cache import tokenizer_identity

#: Version of the planned state record; bump on format changes.
PLAN_STATE_VERSION = 4
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
        #: The config's mixture stages; online updates are laid over them.
        self._configured_mixture = plan.spec.mixture
        self._mixture_updates: list[MixtureUpdate] = []
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

    def _batches(self, step: int, cursor: Cursor | None) -> PlannedBatchDataset:
        return PlannedBatchDataset(
            self.plan,
            self._plan_sources,
            self.layout.host_index,
            self.layout.host_count,
            self._eod_token_id,
            start_step=step,
            cursor=cursor,
            num_steps=self.iterator_length,
            read_threads=self._read_threads,
            skips=self.skips,
        )

    def _pipeline(self, step: int, cursor: Cursor | None) -> Any:
        """This host's batches from training step `step` (a cursor at or before it).

        With workers, the first `2 * worker_count * worker_buffer_size` steps
        are computed here while the workers start, and the workers begin after
        them (`WorkerHandover`). Twice what the workers keep ready: with half
        as many, the loop still waited 0.27 s per restart (2 workers, 0.1 s
        steps, bench/plan_mixture), with this many 0.02 s.
        """
        read = grain.ReadOptions(num_threads=0)
        batches = self._batches(step, cursor)
        handover = min(2 * self.worker_count * self._worker_buffer_size, len(batches))
        if handover == len(batches):  # includes worker_count 0
            return iter(batches.to_iter_dataset(read))
        options = grain.MultiprocessingOptions(
            num_workers=self.worker_count, per_worker_buffer_size=self._worker_buffer_size
        )
        # Each worker walks the plan from the cursor to its own steps.
        later = self._batches(step + handover, cursor).to_iter_dataset(read)
        return WorkerHandover(
            iter(batches[:handover].to_iter_dataset(read)), prefetch_in_workers(later, options)
        )

    def _restart(self, state: Mapping[str, Any] | None) -> None:
        self._check_open()
        self._stop_prefetch()
        local = self._owned.local_iterator
        if isinstance(local, WorkerHandover):  # the new pipeline need not wait for it
            local.close_in_background()
            self._owned.local_iterator = None
        self._close_local()
        step = 0 if state is None else int(state["step"])
        cursor = None if state is None else Cursor.from_list(state["cursor"])
        self._owned.local_iterator = self._pipeline(step, cursor)
        self._stateful = False
        self._start_at(step)
        self._state_of_last = None
        if state is not None:
            self._state_of_last = {
                "data_step": saved_data_step(state),
                "cursor": cursor.to_list(),
            }

    def _position(self) -> dict[str, Any]:
        """Where the next batch comes from: training step, data step and cursor."""
        last = self._state_of_last
        if last is None:  # nothing handed out since step 0
            last = {"data_step": 0, "cursor": self.plan.start_cursor().to_list()}
        return {"step": self.step_counter, **last}

    def _produce(self) -> _Prefetched:
        element = next(self._local_iterator)
        block = element["fields"]
        if self.worker_count:  # out of the worker's shared memory, which grain then unlinks
            block = np.array(block)
        host = fields_of(block)
        documents, split = (int(v) for v in element["piece_counts"])
        counts = dataclasses.replace(
            count_batch(host, None, len(self.component_names)),
            component_tokens=np.asarray(element["source_tokens"], dtype=np.int64),
            documents=documents,
            split_documents=split,
        )
        device = form_global_batch(host, self.sharding, self.layout.host_count)
        cursor = [int(v) for v in element["cursor"]]
        position = {"data_step": int(element["data_step"]) + 1, "cursor": cursor}
        return _Prefetched(host, device, position, counts)

    @property
    def source_names(self) -> tuple[str, ...]:
        """The datasets in plan order: a batch's `source_ids` index this tuple."""
        return tuple(self.plan.spec.names)

    @property
    def eod_token_id(self) -> int:
        """The end-of-document id appended to every document."""
        return self._eod_token_id

    @property
    def vocab_size(self) -> int | None:
        """The largest vocabulary among the datasets' sources (None if none declares one)."""
        sizes = [getattr(s, "vocab_size", None) for s in self._plan_sources]
        known = [int(v) for v in sizes if v is not None]
        return max(known) if known else None

    @property
    def tokenizer(self) -> Any:
        """The tokenizer every dataset's ids come from, or None when they differ or have none.

        Two sources share a tokenizer when they encode alike (`tokenizer_identity`:
        the byte tokenizer, or the same HuggingFace file).
        """
        tokenizers = [getattr(s, "tokenizer", None) for s in self._plan_sources]
        if not tokenizers or any(t is None for t in tokenizers):
            return None
        identities = [tokenizer_identity(t) for t in tokenizers]
        if identities[0] is None or any(i != identities[0] for i in identities):
            return None
        return tokenizers[0]

    # Online mixing -------------------------------------------------------------

    def set_mixture(self, weights: Mapping[str, float], from_step: int) -> None:
        """Mixes the datasets with `weights` from data step `from_step` on.

        Every process must call it with the same arguments, between the same
        two batches. It changes no batch before `from_step`; batches already
        prepared for later steps (in the prefetch thread or in workers) are
        prepared again. The update is saved with the data position, so a
        resumed run, on any number of processes, replays it; it holds until
        the next update or the next configured `data.mixture_schedule` stage,
        whichever starts first.

        Args:
          weights: `{dataset name: weight}` (normalised; a dataset left out is off).
          from_step: The first data step mixed this way; at least the data
            step of the next batch (`data_step_at(step_counter)`).
        """
        self._check_open()
        self._check_same_everywhere("set_mixture", (weights, from_step))
        names = self.plan.spec.names
        row = parse_mixture_weights(weights, names, "set_mixture(weights)")
        if isinstance(from_step, bool) or not isinstance(from_step, numbers.Integral):
            raise DataConfigError(
                f"set_mixture(from_step={from_step!r}) is invalid; expected an int data step"
            )
        next_step = self.data_step_at(self.step_counter)
        if from_step < next_step:
            raise DataConfigError(
                f"set_mixture(from_step={from_step}) is in the past: the next batch is data step "
                f"{next_step}; pass from_step >= {next_step}"
            )
        kept = [u for u in self._mixture_updates if u[0] < from_step]
        self._apply_mixture_updates([*kept, (int(from_step), row)])
        prefetching = self._prefetcher is not None
        self._restart(self._position())  # what was prepared ahead is planned again
        if prefetching:  # overlap the new batches with the step in flight
            self.start_prefetch()
        logging.info("mixture from data step %d: %s", from_step, dict(zip(names, row, strict=True)))

    def mixture_weights_at(self, data_step: int, *, configured: bool = False) -> dict[str, float]:
        """`{dataset: normalised weight}` in force at `data_step`.

        With `configured`, the config's weights there, online updates left out.
        """
        mixture = self._configured_mixture if configured else self.plan.spec.mixture
        weights = mixture.weights[mixture.stage_at(data_step)]
        return dict(zip(mixture.names, weights, strict=True))

    def _apply_mixture_updates(self, updates: list[MixtureUpdate]) -> None:
        self._mixture_updates = updates
        self.plan = self.plan.with_mixture(with_updates(self._configured_mixture, updates))

    def _check_same_everywhere(self, what: str, value: Any) -> None:
        """Refuses a call whose arguments differ between processes (a collective)."""
        if self.layout.process_count == 1:
            return
        digest = hashlib.sha256(_canonical(value).encode()).digest()
        mine = np.frombuffer(digest, dtype=np.int32)
        table = np.asarray(multihost_utils.process_allgather(mine)).reshape(-1, mine.size)
        differ = np.flatnonzero(np.any(table != mine, axis=1))
        if differ.size:
            raise DataConfigError(
                f"{what} was called with other arguments on process {int(differ[0])} than on "
                f"process {self.layout.process_index} ({_canonical(value)} here); every process "
                "must pass the same weights and from_step"
            )

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
        position = self._position()
        return {
            "format_version": PLAN_STATE_VERSION,
            "kind": PLAN_STATE_KIND,
            "step": self.step_counter,
            # The cursors' position: the data step after the last one handed out.
            "data_step": position["data_step"],
            "skip_steps": self.skips.to_pairs(),
            "sources": list(self.plan.spec.names),
            "cursor": list(position["cursor"]),
            "batch_schedule": self.plan.spec.batch.rampup.to_pairs(),
            "mixture_schedule": self.plan.spec.mixture.to_pairs(),
            "mixture_updates": updates_to_pairs(self.plan.spec.names, self._mixture_updates),
            "global_batch_size": self.plan.spec.batch.global_batch_size,
            "process_index": self.layout.process_index,
            "process_count": self.layout.process_count,
            "data_host_index": self.layout.host_index,
            "data_host_count": self.layout.host_count,
            "data_counters": self.data_counters.to_state(),
        }

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Continues at a saved position, on any process, host or worker count.

        `state` is one process's `get_state()`, or several merged with
        `merge_plan_states` (every process saves the same cursor).
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
        if "cursor" not in state:
            raise DataCheckpointError(
                f"the saved data position at step {step} has no cursor; the data-state file "
                "is corrupted"
            )
        remapped = cursor_by_name(state, self.plan.spec.names)
        if remapped[0] != saved_data_step(state):
            raise DataCheckpointError(
                f"the saved data cursor is at data step {remapped[0]} but the state's data step "
                f"is {saved_data_step(state)}; the data-state file is corrupted"
            )
        updates = updates_from_pairs(
            state.get("mixture_updates"), self.plan.spec.names, "the saved mixture_updates"
        )
        self._apply_mixture_updates(updates)
        self._restart({"step": step, "data_step": saved_data_step(state), "cursor": remapped})
        counters = state.get("data_counters")
        if counters is not None:
            self.data_counters.set_state(counters)
        self.state_set = True

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
    width = HEADER_FIELDS + len(PER_SOURCE_FIELDS) * len(saved)
    if len(values) != width:
        raise DataCheckpointError(
            f"the saved data cursor holds {len(values)} values, not {width} for the datasets "
            f"{saved}; the data-state file is corrupted"
        )
    remapped = values[:HEADER_FIELDS]
    for f, (_, default) in enumerate(PER_SOURCE_FIELDS):
        start = HEADER_FIELDS + f * len(saved)
        by_name = dict(zip(saved, values[start : start + len(saved)], strict=True))
        remapped += [by_name.get(name, default) for name in names]
    added, dropped = sorted(set(names) - set(saved)), sorted(set(saved) - set(names))
    if added or dropped:
        logging.warning(
            "resuming with other datasets: %s start at their beginning; %s are no longer read",
            added or "none",
            dropped or "none",
        )
    return remapped


def _canonical(value: Any) -> str:
    """A text form of set_mixture's arguments that is equal when they are."""
    weights, step = value
    if isinstance(weights, Mapping):
        weights = sorted((str(k), repr(v)) for k, v in weights.items())
    return repr((weights, step))


def saved_data_step(state: Mapping[str, Any]) -> int:
    """The data step a saved position continues at (its step, before skips existed)."""
    return int(state.get("data_step", state["step"]))
