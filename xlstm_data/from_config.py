"""One call from a run's config to its train and eval iterators.

Everything that can be checked without data is checked first (the config
keys, every ramp-up stage against the mesh, eval batch divisibility); only
then are sources opened.
"""

from __future__ import annotations

from typing import Any

from jax.sharding import Mesh

from xlstm_data.config import DataConfig, validate_data_config
from xlstm_data.grain_iterator import (
    make_grain_llm_dataset,
    make_grain_llm_iterator,
    make_grain_multihost_iterator,
)
from xlstm_data.host_layout import data_host_layout
from xlstm_data.multihost_iterator import MultiHostDataLoadIterator
from xlstm_data.rampup import BatchSizeSchedule


def iterators_from_config(
    data_config: Any, mesh: Mesh
) -> tuple[MultiHostDataLoadIterator, dict[str, MultiHostDataLoadIterator]]:
    """Builds the train iterator and one eval iterator per eval dataset.

    The train iterator mixes the train datasets by weight (each repeats
    forever unless a single dataset has `num_epochs`) and follows the ramp-up
    schedule. Eval iterators are not shuffled, make one pass per `reset()` (or
    `for` loop), and pad their last batch with segmentation-0 rows so a masked
    loss ignores the filler exactly.

    Args:
      data_config: The data section (ConfigDict, dict or `DataConfig`), or a
        whole config holding it under `data`.
      mesh: The global mesh.

    Returns:
      `(train_iterator, {name: eval_iterator})`.
    """
    cfg: DataConfig = validate_data_config(data_config)
    layout = data_host_layout(mesh)
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
    components, lengths = {}, []
    for index, spec in enumerate(mixed):
        source = spec.build()
        lengths.append(len(source))
        components[spec.name] = make_grain_llm_dataset(
            layout.host_index,
            layout.host_count,
            source,
            cfg.global_batch_size,
            cfg.max_target_length,
            cfg.shuffle,
            cfg.data_shuffle_seed + index,
            num_epochs=cfg.num_epochs if len(mixed) == 1 else None,
            grain_packing=cfg.packing,
            grain_packing_bin_count=cfg.packing_bin_count,
            shift=cfg.shift,
            shift_target=cfg.shift_target,
            eod_token_id=cfg.eod_token_id,
        )
    train = make_grain_multihost_iterator(
        components,
        lengths,
        mesh,
        cfg.global_batch_size,
        layout.host_count,
        dataset_weights=cfg.weights,
        worker_count=cfg.worker_count,
        worker_buffer_size=cfg.worker_buffer_size,
        drop_remainder=cfg.drop_remainder,
        batch_rampup_factors=cfg.rampup,
        prefetch=cfg.prefetch,
    )
    evals = {
        spec.name: make_grain_llm_iterator(
            None,
            None,
            mesh,
            spec.build(),
            cfg.eval_global_batch_size,
            cfg.max_target_length,
            shuffle=False,
            data_shuffle_seed=cfg.data_shuffle_seed,
            num_epochs=1,
            grain_packing=cfg.packing,
            grain_packing_bin_count=cfg.packing_bin_count,
            shift=cfg.shift,
            shift_target=cfg.shift_target,
            eod_token_id=cfg.eod_token_id,
            worker_count=0,
            drop_remainder=False,
            reset_after_epoch=True,
            prefetch=cfg.prefetch,
        )
        for spec in cfg.eval
    }
    return train, evals
