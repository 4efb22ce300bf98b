"""The reference factories: documents to a packed, global, multi-host iterator.

`make_grain_llm_dataset` builds one host's pipeline of rows (shard, shuffle,
repeat, user operations, chunking, packing or padding, shifting);
`make_grain_multihost_iterator` batches rows, optionally in grain worker
processes, and wraps them in a `MultiHostDataLoadIterator`;
`make_grain_llm_iterator` does both. Parameter names follow the reference
implementation so existing configs keep working; where it was wrong (tokens
truncated, data-host index from `jax.process_index()`), behaviour is fixed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import grain
from absl import logging
from jax.sharding import Mesh

from xlstm_data.batch import LLMBatch
from xlstm_data.checks import check_int
from xlstm_data.config.end_of_document import resolve_eod_token_id
from xlstm_data.config.rampup import BatchSizeSchedule, RampupSchedule, parse_rampup
from xlstm_data.errors import DataConfigError
from xlstm_data.multihost.host_layout import DataHostLayout, data_host_layout
from xlstm_data.multihost.iterator import MultiHostDataLoadIterator, is_infinite_stream
from xlstm_data.multihost.workers import batch_in_workers, prefetch_in_workers
from xlstm_data.sources import as_token_source
from xlstm_data.streaming.batching import ScheduledBatchIterDataset
from xlstm_data.streaming.chunking import DocumentChunkIterDataset
from xlstm_data.streaming.host_sharding import shard_bounds, shard_grain_dataset
from xlstm_data.streaming.mixing import (
    component_names,
    kept_component_names,
    mix_components,
    normalize_weights,
)
from xlstm_data.streaming.packing import pack_examples, pad_examples
from xlstm_data.streaming.read_ahead import read_options
from xlstm_data.streaming.source_dataset import SourceDataset

__all__ = [
    "make_grain_llm_dataset",
    "make_grain_llm_iterator",
    "make_grain_multihost_iterator",
    "shard_grain_dataset",
]


def _as_map_dataset(dataset: Any) -> grain.MapDataset:
    if isinstance(dataset, grain.MapDataset):
        return dataset
    if isinstance(dataset, grain.IterDataset):
        raise DataConfigError(
            "dataset must support random access (a grain.MapDataset or a Sequence with "
            f"__len__/__getitem__), got the iterable {type(dataset).__name__}"
        )
    return SourceDataset(as_token_source(dataset))


#: Smallest default number of open rows when packing (see `bench/packing.py`).
MIN_DEFAULT_PACKING_BINS = 128


def make_grain_llm_dataset(
    dataloading_host_index: int,
    dataloading_host_count: int,
    dataset: Any,
    global_batch_size: int,
    max_target_length: int,
    shuffle: bool,
    data_shuffle_seed: int,
    num_epochs: int | None = None,
    operations: Sequence[Any] | None = None,
    grain_packing: bool = False,
    grain_packing_bin_count: int | None = None,
    shift: bool = True,
    shift_target: bool = True,
    eod_token_id: int | None = None,
    apply_padding: bool = True,
    *,
    read_threads: int | None = None,
    read_buffer_size: int | None = None,
) -> grain.IterDataset:
    """Creates one host's grain pipeline of LLM rows (not yet batched).

    The streaming path: use it for pipelines whose document lengths are
    unknown or that need arbitrary grain `operations`. Its position is a grain
    state bound to the process and worker count. Config-driven runs use the
    planned path (`iterators_from_config`), whose order is a pure function of
    (config, seed, step) and which resumes on any process or worker count.

    Documents are sharded contiguously over hosts, shuffled with a seed that
    changes every epoch, repeated `num_epochs` times (forever if None), passed
    through `operations`, split into chunks of at most `max_target_length`
    tokens (never truncated: no token is lost), and packed first-fit or padded.

    Defaults follow the reference API, so code written for it keeps its
    data: no packing, and (through `make_grain_llm_iterator`) one worker
    process. `iterators_from_config` defaults differ where the reference's
    choice measured worse: `data.packing=True` (rows without padding) and
    `data.worker_count=0` (see `bench/README.md`); `drop_remainder=True` is
    the default of both. The end-of-document id resolves the same way on both
    paths, except for its value when no tokenizer defines one (0 here, as in
    the reference; 1 on the config path, the byte tokenizer's).

    Args:
      dataloading_host_index: This host's index among the data-loading hosts.
      dataloading_host_count: Number of data-loading hosts.
      dataset: Random-access documents `{"tokens": int32[n]}`: a grain
        MapDataset, one of `xlstm_data.sources`, or any Sequence of dicts,
        token arrays or rows of a 2-D array.
      global_batch_size: Global batch size (checked to divide over hosts).
      max_target_length: Row length (>= 2).
      shuffle: Whether to shuffle documents.
      data_shuffle_seed: Seed of the shuffle and of packing.
      num_epochs: Passes over the data, or None to repeat forever.
      operations: grain transformations applied to each document first.
      grain_packing: Pack several documents per row (first fit).
      grain_packing_bin_count: Open rows while packing; default the host
        batch size, at least `MIN_DEFAULT_PACKING_BINS` (grain's first-fit
        closes every open row when a chunk fits none, so few bins waste space:
        8 bins leave 91% of a lognormal corpus's slots filled, 128 leave 97.6%).
      shift: Make targets the inputs shifted by one token.
      shift_target: Shift targets left (True) or inputs right with EOD as BOS.
      eod_token_id: End-of-document id appended to every document; None: the
        dataset's tokenizer's own (`dataset.tokenizer.eod_id`), or 0 when it
        has none. An id outside the dataset's vocabulary, or one that
        disagrees with its tokenizer's, is refused
        (`end_of_document.resolve_eod_token_id`).
      apply_padding: Pad unpacked rows to `max_target_length` (otherwise they
        stay ragged and are padded per batch).
      read_threads: Threads reading documents ahead (0: none); see
        `reading.read_options`. Does not change the data order or the state.
      read_buffer_size: Documents read ahead; see `reading.read_options`.

    Returns:
      A `grain.IterDataset` of dicts with the six `LLMBatch` fields.
    """
    host_count = check_int("dataloading_host_count", dataloading_host_count, 1)
    shard_bounds(0, dataloading_host_index, host_count)  # validates the index
    check_int("max_target_length", max_target_length, 2)
    check_int("global_batch_size", global_batch_size, 1)
    check_int("eod_token_id", eod_token_id, 0, optional=True)
    if global_batch_size % host_count:
        raise DataConfigError(
            f"global_batch_size={global_batch_size} does not divide over "
            f"dataloading_host_count={host_count} hosts; use a multiple of {host_count}"
        )
    if num_epochs is not None:
        check_int("num_epochs", num_epochs, 1)
    if grain_packing_bin_count is not None:
        check_int("grain_packing_bin_count", grain_packing_bin_count, 1)
    reading = read_options(read_threads, read_buffer_size)
    eod_token_id = resolve_eod_token_id(
        eod_token_id, {"dataset": dataset}, key="eod_token_id", fallback=0
    )
    documents = _as_map_dataset(dataset)
    if len(documents) == 0:
        raise DataConfigError("dataset is empty; it must hold at least one document")
    documents = shard_grain_dataset(documents, dataloading_host_index, host_count)
    if shuffle:
        documents = documents.shuffle(seed=data_shuffle_seed)
    documents = documents.repeat(num_epochs)
    if operations:
        documents = grain.experimental.apply_transformations(documents, list(operations))
    examples = DocumentChunkIterDataset(
        documents.to_iter_dataset(reading),
        max_target_length=max_target_length,
        shift=shift,
        shift_target=shift_target,
        eod_token_id=eod_token_id,
    )
    if grain_packing:
        bins = grain_packing_bin_count or max(
            global_batch_size // host_count, MIN_DEFAULT_PACKING_BINS
        )
        return pack_examples(
            examples, max_target_length, bins, seed=data_shuffle_seed, shuffle=shuffle
        )
    return pad_examples(examples, max_target_length if apply_padding else None)


def _host_layout_matching(
    mesh: Mesh,
    host_index: int | None,
    host_count: int | None,
    batch_axis_names: str | Sequence[str] | None,
) -> DataHostLayout:
    layout = data_host_layout(mesh, batch_axis_names)
    for name, given, derived in (
        ("dataloading_host_count", host_count, layout.host_count),
        ("dataloading_host_index", host_index, layout.host_index),
    ):
        if given is not None and given != derived:
            raise DataConfigError(
                f"{name}={given} disagrees with the mesh, whose data axes give {derived} for this "
                "process (processes replicating the same batch rows share a data-loading host); "
                f"pass {name}={derived} or None"
            )
    return layout


def make_grain_multihost_iterator(
    grain_datasets: grain.IterDataset | Sequence[grain.IterDataset],
    dataset_lengths: int | Sequence[int] | None,
    global_mesh: Mesh,
    global_batch_size: int,
    dataloading_host_count: int | None = None,
    dataset_weights: Sequence[float] | Mapping[str, float] | None = None,
    worker_count: int = 1,
    worker_buffer_size: int = 1,
    drop_remainder: bool = True,
    batch_class: type = LLMBatch,
    reset_after_epoch: bool = False,
    use_thread_prefetch: bool = False,
    batch_rampup_factors: Mapping[Any, float] | None = None,
    *,
    prefetch: int = 2,
    batch_axis_names: str | Sequence[str] | None = None,
) -> MultiHostDataLoadIterator:
    """Batches host pipelines and wraps them in a `MultiHostDataLoadIterator`.

    The streaming path: use it for pipelines whose document lengths are
    unknown or that need arbitrary grain `operations`. Its position is a grain
    state bound to the process and worker count. Config-driven runs use the
    planned path (`iterators_from_config`), whose order is a pure function of
    (config, seed, step) and which resumes on any process or worker count.

    Args:
      grain_datasets: Row pipelines from `make_grain_llm_dataset`: one, a
        list, or a mapping by name (names are kept in the checkpoint, so a
        restore may change the weights).
      dataset_lengths: Documents per epoch, reported as `dataset_size`. The
        number of batches is not derived from it: chunking and packing change
        it, so the iterator runs until the data ends (hosts agree on the end).
      global_mesh: The mesh; its data axes decide the data-loading hosts.
      global_batch_size: Global batch size; must divide over the mesh's
        data-parallel size.
      dataloading_host_count: Checked against the mesh if given.
      dataset_weights: Mixture weights, a sequence in dataset order or a
        mapping by name; normalised, 0 drops a dataset, None is equal weights.
        Mixed datasets must repeat forever (`num_epochs=None`).
      worker_count: grain worker processes (0: none). Endless streams are
        batched in the workers (in micro-batches of the greatest common
        divisor of the ramp-up's host batch sizes, joined per step here);
        finite ones send rows.
      worker_buffer_size: Micro-batches (rows for a finite stream) buffered
        per worker, or batches for thread prefetch.
      drop_remainder: Drop the last partial batch (and, on several hosts, stop
        at the first host's end); otherwise pad it with segmentation-0 rows.
      batch_class: Class of the yielded batches.
      reset_after_epoch: Restart from the beginning after the data ends.
      use_thread_prefetch: Prefetch batches in a thread instead of workers.
      batch_rampup_factors: Batch-size ramp-up: `{step: factor}` (int or str
        keys) or `[[step, factor], ...]`; the factor of the largest boundary
        <= step scales `global_batch_size` (not cumulative). Every stage is
        checked against the mesh before any data is read. The batch shape
        changes only at stage boundaries, so a jitted step compiles once per
        stage.
      prefetch: Global batches prepared ahead on the devices.
      batch_axis_names: Mesh axes the batch rows are split over (e.g.
        `("data",)` for a MaxText-style mesh); default the `dp`/`fsdp` axes
        the mesh has. A mesh with neither is refused unless they are named.

    Returns:
      The multi-host iterator.
    """
    if isinstance(grain_datasets, grain.IterDataset):
        grain_datasets = [grain_datasets]
    if isinstance(grain_datasets, Mapping):
        components = dict(grain_datasets)
    else:
        components = dict(zip(component_names(len(grain_datasets)), grain_datasets, strict=True))
    if not components:
        raise DataConfigError("grain_datasets is empty; give at least one dataset")
    weights = normalize_weights(list(components), dataset_weights)
    check_int("worker_count", worker_count, 0)
    check_int("worker_buffer_size", worker_buffer_size, 1)
    layout = _host_layout_matching(global_mesh, None, dataloading_host_count, batch_axis_names)
    layout.host_batch_size(global_batch_size)
    rampup = (
        batch_rampup_factors
        if isinstance(batch_rampup_factors, RampupSchedule)
        else parse_rampup(batch_rampup_factors, key="batch_rampup_factors")
    )
    schedule = BatchSizeSchedule(
        global_batch_size,
        rampup,
        data_parallel_size=layout.data_parallel_size,
        host_count=layout.host_count,
        key="batch_rampup_factors",
    )
    rows = mix_components(components, weights)
    workers = grain.MultiprocessingOptions(
        num_workers=worker_count, per_worker_buffer_size=worker_buffer_size
    )
    if use_thread_prefetch and worker_count:
        logging.info("use_thread_prefetch=True: ignoring worker_count=%d", worker_count)
    if use_thread_prefetch or worker_count == 0:
        batches = ScheduledBatchIterDataset(rows, schedule, drop_remainder=drop_remainder)
    elif is_infinite_stream(rows):
        host_batch_sizes = [stage.host_batch_size for stage in schedule.stages()]
        batches = batch_in_workers(
            rows, schedule, host_batch_sizes, workers, drop_remainder=drop_remainder
        )
    else:  # see worker_batching: a finite stream's workers end unevenly
        batches = ScheduledBatchIterDataset(
            prefetch_in_workers(rows, workers), schedule, drop_remainder=drop_remainder
        )
    if use_thread_prefetch:
        batches = grain.experimental.ThreadPrefetchIterDataset(
            batches, prefetch_buffer_size=worker_buffer_size
        )
    if isinstance(dataset_lengths, int):
        dataset_size = dataset_lengths
    else:
        dataset_size = sum(dataset_lengths) if dataset_lengths else None
    return MultiHostDataLoadIterator(
        batches,
        global_mesh,
        dataset_size=dataset_size,
        reset_after_epoch=reset_after_epoch,
        batch_class=batch_class,
        drop_remainder=drop_remainder,
        prefetch=prefetch,
        batch_schedule=schedule,
        component_names=kept_component_names(components, weights),
        batch_axis_names=batch_axis_names,
    )


def make_grain_llm_iterator(
    dataloading_host_index: int | None,
    dataloading_host_count: int | None,
    global_mesh: Mesh,
    dataset: Any,
    global_batch_size: int,
    max_target_length: int,
    shuffle: bool,
    data_shuffle_seed: int,
    num_epochs: int | None = None,
    operations: Sequence[Any] | None = None,
    grain_packing: bool = False,
    grain_packing_bin_count: int | None = None,
    shift: bool = True,
    shift_target: bool = True,
    eod_token_id: int | None = None,
    worker_count: int = 1,
    worker_buffer_size: int = 1,
    apply_padding: bool = True,
    drop_remainder: bool = True,
    batch_class: type = LLMBatch,
    reset_after_epoch: bool = False,
    use_thread_prefetch: bool = False,
    batch_rampup_factors: Mapping[Any, float] | None = None,
    *,
    prefetch: int = 2,
    read_threads: int | None = None,
    read_buffer_size: int | None = None,
    batch_axis_names: str | Sequence[str] | None = None,
) -> MultiHostDataLoadIterator:
    """Builds the host pipeline and the multi-host iterator in one call.

    The streaming path: use it for pipelines whose document lengths are
    unknown or that need arbitrary grain `operations`. Its position is a grain
    state bound to the process and worker count. Config-driven runs use the
    planned path (`iterators_from_config`), whose order is a pure function of
    (config, seed, step) and which resumes on any process or worker count.

    The data-loading host index and count come from the mesh; if given, they
    must agree with it (pass None to take them from the mesh). See
    `make_grain_llm_dataset` and `make_grain_multihost_iterator` for the
    other arguments, and the former for how the defaults (reference API's)
    differ from `iterators_from_config`'s.

    Returns:
      The multi-host iterator of `batch_class` batches.
    """
    layout: DataHostLayout = _host_layout_matching(
        global_mesh, dataloading_host_index, dataloading_host_count, batch_axis_names
    )
    layout.host_batch_size(global_batch_size)
    rows = make_grain_llm_dataset(
        layout.host_index,
        layout.host_count,
        dataset,
        global_batch_size,
        max_target_length,
        shuffle,
        data_shuffle_seed,
        num_epochs=num_epochs,
        operations=operations,
        grain_packing=grain_packing,
        grain_packing_bin_count=grain_packing_bin_count,
        shift=shift,
        shift_target=shift_target,
        eod_token_id=eod_token_id,
        apply_padding=apply_padding,
        read_threads=read_threads,
        read_buffer_size=read_buffer_size,
    )
    return make_grain_multihost_iterator(
        rows,
        len(dataset),
        global_mesh,
        global_batch_size,
        layout.host_count,
        worker_count=worker_count,
        worker_buffer_size=worker_buffer_size,
        drop_remainder=drop_remainder,
        batch_class=batch_class,
        reset_after_epoch=reset_after_epoch,
        use_thread_prefetch=use_thread_prefetch,
        batch_rampup_factors=batch_rampup_factors,
        prefetch=prefetch,
        batch_axis_names=batch_axis_names,
    )
