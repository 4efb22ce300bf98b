"""One call from a run's config to its train and eval iterators, on the plan.

Everything that can be checked without data is checked first (the config
keys, every ramp-up stage against the mesh, the mixture stages, eval batch
divisibility, the logical streams); only then are sources opened, the
end-of-document id settled against their tokenizers, and the document
lengths loaded, before any document is read.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from jax.sharding import Mesh

from xlstm_data.batch import LLMBatch
from xlstm_data.config.data_config import DataConfig, SourceConfig, validate_data_config
from xlstm_data.config.end_of_document import resolve_eod_token_id
from xlstm_data.errors import DataConfigError, DataReadError
from xlstm_data.multihost.host_layout import data_host_layout
from xlstm_data.multihost.iterator import PlannedDataIterator
from xlstm_data.plan.global_plan import GlobalPlan
from xlstm_data.plan.mixture import parse_mixture_schedule
from xlstm_data.plan.schedule import BatchSizeSchedule, parse_rampup
from xlstm_data.plan.spec import PlanSpec
from xlstm_data.prepare import auto_index
from xlstm_data.sources.array_record import ArrayRecordSource


def train_plan_spec(cfg: DataConfig) -> PlanSpec:
    """The train plan's spec (no host count in it: the plan is the same on any layout)."""
    batch = BatchSizeSchedule(cfg.global_batch_size, cfg.rampup, key="data.rampup")
    names = cfg.mixed_names
    mixture = cfg.mixture
    keep = [mixture.names.index(n) for n in names]
    mixture = dataclasses.replace(
        mixture,
        names=names,
        weights=tuple(tuple(w[i] for i in keep) for w in mixture.weights),
    )
    return PlanSpec(
        names=names,
        mixture=mixture,
        mixture_unit=cfg.mixture_unit,
        row_length=cfg.max_target_length,
        packing=cfg.packing,
        shift=cfg.shift,
        shift_target=cfg.shift_target,
        seed=cfg.data_shuffle_seed,
        shuffle=cfg.shuffle,
        batch=batch,
        block_documents=cfg.block_documents,
        num_epochs=cfg.num_epochs,
        drop_remainder=cfg.drop_remainder,
    )


def eval_plan_spec(cfg: DataConfig, name: str) -> PlanSpec:
    """One unshuffled pass over an eval dataset; the last batch padded."""
    batch = BatchSizeSchedule(cfg.eval_global_batch_size, parse_rampup(None))
    return PlanSpec(
        names=(name,),
        mixture=parse_mixture_schedule(None, [name], {name: 1.0}),
        mixture_unit="documents",
        row_length=cfg.max_target_length,
        packing=cfg.packing,
        shift=cfg.shift,
        shift_target=cfg.shift_target,
        seed=cfg.data_shuffle_seed,
        shuffle=False,
        batch=batch,
        block_documents=cfg.block_documents,
        num_epochs=1,
        drop_remainder=False,
    )


def source_lengths(key: str, source: Any) -> Any:
    """Every document's token count, without reading the documents."""
    lengths = getattr(source, "lengths", None)
    if lengths is None:
        raise DataConfigError(
            f"{key}: the source {source!r} cannot report its document lengths, which the data "
            "plan needs; use a config source kind (see configs/README.md) or prepare the "
            "corpus with `xlstm-data prepare`"
        )
    try:
        return lengths()
    except (DataConfigError, DataReadError) as error:
        raise type(error)(f"{key}: {error}") from error


@dataclasses.dataclass(frozen=True)
class TrainPlan:
    """A config's train plan with its opened sources, for tools that need no mesh.

    Attributes:
      config: The validated data config (`eod_token_id` resolved).
      plan: The train plan.
      sources: The train datasets' sources by name (the ones the plan reads).
    """

    config: DataConfig
    plan: GlobalPlan
    sources: dict[str, Any]


def open_train_plan(data_config: Any) -> TrainPlan:
    """The train plan of a config: sources opened, lengths loaded, no document read."""
    cfg: DataConfig = validate_data_config(data_config)
    spec = train_plan_spec(cfg)
    mixed = [s for s in cfg.train if s.name in spec.names]
    opened, cfg = _open_sources(cfg, [("train", mixed)])
    plan, sources = _train_plan(spec, mixed, opened)
    return TrainPlan(cfg, plan, sources)


def _open_sources(
    cfg: DataConfig, splits: Sequence[tuple[str, Sequence[SourceConfig]]]
) -> tuple[dict[str, Any], DataConfig]:
    """Opens the sources by `data.<split>.<name>` key; returns them and `cfg` with the EOD id.

    The end-of-document id is checked as each source opens, so a mismatch
    fails before the next is indexed. The checkpoint records the id in use:
    an unset key that resolves to the id a config used to spell out is not a
    data-config change.
    """
    opened: dict[str, Any] = {}
    for split, specs in splits:
        for spec in specs:
            opened[f"data.{split}.{spec.name}"] = _open(f"data.{split}.{spec.name}", spec)
            resolve_eod_token_id(cfg.eod_token_id, opened, final=False)
    eod_token_id = resolve_eod_token_id(cfg.eod_token_id, opened)
    return opened, dataclasses.replace(cfg, eod_token_id=eod_token_id)


def _train_plan(
    spec: PlanSpec, mixed: Sequence[SourceConfig], opened: dict[str, Any]
) -> tuple[GlobalPlan, dict[str, Any]]:
    """The train plan on the opened sources (their lengths loaded), and the sources by name."""
    sources = {s.name: opened[f"data.train.{s.name}"] for s in mixed}
    lengths = [source_lengths(f"data.train.{n}", sources[n]) for n in spec.names]
    plan = GlobalPlan(spec, lengths)
    check_batch_fits(plan)
    return plan, sources


def check_batch_fits(plan: GlobalPlan, key: str = "data.global_batch_size") -> None:
    """Refuses a global batch larger than the whole train corpus fills in one epoch.

    Such a batch serves every document several times in every step; at absurd
    sizes (10^12 rows) planning would spin for hours before the first batch.
    The plan has planned nothing yet: it plans on the first batch.
    """
    spec = plan.spec
    tokens = sum(t + len(x) for t, x in zip(plan.document_tokens, plan.lengths, strict=True))
    rows = -(-tokens // spec.row_length)  # an EOD per document
    largest = spec.batch.global_batch_size
    if largest > rows:
        raise DataConfigError(
            f"{key}={largest} rows is more than the whole train corpus fills in one epoch "
            f"({rows} rows of {spec.row_length} tokens); use at most {rows} rows, or more data"
        )


def iterators_from_config(
    data_config: Any, mesh: Mesh, *, batch_axis_names: str | Sequence[str] | None = None
) -> tuple[PlannedDataIterator, dict[str, PlannedDataIterator]]:
    """Builds the train iterator and one eval iterator per eval dataset, on the plan.

    The train iterator yields the global batches of the plan: a pure function
    of (data config, seed, step), the same on any number of processes, data
    hosts or workers. Its checkpointed position resumes on another layout.
    Eval iterators make one unshuffled pass per `reset()` (or `for` loop), of
    exactly known length, and pad their last batch with segmentation-0 rows.

    Args:
      data_config: The data section (ConfigDict, dict or `DataConfig`), or a
        whole config holding it under `data`.
      mesh: The global mesh.
      batch_axis_names: Mesh axes the batch rows are split over; default the
        `data`/`dp`/`fsdp` axes the mesh has (see `mesh.data_axes`).

    Returns:
      `(train_iterator, {name: eval_iterator})`.
    """
    cfg: DataConfig = validate_data_config(data_config)
    layout = data_host_layout(mesh, batch_axis_names)
    train_spec = train_plan_spec(cfg)
    check_layout_divides(train_spec.batch, layout)
    if cfg.eval:
        layout.host_batch_size(cfg.eval_global_batch_size, "data.eval_global_batch_size")
    eval_specs = {spec.name: eval_plan_spec(cfg, spec.name) for spec in cfg.eval}
    mixed = [s for s in cfg.train if s.name in train_spec.names]
    opened, cfg = _open_sources(cfg, [("train", mixed), ("eval", cfg.eval)])
    plan, sources = _train_plan(train_spec, mixed, opened)
    common = dict(
        mesh=mesh,
        eod_token_id=cfg.eod_token_id,
        prefetch=cfg.prefetch,
        read_threads=cfg.read_threads or 0,
        batch_class=LLMBatch,
        batch_axis_names=batch_axis_names,
        data_config=cfg,
    )
    train = PlannedDataIterator(
        plan,
        [sources[n] for n in train_spec.names],
        worker_count=cfg.worker_count,
        worker_buffer_size=cfg.worker_buffer_size,
        sources_by_name=sources,
        skips=cfg.skip_steps,
        **common,
    )
    evals = {}
    for spec in cfg.eval:
        key = f"data.eval.{spec.name}"
        source = opened[key]
        eval_plan = GlobalPlan(eval_specs[spec.name], [source_lengths(key, source)])
        evals[spec.name] = PlannedDataIterator(
            eval_plan,
            [source],
            reset_after_epoch=True,
            sources_by_name={spec.name: source},
            **common,
        )
    return train, evals


def check_layout_divides(
    batch: BatchSizeSchedule,
    layout: Any,
    keys: tuple[str, str] = ("data.global_batch_size", "data.rampup"),
) -> None:
    """Names the layouts that work when a stage's batch does not divide over this one.

    Args:
      batch: The global batch schedule.
      layout: This mesh's data-host layout.
      keys: How errors name the base batch size and the ramp-up.
    """
    size_key, rampup_key = keys
    stages = batch.stages()
    dp = layout.data_parallel_size
    bad = next((s for s in stages if s.global_batch_size % dp), None)
    if bad is None:
        return
    common = math.gcd(*(s.global_batch_size for s in stages))
    valid = [d for d in range(1, common + 1) if common % d == 0]
    per_host = dp // layout.host_count
    hosts = [d // per_host for d in valid if d % per_host == 0]
    raise DataConfigError(
        f"{rampup_key}: stage at step {bad.start_step} has factor {bad.factor!r}, giving a stage "
        f"batch of {size_key} {batch.global_batch_size} * {bad.factor!r} = "
        f"{bad.global_batch_size}, which is not divisible by this mesh's data-parallel size "
        f"{dp} ({layout.host_count} data hosts x {per_host} batch shards each). Every stage "
        f"batch ({[s.global_batch_size for s in stages]}) divides over data-parallel sizes "
        f"{valid}"
        + (f", i.e. {hosts} data hosts of {per_host} shards" if hosts else "")
        + f"; or change {size_key} or {rampup_key}"
    )


def _open(key: str, spec: SourceConfig) -> Any:
    """Opens one source; ArrayRecord shards made elsewhere get their lengths counted once."""
    try:
        source = spec.build()
        if isinstance(source, ArrayRecordSource):
            source = auto_index.with_lengths(key, source, spec.build)
        check_files = getattr(source, "check_files", None)
        if check_files is not None:  # cheap checks of damaged shards, before any step
            check_files()
        return source
    except (DataConfigError, DataReadError) as error:
        raise type(error)(f"{key} (kind {spec.kind!r}): {error}") from error
