"""The iterator a training loop pulls: global, sharded, prefetched, resumable.

Each process iterates its data-loading host's pipeline, turns each host batch
into global `jax.Array`s on the mesh in a background thread (so device
transfers overlap the training step), and hands them out in order. Its state
is a plain JSON-able dict that records the step and the local pipeline's
position after the last batch handed out, not after the prefetched ones.

At the end of a finite stream all hosts must stop at the same step or the
training step's collectives hang. Hosts therefore agree on the last step with
a tiny all-gather of "batches I know I have", done only every `prefetch` steps
and only for finite multi-host streams; a host that runs out first contributes
padding rows (segmentation 0) until then. With `drop_remainder` the stream
instead stops at the first host's end, dropping the rest explicitly.

An iterator owns a prefetch thread and its local pipeline (with any grain
worker processes). `close()` releases them; so does dropping the iterator
(a finalizer, since the thread holds it only weakly) and interpreter exit (an
`atexit` hook, which runs before multiprocessing's own so the workers and their
shared memory are gone before the resource tracker counts leaks).
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import multiprocessing.util  # noqa: F401 - imported first, so its atexit hook runs after ours
import sys
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import clu.data
import grain
import jax
import numpy as np
from absl import logging
from etils import epath
from jax.experimental import multihost_utils
from jax.sharding import Mesh

from xlstm_data.batch import padding_value
from xlstm_data.errors import DataConfigError
from xlstm_data.multihost.data_stats import (
    COMPONENT_ID_FIELD,
    BatchCounts,
    DataCounters,
    count_batch,
)
from xlstm_data.multihost.global_arrays import common_shapes, form_global_batch, pad_to_shape
from xlstm_data.multihost.host_layout import data_host_layout
from xlstm_data.multihost.prefetch import BackgroundPrefetcher

#: Version of the state dict written by `get_state`; bump on format changes.
STATE_FORMAT_VERSION = 1


def is_infinite_stream(dataset: Any) -> bool:
    """Whether a grain dataset repeats forever (every input path repeats).

    Uses only public grain API: `len()` of an infinitely repeated MapDataset
    is `sys.maxsize`, and `.parents` walks the pipeline.
    """
    if isinstance(dataset, grain.MapDataset) and len(dataset) >= sys.maxsize:
        return True
    parents = getattr(dataset, "parents", ())
    return bool(parents) and all(is_infinite_stream(p) for p in parents)


class IteratorClosedError(RuntimeError):
    """`next()` (or a restart) on a `MultiHostDataLoadIterator` after `close()`."""


class _Owned:
    """What an iterator must release: its prefetch thread and local pipeline.

    Kept apart from the iterator so a finalizer can release them after the
    iterator itself is gone.
    """

    def __init__(self) -> None:
        self.prefetcher: BackgroundPrefetcher[_Prefetched] | None = None
        self.local_iterator: Any = None

    def stop_prefetch(self) -> None:
        if self.prefetcher is not None:
            self.prefetcher.stop()
            self.prefetcher = None

    def close_local(self) -> None:
        if self.local_iterator is not None and hasattr(self.local_iterator, "close"):
            self.local_iterator.close()
        self.local_iterator = None

    def release(self) -> None:
        self.stop_prefetch()
        self.close_local()
        _open.discard(self)


#: Resources of iterators not yet closed or collected; released at exit. No
#: lock: `release` runs in finalizers, wherever the garbage collector does, and
#: single set operations are atomic under the GIL.
_open: set[_Owned] = set()


@atexit.register
def _release_all_at_exit() -> None:
    for resources in _open.copy():
        try:
            resources.release()
        except Exception as error:  # noqa: BLE001 - exiting anyway; release the others
            logging.warning("releasing a data iterator at exit failed: %s", error)


@dataclasses.dataclass
class _Prefetched:
    host: dict[str, np.ndarray]
    device: dict[str, jax.Array] | None
    state: dict[str, Any] | None
    counts: BatchCounts | None = None


class MultiHostDataLoadIterator(clu.data.DatasetIterator):
    """Iterates global batches sharded over the mesh's data axes.

    Args:
      dataloader: An iterable of host batches (dicts of numpy arrays with a
        leading batch axis), typically a grain `IterDataset`. Its iterator's
        `get_state`/`set_state` are used when present.
      global_mesh: The mesh; batches are split over its `data`/`dp`/`fsdp` axes.
      iterator_length: Stop with StopIteration after this many steps (per
        epoch when `reset_after_epoch`), or None to run until the data ends.
      dataset_size: Size of the dataset, reported as is for callers.
      reset_after_epoch: At the end of an epoch, reset to the beginning so the
        next pass starts over (for eval); otherwise stay exhausted.
      pad_shapes: Pad every field to the largest shape over all processes
        before forming the global array (for ragged host batches).
      pad_value: Value used by `pad_shapes` and for the token fields of
        padding rows; segmentation and positions are always padded with 0.
      batch_class: Class the field dict is turned into (e.g. `LLMBatch`), or
        None to yield dicts.
      drop_remainder: At the end of a finite multi-host stream, stop at the
        first host's end instead of padding the hosts that ended early.
      prefetch: Global batches prepared ahead in a background thread.
      sync_end: Whether hosts agree on the end of the stream; None decides
        from the dataloader (finite grain pipelines on more than one host).
      batch_schedule: The `BatchSizeSchedule` the dataloader batches with,
        if any; enables `batch_size_at` and `examples_seen`.
      component_names: Names of the mixture components, indexed by the
        dataloader's `COMPONENT_ID_FIELD` (which is stripped from batches);
        used for per-component token counts in `data_counters`.
      batch_axis_names: Mesh axes the batch rows are split over (see
        `mesh.data_axes`); default the `data`/`dp`/`fsdp` axes the mesh has.
      data_config: The data config the iterator was built from (checkpoints
        fingerprint it).
      sources: The document sources of the train datasets, by name.
    """

    def __init__(
        self,
        dataloader: Iterable[Mapping[str, np.ndarray]],
        global_mesh: Mesh,
        iterator_length: int | None = None,
        dataset_size: int | None = None,
        reset_after_epoch: bool = False,
        pad_shapes: bool = False,
        pad_value: int | float = 0,
        *,
        batch_class: Callable[..., Any] | None = None,
        drop_remainder: bool = False,
        prefetch: int = 2,
        sync_end: bool | None = None,
        batch_schedule: Any = None,
        component_names: Sequence[str] = (),
        batch_axis_names: str | Sequence[str] | None = None,
        data_config: Any = None,
        sources: Mapping[str, Any] | None = None,
    ):
        if iterator_length is not None and iterator_length < 1:
            raise DataConfigError(f"iterator_length={iterator_length} must be >= 1 or None")
        if prefetch < 1:
            raise DataConfigError(f"prefetch={prefetch} must be >= 1")
        self.global_mesh = global_mesh
        self.dataloader = dataloader
        self.iterator_length = iterator_length
        self.dataset_size = dataset_size
        self.reset_after_epoch = reset_after_epoch
        self.pad_shapes = pad_shapes
        self.pad_value = pad_value
        self.batch_class = batch_class
        self.drop_remainder = drop_remainder
        self.prefetch = prefetch
        self.batch_schedule = batch_schedule
        #: Length of a finite run and whether it is exact (see `epoch_length`).
        self.epoch_length: Any = None
        #: The data config this iterator was built from (fingerprinted in checkpoints).
        self.data_config: Any = data_config
        self.component_names = tuple(component_names)
        #: What was handed out so far (tokens, padding, per component, wait time);
        #: saved with the position, so the totals continue across a resume.
        self.data_counters = DataCounters(self.component_names)
        #: The document sources the train datasets were built on, by name (for
        #: `source_documents`, and for tools like `inspect` that would otherwise
        #: open them a second time).
        self.sources: Mapping[str, Any] = dict(sources or {})
        self.layout = data_host_layout(global_mesh, batch_axis_names)
        self.sharding = self.layout.sharding(global_mesh)
        if sync_end is None:
            sync_end = self.layout.host_count > 1 and not is_infinite_stream(dataloader)
        self.sync_end = sync_end
        self._padding_template: dict[str, np.ndarray] | None = None
        self._element_spec: Any = None
        self._owned = _Owned()
        _open.add(self._owned)
        self._finalizer = weakref.finalize(self, self._owned.release)
        self._closed = False
        self.state_set = False
        self._restart(None)

    @property
    def source_documents(self) -> dict[str, int] | None:
        """Documents found per train dataset (fingerprinted in checkpoints)."""
        return {name: len(source) for name, source in self.sources.items()} or None

    # Lifecycle ---------------------------------------------------------------

    @property
    def _prefetcher(self) -> BackgroundPrefetcher[_Prefetched] | None:
        return self._owned.prefetcher

    @property
    def _local_iterator(self) -> Any:
        return self._owned.local_iterator

    def _check_open(self) -> None:
        if self._closed:
            raise IteratorClosedError(
                "this MultiHostDataLoadIterator was closed (close() stopped its prefetch thread "
                "and workers); build a new iterator to read more data"
            )

    def _restart(self, state: Mapping[str, Any] | None) -> None:
        """(Re)creates the local iterator at `state`; prefetching starts on demand."""
        self._check_open()
        self._stop_prefetch()
        reusable = (
            state is not None
            and state.get("iterator") is not None
            and _is_stateful(self._local_iterator)
        )
        if not reusable:
            self._close_local()
            self._owned.local_iterator = iter(self.dataloader)
        self._stateful = _is_stateful(self._local_iterator)
        self._start_at(0)
        if state is not None:
            self._seek(state)
            self._known_until = self.step_counter
        self._state_of_last = self._local_state()

    def _start_at(self, step: int) -> None:
        """Resets the position bookkeeping to a fresh local iterator at `step`."""
        self.step_counter = step
        self._local_batches = step
        self._moved = False  # whether a batch was handed out since this (re)start
        self._local_ended = False
        self._known_until = step
        self._total_steps: int | None = None

    def start_prefetch(self) -> None:
        """Starts preparing the next batches in the background, if not yet started.

        Called by the first `next`; call it earlier (after any `set_state`) to
        overlap the first batches with model set-up and compilation. It is not
        started at construction, so a restore right after it wastes no work.
        """
        self._check_open()
        if self._prefetcher is None:
            self._owned.prefetcher = BackgroundPrefetcher(self._produce, self.prefetch)

    def _started_prefetcher(self) -> BackgroundPrefetcher[_Prefetched]:
        self.start_prefetch()
        assert self._prefetcher is not None
        return self._prefetcher

    def _seek(self, state: Mapping[str, Any]) -> None:
        if self._stateful and state.get("iterator") is not None:
            self._local_iterator.set_state(state["iterator"])
        else:
            skip = int(state["local_batches"])
            logging.warning(
                "dataloader has no get_state/set_state; replaying %d batches to resume", skip
            )
            for _ in range(skip):
                next(self._local_iterator)
        self.step_counter = int(state["step"])
        self._local_batches = int(state["local_batches"])

    def _stop_prefetch(self) -> None:
        self._owned.stop_prefetch()

    def _close_local(self) -> None:
        self._owned.close_local()

    def close(self) -> None:
        """Stops the prefetch thread and closes the local pipeline (and its workers).

        The iterator is done afterwards: `next()`, `reset()` and `set_state()`
        raise `IteratorClosedError`; `get_state()` still reports the position.
        Closing twice is harmless.
        """
        self._closed = True
        self._finalizer()

    def reset(self) -> None:
        """Restarts from the beginning of the data."""
        self._restart(None)

    # Producing ---------------------------------------------------------------

    def _local_state(self) -> dict[str, Any] | None:
        return self._local_iterator.get_state() if self._stateful else None

    def _device_put_in_background(self) -> bool:
        return not (self.pad_shapes and self.layout.process_count > 1)

    def _produce(self) -> _Prefetched:
        host = {k: np.asarray(v) for k, v in _as_dict(next(self._local_iterator)).items()}
        component_ids = host.pop(COMPONENT_ID_FIELD, None)
        state = self._local_state()
        device = None
        if self._device_put_in_background():
            device = form_global_batch(host, self.sharding, self.layout.host_count)
        counts = count_batch(host, component_ids, len(self.component_names))
        return _Prefetched(host, device, state, counts)

    # Consuming ---------------------------------------------------------------

    def __iter__(self) -> MultiHostDataLoadIterator:
        """Returns the iterator itself; with `reset_after_epoch`, at the start of a pass.

        An eval iterator (`reset_after_epoch=True`) that handed out batches
        since its last (re)start is reset, so every `for` loop over it is one
        full pass, also after a loop that stopped early (`break`, `islice`).
        Right after `set_state`, a loop continues from the restored position.
        """
        if self.reset_after_epoch and self._moved:
            self.reset()
        return self

    def __next__(self) -> Any:
        self._check_open()
        started = time.perf_counter()
        batch = self._next_batch()
        self._moved = True
        self.data_counters.add(self._last_counts, time.perf_counter() - started)
        return batch

    def _next_batch(self) -> Any:
        if self.iterator_length is not None and self.step_counter >= self.iterator_length:
            self._end_of_epoch()
        if self.sync_end and self._total_steps is None and self.step_counter >= self._known_until:
            self._agree_on_end()
        if self._total_steps is not None and self.step_counter >= self._total_steps:
            self._end_of_epoch()
        item = self._next_local()
        if item is None:
            if not self.sync_end:
                self._end_of_epoch()
            item = self._padding_item()
        else:
            self._local_batches += 1
            self._state_of_last = item.state
            if self._padding_template is None:
                self._padding_template = {k: np.zeros_like(v) for k, v in item.host.items()}
        arrays = item.device if item.device is not None else self._to_global(item.host)
        self._last_counts = item.counts
        self.step_counter += 1
        if self._element_spec is None:
            self._element_spec = self._spec_of(arrays)
        return self._wrap(arrays)

    def _next_local(self) -> _Prefetched | None:
        if self._local_ended:
            return None
        try:
            return self._started_prefetcher().get()
        except StopIteration:
            self._local_ended = True
            return None

    def _end_of_epoch(self):
        if self.reset_after_epoch:
            self.reset()
        raise StopIteration

    def _agree_on_end(self) -> None:
        """All-gathers how many batches each host knows it has (a collective)."""
        if self._local_ended:
            known, ended = self._local_batches, True
        else:
            buffered, ended = self._started_prefetcher().wait_filled()
            known = self._local_batches + buffered
        table = np.asarray(
            multihost_utils.process_allgather(np.array([known, int(ended)], dtype=np.int64))
        ).reshape(-1, 2)
        counts, ends = table[:, 0], table[:, 1].astype(bool)
        if self.drop_remainder:
            self._known_until = int(counts.min())
            if np.any(ends & (counts == counts.min())):
                self._total_steps = self._known_until
        else:
            self._known_until = int(counts.max())
            if np.all(ends):
                self._total_steps = self._known_until
        logging.log_every_n(
            logging.INFO,
            "end-of-data agreement at step %d: counts=%s ended=%s",
            100,
            self.step_counter,
            counts.tolist(),
            ends.tolist(),
        )

    def _padding_item(self) -> _Prefetched:
        if self._padding_template is None:
            raise DataConfigError(
                f"data-loading host {self.layout.host_index} of {self.layout.host_count} produced "
                "no batch at all; its dataset shard is empty or smaller than one host batch with "
                "drop_remainder=True"
            )
        rows = None
        if self.batch_schedule is not None:
            rows = self._host_batch_size_at(self.step_counter)
        host = {
            k: np.full(
                ((rows or v.shape[0]),) + v.shape[1:],
                padding_value(k, self.pad_value),
                dtype=v.dtype,
            )
            for k, v in self._padding_template.items()
        }
        counts = count_batch(host, None, len(self.component_names))
        return _Prefetched(host, None, self._state_of_last, counts)

    def _to_global(self, host: dict[str, np.ndarray]) -> dict[str, jax.Array]:
        if self.pad_shapes and self.layout.process_count > 1:
            shapes = common_shapes(host)
            host = {
                k: pad_to_shape(v, shapes[k], padding_value(k, self.pad_value))
                for k, v in host.items()
            }
        return form_global_batch(host, self.sharding, self.layout.host_count)

    def _wrap(self, arrays: dict[str, Any]) -> Any:
        """Builds a `batch_class` from all fields, extra ones (e.g. loss weights) included.

        A class with `from_dict` (like `LLMBatch`) decides itself which fields
        it keeps; any other class gets every field as a keyword argument.
        """
        if self.batch_class is None:
            return arrays
        from_dict = getattr(self.batch_class, "from_dict", None)
        if callable(from_dict):
            return from_dict(dict(arrays))
        return self.batch_class(**arrays)

    @staticmethod
    def _spec_of(arrays: Mapping[str, jax.Array]) -> dict[str, clu.data.ArraySpec]:
        return {
            k: clu.data.ArraySpec(dtype=v.dtype, shape=tuple(v.shape)) for k, v in arrays.items()
        }

    @property
    def element_spec(self) -> Any:
        """Global shape and dtype of each field (peeks at the first batch)."""
        if self._element_spec is None:
            self._check_open()
            first = self._started_prefetcher().peek()
            if first is None:
                raise ValueError("the dataloader produced no batch, so it has no element_spec")
            host = first.host
            self._element_spec = {
                k: clu.data.ArraySpec(
                    dtype=v.dtype, shape=(v.shape[0] * self.layout.host_count,) + v.shape[1:]
                )
                for k, v in host.items()
            }
        return self._wrap(self._element_spec)

    # Schedule ----------------------------------------------------------------

    def _require_schedule(self) -> Any:
        if self.batch_schedule is None:
            raise ValueError(
                "this iterator was built without a batch_schedule; build it with "
                "make_grain_multihost_iterator or pass batch_schedule="
            )
        return self.batch_schedule

    def _host_batch_size_at(self, step: int) -> int:
        return self._require_schedule().host_batch_size_at(step)

    def batch_size_at(self, step: int) -> int:
        """Global batch size of the batch handed out at `step`."""
        return self._require_schedule().global_batch_size_at(step)

    def last_batch_size(self) -> int:
        """Global batch size of the batch handed out last (the first, before any)."""
        return self.batch_size_at(max(self.step_counter - 1, 0))

    def examples_seen(self, step: int | None = None) -> int:
        """Global examples (rows) handed out before `step` (default: now)."""
        step = self.step_counter if step is None else step
        return self._require_schedule().examples_seen(step)

    # State -------------------------------------------------------------------

    def get_state(self) -> dict[str, Any]:
        """The position after the last batch handed out, as a JSON-able dict."""
        return {
            "format_version": STATE_FORMAT_VERSION,
            "step": self.step_counter,
            "local_batches": self._local_batches,
            "data_host_index": self.layout.host_index,
            "data_host_count": self.layout.host_count,
            "process_index": self.layout.process_index,
            "process_count": self.layout.process_count,
            "iterator": self._state_of_last,
            "data_counters": self.data_counters.to_state(),
        }

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Continues from a state returned by `get_state` (same process layout)."""
        version = state.get("format_version")
        if version != STATE_FORMAT_VERSION:
            raise DataConfigError(
                f"iterator state format_version={version!r} is not supported; this version of "
                f"xlstm-data reads format_version={STATE_FORMAT_VERSION}"
            )
        for key, mine in (
            ("process_count", self.layout.process_count),
            ("data_host_count", self.layout.host_count),
            ("data_host_index", self.layout.host_index),
        ):
            if int(state[key]) != mine:
                raise DataConfigError(
                    f"iterator state was saved with {key}={state[key]} but this run has "
                    f"{key}={mine}; the data position cannot be carried over to another "
                    "process layout (it would silently restart or skip data)"
                )
        self._restart(state)
        if state.get("data_counters") is not None:
            self.data_counters.set_state(state["data_counters"])
        self.state_set = True

    def save(self, filename: epath.PathLike) -> None:
        """Writes this process's state as JSON to `filename` (CLU surface)."""
        epath.Path(filename).write_text(json.dumps(self.get_state()))

    def restore(self, filename: epath.PathLike) -> None:
        """Reads a state written by `save` (CLU surface)."""
        path = epath.Path(filename)
        try:
            state = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as error:
            raise DataConfigError(f"cannot read iterator state file {path}: {error}") from error
        self.set_state(state)


def _is_stateful(iterator: Any) -> bool:
    return hasattr(iterator, "get_state") and hasattr(iterator, "set_state")


def _as_dict(batch: Any) -> Mapping[str, Any]:
    if isinstance(batch, Mapping):
        return batch
    to_dict = getattr(batch, "to_dict", None)
    if callable(to_dict):  # e.g. LLMBatch: its extra fields too
        return to_dict()
    if dataclasses.is_dataclass(batch):
        return {f.name: getattr(batch, f.name) for f in dataclasses.fields(batch)}
    raise DataConfigError(
        f"dataloader yielded a {type(batch).__name__}; expected a dict of numpy arrays"
    )
