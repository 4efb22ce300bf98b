"""One call from a run's config to its train and eval iterators.

Everything that can be checked without data is checked first (the config
keys, every ramp-up stage against the mesh, eval batch divisibility); only
then are sources opened, and the end-of-document id is settled against their
tokenizers before any pipeline reads a document.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Sequence
from typing import Any

from jax.sharding import Mesh

from xlstm_data.config import DataConfig, validate_data_config
from xlstm_data.end_of_document import resolve_eod_token_id
from xlstm_data.epoch_length import epoch_length
from xlstm_data.errors import DataConfigError, DataReadError
from xlstm_data.grain_iterator import (
    make_grain_llm_dataset,
    make_grain_llm_iterator,
    make_grain_multihost_iterator,
)
from xlstm_data.host_layout import data_host_layout
from xlstm_data.multihost_iterator import MultiHostDataLoadIterator
from xlstm_data.rampup import BatchSizeSchedule


def iterators_from_config(
    data_config: Any, mesh: Mesh, *, batch_axis_names: str | Sequence[str] | None = None
) -> tuple[MultiHostDataLoadIterator, dict[str, MultiHostDataLoadIterator]]:
    """Builds the train iterator and one eval iterator per eval dataset.

    Defaults (`config.DATA_DEFAULTS`) differ from the reference factories'
    where the reference's measured worse: packing on, no worker processes,
    and the end-of-document id from the tokenizer (1, the byte tokenizer's,
    when no source has one; the factories use 0 there, as the reference
    does). `drop_remainder=True` in both. See `make_grain_llm_dataset`.

    The train iterator mixes the train datasets by weight (each repeats
    forever unless a single dataset has `num_epochs`) and follows the ramp-up
    schedule. Eval iterators are not shuffled, make one pass per `reset()` (or
    `for` loop), and pad their last batch with segmentation-0 rows so a masked
    loss ignores the filler exactly.

    Args:
      data_config: The data section (ConfigDict, dict or `DataConfig`), or a
        whole config holding it under `data`.
      mesh: The global mesh.
      batch_axis_names: Mesh axes the batch rows are split over; default the
        `dp`/`fsdp` axes the mesh has (see `mesh.data_axes`).

    Returns:
      `(train_iterator, {name: eval_iterator})`.
    """
    cfg: DataConfig = validate_data_config(data_config)
    layout = data_host_layout(mesh, batch_axis_names)
    BatchSizeSchedule(
        cfg.global_batch_size,
        cfg.rampup,
        data_parallel_size=layout.data_parallel_size,
        host_count=layout.host_count,
        key="data.rampup",
    )
    if cfg.eval:
        layout.host_batch_size(cfg.eval_global_batch_size, "data.eval_global_batch_size")
    mixed = [s for s in cfg.train if s.weight > 0]
    opened: dict[str, Any] = {}
    for split, specs in (("train", mixed), ("eval", cfg.eval)):
        for spec in specs:
            key = f"data.{split}.{spec.name}"
            try:
                opened[key] = spec.build()
            except (DataConfigError, DataReadError) as error:
                raise type(error)(f"{key} (kind {spec.kind!r}): {error}") from error
            # Checked as each source opens, so a mismatch fails before the next is indexed.
            resolve_eod_token_id(cfg.eod_token_id, opened)
    eod_token_id = resolve_eod_token_id(cfg.eod_token_id, opened)
    # The checkpoint records the id in use: an unset key that resolves to the
    # id a config used to spell out is not a data-config change.
    cfg = dataclasses.replace(cfg, eod_token_id=eod_token_id)
    sources = {spec.name: opened[f"data.train.{spec.name}"] for spec in mixed}
    eval_sources = {spec.name: opened[f"data.eval.{spec.name}"] for spec in cfg.eval}
    components = {}
    for spec in mixed:
        components[spec.name] = make_grain_llm_dataset(
            layout.host_index,
            layout.host_count,
            sources[spec.name],
            cfg.global_batch_size,
            cfg.max_target_length,
            cfg.shuffle,
            component_seed(cfg.data_shuffle_seed, spec.name),
            num_epochs=cfg.num_epochs if len(mixed) == 1 else None,
            grain_packing=cfg.packing,
            grain_packing_bin_count=cfg.packing_bin_count,
            shift=cfg.shift,
            shift_target=cfg.shift_target,
            eod_token_id=eod_token_id,
            read_threads=cfg.read_threads,
            read_buffer_size=cfg.read_buffer_size,
        )
    train = make_grain_multihost_iterator(
        components,
        [len(source) for source in sources.values()],
        mesh,
        cfg.global_batch_size,
        layout.host_count,
        dataset_weights=cfg.weights,
        worker_count=cfg.worker_count,
        worker_buffer_size=cfg.worker_buffer_size,
        drop_remainder=cfg.drop_remainder,
        batch_rampup_factors=cfg.rampup,
        prefetch=cfg.prefetch,
        batch_axis_names=batch_axis_names,
    )
    train.data_config = cfg
    train.sources = sources
    if cfg.num_epochs is not None and len(mixed) == 1:
        (only,) = sources.values()
        _set_epoch_length(
            train, only, cfg, cfg.num_epochs, train.batch_schedule, cfg.drop_remainder
        )
    evals = {
        spec.name: make_grain_llm_iterator(
            None,
            None,
            mesh,
            eval_sources[spec.name],
            cfg.eval_global_batch_size,
            cfg.max_target_length,
            shuffle=False,
            data_shuffle_seed=cfg.data_shuffle_seed,
            num_epochs=1,
            grain_packing=cfg.packing,
            grain_packing_bin_count=cfg.packing_bin_count,
            shift=cfg.shift,
            shift_target=cfg.shift_target,
            eod_token_id=eod_token_id,
            read_threads=cfg.read_threads,
            read_buffer_size=cfg.read_buffer_size,
            worker_count=0,
            drop_remainder=False,
            reset_after_epoch=True,
            prefetch=cfg.prefetch,
            batch_axis_names=batch_axis_names,
        )
        for spec in cfg.eval
    }
    for name, iterator in evals.items():
        iterator.sources = {name: eval_sources[name]}  # their vocabularies count too
        _set_epoch_length(
            iterator, eval_sources[name], cfg, 1, iterator.batch_schedule, drop_remainder=False
        )
    return train, evals


def component_seed(data_shuffle_seed: int, name: str) -> int:
    """The shuffle seed of a named train dataset.

    Derived from the name, not the position, so reordering the datasets or
    setting another one's weight to 0 leaves each dataset's order unchanged
    (a resume with new weights continues every dataset where it was).
    """
    return (data_shuffle_seed + zlib.crc32(name.encode())) % 2**31


def _set_epoch_length(
    iterator: MultiHostDataLoadIterator,
    source: Any,
    cfg: DataConfig,
    num_epochs: int,
    schedule: BatchSizeSchedule,
    drop_remainder: bool,
) -> None:
    """Records the run's length; sets `iterator_length` only when it is exact.

    Needs the document lengths without reading the documents, which sources
    with a `lengths()` method (synthetic, prepared shards) provide; otherwise
    the length stays unknown and the iterator runs to the data's real end.
    """
    lengths = source.lengths() if getattr(source, "has_lengths", lambda: False)() else None
    if lengths is None:
        return
    length = epoch_length(
        lengths,
        num_epochs,
        cfg.max_target_length,
        schedule,
        packing=cfg.packing,
        shift=cfg.shift,
        shift_target=cfg.shift_target,
        drop_remainder=drop_remainder,
    )
    iterator.epoch_length = length
    if length.exact:
        iterator.iterator_length = length.steps
