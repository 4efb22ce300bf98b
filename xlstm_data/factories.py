"""The reference factories (xlstm-jax's names and arguments), on the global plan.

`make_grain_llm_dataset` describes one dataset: its documents (any
random-access source, after per-document `operations`) and how they become
rows. `make_grain_multihost_iterator` mixes such datasets and returns the
same iterator as `iterators_from_config`: its global batches are a pure
function of (arguments, seed, step), its checkpoint resumes on any number of
processes with identical global batches, and `worker_count` changes speed,
never data. `make_grain_llm_iterator` does both in one call.

An argument the plan cannot honour is refused by name, before any document
is read; one that only tuned the old streaming pipeline's speed is accepted
and said to have no effect.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from absl import logging
from jax.sharding import Mesh

from xlstm_data.batch import LLMBatch
from xlstm_data.checks import check_int
from xlstm_data.config.end_of_document import resolve_eod_token_id
from xlstm_data.config.factory_settings import FactorySettings
from xlstm_data.errors import DataConfigError
from xlstm_data.from_config import check_batch_fits, check_layout_divides, source_lengths
from xlstm_data.multihost.host_layout import data_host_layout
from xlstm_data.multihost.iterator import PlannedDataIterator
from xlstm_data.plan.global_plan import GlobalPlan
from xlstm_data.plan.mixture import MixtureSchedule, parse_mixture_weights
from xlstm_data.plan.schedule import BatchSizeSchedule, RampupSchedule, parse_rampup
from xlstm_data.plan.spec import PlanSpec
from xlstm_data.prepare import auto_index
from xlstm_data.sources.array_record import ArrayRecordSource
from xlstm_data.sources.base import TokenSource
from xlstm_data.sources.in_memory import as_token_source
from xlstm_data.sources.mapped import MappedSource, per_document_maps

__all__ = [
    "LLMDataset",
    "make_grain_llm_dataset",
    "make_grain_llm_iterator",
    "make_grain_multihost_iterator",
]

#: Arguments every mixed dataset must share: they shape the rows of one batch.
_ROW_ARGUMENTS = (
    "max_target_length",
    "packing",
    "shift",
    "shift_target",
    "shuffle",
    "eod_token_id",
)


@dataclasses.dataclass(frozen=True)
class LLMDataset:
    """One dataset for `make_grain_multihost_iterator`: documents and row settings.

    Nothing is read until the iterator is built; the lengths are counted then
    (see `MappedSource`), unless the source knows them.
    """

    documents: Any
    max_target_length: int
    packing: str
    shift: bool
    shift_target: bool
    shuffle: bool
    data_shuffle_seed: int
    num_epochs: int | None
    eod_token_id: int
    host_index: int
    host_count: int
    operations: tuple[str, ...]
    read_threads: int

    def __len__(self) -> int:
        return len(self.documents)


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
) -> LLMDataset:
    """Describes one dataset's rows for `make_grain_multihost_iterator`.

    Documents are shuffled per epoch (with `data_shuffle_seed`), repeated
    `num_epochs` times (forever if None), passed through `operations`, split
    into pieces of at most `max_target_length` tokens (never truncated: no
    token is lost), and packed first-fit (`grain_packing`) or one document
    piece per row, padded to `max_target_length`. The rows of every step are
    those of the global plan: the data-loading host index and count only say
    which of them this process reads, and are checked against the mesh.

    Defaults follow the reference API: no packing, and (through
    `make_grain_llm_iterator`) one worker process. `iterators_from_config`
    defaults to best-fit packing and no workers, measured better (see
    `bench/README.md`). The end-of-document id resolves alike on both paths,
    except when no tokenizer defines one: 0 here, as in the reference; 1 on
    the config path (the byte tokenizer's).

    Args:
      dataloading_host_index: This host's index among the data-loading hosts.
      dataloading_host_count: Number of data-loading hosts.
      dataset: Random-access documents `{"tokens": int[n]}` (or id arrays): a
        grain MapDataset, one of `xlstm_data.sources`, or any Sequence.
      global_batch_size: Global batch size (checked to divide over hosts).
      max_target_length: Row length (>= 2).
      shuffle: Whether to shuffle documents and packed rows.
      data_shuffle_seed: Seed of the shuffle.
      num_epochs: Passes over the data, or None to repeat forever.
      operations: `grain.transforms.Map`/`MapWithIndex` applied to each
        document before its tokens are counted; anything else is refused.
      grain_packing: Pack several documents per row (first fit).
      grain_packing_bin_count: Accepted for the reference API; has no effect
        (the plan packs whole blocks of documents at once).
      shift: Make targets the inputs shifted by one token.
      shift_target: Shift targets left (True) or inputs right with EOD as BOS.
      eod_token_id: End-of-document id appended to every document; None: the
        dataset's tokenizer's own, or 0 when it has none.
      apply_padding: Must be True: the plan's rows are `max_target_length`
        long.
      read_threads: Threads reading a batch's documents (default none).
      read_buffer_size: Accepted for the reference API; has no effect (the
        plan reads exactly each batch's documents).

    Returns:
      The dataset, for `make_grain_multihost_iterator`.
    """
    host_count = check_int("dataloading_host_count", dataloading_host_count, 1)
    host_index = check_int("dataloading_host_index", dataloading_host_index, 0)
    if host_index >= host_count:
        raise DataConfigError(
            f"dataloading_host_index={host_index} is out of range for dataloading_host_count="
            f"{host_count}; valid: 0..{host_count - 1}"
        )
    check_int("max_target_length", max_target_length, 2)
    check_int("global_batch_size", global_batch_size, 1)
    check_int("eod_token_id", eod_token_id, 0, optional=True)
    check_int("data_shuffle_seed", data_shuffle_seed, 0)
    if global_batch_size % host_count:
        raise DataConfigError(
            f"global_batch_size={global_batch_size} does not divide over "
            f"dataloading_host_count={host_count} hosts; use a multiple of {host_count}"
        )
    if num_epochs is not None:
        check_int("num_epochs", num_epochs, 1)
    if apply_padding is not True:
        raise DataConfigError(
            f"apply_padding={apply_padding!r} cannot be honoured: every row of the data plan is "
            "max_target_length tokens long (padding marked by segmentation 0); pass "
            "apply_padding=True"
        )
    check_int("grain_packing_bin_count", grain_packing_bin_count, 1, optional=True)
    _unused("grain_packing_bin_count", grain_packing_bin_count, "the plan packs whole blocks")
    _unused("read_buffer_size", read_buffer_size, "the plan reads exactly each batch's documents")
    threads = check_int("read_threads", 0 if read_threads is None else read_threads, 0)
    maps = per_document_maps(operations)
    documents = as_token_source(dataset)
    if isinstance(documents, ArrayRecordSource) and not maps:  # shards made elsewhere
        documents = auto_index.with_lengths("dataset", documents, _reopener(documents))
        unindexed_ids = documents.tokenizer is None and documents.record_format == "tokens"
        if unindexed_ids and not documents.has_lengths():
            documents = auto_index.with_lengths_counted_here("dataset", documents)
    if maps or not (isinstance(documents, TokenSource) and documents.has_lengths()):
        documents = MappedSource(documents, maps, name="dataset")
    eod = resolve_eod_token_id(eod_token_id, {"dataset": documents}, key="eod_token_id", fallback=0)
    return LLMDataset(
        documents=documents,
        max_target_length=int(max_target_length),
        packing="first_fit" if grain_packing else "none",
        shift=bool(shift),
        shift_target=bool(shift_target),
        shuffle=bool(shuffle),
        data_shuffle_seed=int(data_shuffle_seed),
        num_epochs=num_epochs,
        eod_token_id=eod,
        host_index=host_index,
        host_count=host_count,
        operations=tuple(type(op).__qualname__ for op in maps),
        read_threads=threads,
    )


def _reopener(source: ArrayRecordSource) -> Any:
    """Opens `source`'s shards again, as it was opened (after an index was written)."""

    def reopen() -> ArrayRecordSource:
        return ArrayRecordSource(
            source.files,
            source.record_format,
            tokenizer=source.tokenizer,
            vocab_size=source.vocab_size,
        )

    return reopen


def _unused(argument: str, value: Any, why: str) -> None:
    if value is not None:
        logging.info("%s=%r has no effect: %s", argument, value, why)


def make_grain_multihost_iterator(
    grain_datasets: LLMDataset | Sequence[LLMDataset] | Mapping[str, LLMDataset],
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
) -> PlannedDataIterator:
    """Mixes datasets into the global batches of one plan, sharded over the mesh.

    Args:
      grain_datasets: From `make_grain_llm_dataset`: one, a list (named "0",
        "1", ...), or a mapping by name. They must agree on their row
        arguments (`max_target_length`, packing, shifts, shuffle, EOD).
        Datasets with different `data_shuffle_seed`s are planned with one
        seed derived from all of them.
      dataset_lengths: Documents per dataset (checked), or None.
      global_mesh: The mesh; its data axes decide the data-loading hosts.
      global_batch_size: Global batch size; must divide over the mesh's
        data-parallel size at every ramp-up stage.
      dataloading_host_count: Checked against the mesh if given.
      dataset_weights: Mixture weights (token shares), a sequence in dataset
        order or a mapping by name; normalised; 0 leaves a dataset out; None
        is equal weights.
      worker_count: Worker processes computing whole steps (speed only).
      worker_buffer_size: Chunks of steps (2^18 tokens of rows, at least one
        step) each worker prepares ahead.
      drop_remainder: At the end of a finite run, drop a partial last step
        (True) or pad it with segmentation-0 rows (False).
      batch_class: Class of the yielded batches.
      reset_after_epoch: Restart at step 0 after the last step (eval).
      use_thread_prefetch: Prepare batches in the prefetch thread only
        (worker_count is then not used).
      batch_rampup_factors: `{step: factor}` or `[[step, factor], ...]`: the
        factor of the last boundary <= step scales `global_batch_size`.
      prefetch: Global batches prepared ahead in a background thread.
      batch_axis_names: Mesh axes the batch rows are split over; default the
        `data`/`dp`/`fsdp` axes the mesh has.

    Returns:
      The iterator, the type `iterators_from_config` returns.
    """
    datasets = _named(grain_datasets)
    _check_dataset_lengths(dataset_lengths, datasets)
    check_int("global_batch_size", global_batch_size, 1)
    check_int("worker_count", worker_count, 0)
    check_int("worker_buffer_size", worker_buffer_size, 1)
    check_int("prefetch", prefetch, 1)
    first = next(iter(datasets.values()))
    for argument in _ROW_ARGUMENTS:
        values = {name: getattr(d, argument) for name, d in datasets.items()}
        if len(set(values.values())) > 1:
            raise DataConfigError(
                f"grain_datasets disagree on {argument} ({values}); the rows of one batch share "
                f"it: build every dataset with the same {argument}"
            )
    weights = _weights(dataset_weights, list(datasets))
    mixed = [name for name, w in zip(datasets, weights, strict=True) if w > 0]
    if len(mixed) > 1 and any(datasets[n].num_epochs is not None for n in mixed):
        raise DataConfigError(
            "num_epochs bounds a single dataset, not a mixture: the plan serves the mixture's "
            "shares for as long as it runs; build the mixed datasets with num_epochs=None"
        )
    layout = data_host_layout(global_mesh, batch_axis_names)
    for name, dataset in datasets.items():
        for argument, given, derived in (
            ("dataloading_host_count", dataset.host_count, layout.host_count),
            ("dataloading_host_index", dataset.host_index, layout.host_index),
        ):
            _check_against_mesh(f"{argument} of dataset {name!r}", given, derived)
    _check_against_mesh("dataloading_host_count", dataloading_host_count, layout.host_count)
    rampup = (
        batch_rampup_factors
        if isinstance(batch_rampup_factors, RampupSchedule)
        else parse_rampup(batch_rampup_factors, key="batch_rampup_factors")
    )
    batch = BatchSizeSchedule(global_batch_size, rampup, key="batch_rampup_factors")
    check_layout_divides(batch, layout, ("global_batch_size", "batch_rampup_factors"))
    spec = PlanSpec(
        names=tuple(mixed),
        mixture=MixtureSchedule(tuple(mixed), (0,), (tuple(w for w in weights if w > 0),)),
        mixture_unit="tokens",
        row_length=first.max_target_length,
        packing=first.packing,
        shift=first.shift,
        shift_target=first.shift_target,
        seed=_plan_seed([datasets[name].data_shuffle_seed for name in mixed]),
        shuffle=first.shuffle,
        batch=batch,
        num_epochs=datasets[mixed[0]].num_epochs if len(mixed) == 1 else None,
        drop_remainder=drop_remainder,
    )
    sources = {name: datasets[name].documents for name in mixed}
    lengths = [source_lengths(f"dataset {name!r}", sources[name]) for name in mixed]
    plan = GlobalPlan(spec, lengths)
    check_batch_fits(plan, "global_batch_size")
    if use_thread_prefetch and worker_count:
        logging.info("use_thread_prefetch=True: batches are prepared in the prefetch thread")
    settings = FactorySettings(
        arguments={
            "global_batch_size": global_batch_size,
            "batch_rampup_factors": batch.rampup.to_pairs(),
            "max_target_length": first.max_target_length,
            "packing": first.packing,
            "shift": first.shift,
            "shift_target": first.shift_target,
            "shuffle": first.shuffle,
            "data_shuffle_seed": spec.seed,
            "eod_token_id": first.eod_token_id,
            "num_epochs": spec.num_epochs,
            "drop_remainder": drop_remainder,
        },
        datasets={
            name: {"weight": w, "operations": list(datasets[name].operations)}
            for name, w in zip(datasets, weights, strict=True)
            if w > 0
        },
    )
    return PlannedDataIterator(
        plan,
        [sources[name] for name in mixed],
        global_mesh,
        eod_token_id=first.eod_token_id,
        worker_count=0 if use_thread_prefetch else worker_count,
        worker_buffer_size=worker_buffer_size,
        prefetch=prefetch,
        read_threads=first.read_threads,
        reset_after_epoch=reset_after_epoch,
        batch_class=batch_class,
        batch_axis_names=batch_axis_names,
        data_config=settings,
        sources_by_name=sources,
    )


def _plan_seed(seeds: Sequence[int]) -> int:
    """The plan's one seed: the datasets' common seed, else one derived from all of them."""
    if len(set(seeds)) == 1:
        return seeds[0]
    digest = hashlib.sha256(json.dumps(list(seeds)).encode()).digest()
    return int.from_bytes(digest[:4], "little")


def _named(datasets: Any) -> dict[str, LLMDataset]:
    if isinstance(datasets, LLMDataset):
        datasets = [datasets]
    named = (
        dict(datasets)
        if isinstance(datasets, Mapping)
        else {str(i): d for i, d in enumerate(datasets)}
    )
    if not named:
        raise DataConfigError("grain_datasets is empty; give at least one dataset")
    for name, dataset in named.items():
        if not isinstance(dataset, LLMDataset):
            raise DataConfigError(
                f"grain_datasets[{name!r}] is a {type(dataset).__name__}; the data plan needs "
                "datasets built by make_grain_llm_dataset (documents whose lengths it can "
                "count), not a grain pipeline"
            )
    return named


def _check_dataset_lengths(given: Any, datasets: Mapping[str, LLMDataset]) -> None:
    if given is None:
        return
    counts = [len(d) for d in datasets.values()]
    expected = sum(counts) if isinstance(given, int) else list(given)
    if (isinstance(given, int) and given != expected) or (
        not isinstance(given, int) and expected != counts
    ):
        raise DataConfigError(
            f"dataset_lengths={given!r} disagrees with the datasets' documents ({counts}); pass "
            "None or the datasets' lengths"
        )


def _weights(given: Any, names: list[str]) -> list[float]:
    if given is None:
        raw: Mapping[str, Any] = dict.fromkeys(names, 1.0)
    elif isinstance(given, Mapping):
        raw = given
    else:
        given = list(given)
        if len(given) != len(names):
            raise DataConfigError(
                f"dataset_weights has {len(given)} weights for {len(names)} datasets {names}; "
                "give one weight per dataset"
            )
        raw = dict(zip(names, given, strict=True))
    return list(parse_mixture_weights(raw, names, "dataset_weights"))


def _check_against_mesh(argument: str, given: int | None, derived: int) -> None:
    if given is not None and given != derived:
        raise DataConfigError(
            f"{argument}={given} disagrees with the mesh, whose data axes give {derived} for this "
            "process (processes replicating the same batch rows share a data-loading host); "
            f"pass {derived} or None"
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
) -> PlannedDataIterator:
    """One dataset's global batches on the mesh, in one call.

    The data-loading host index and count come from the mesh; if given, they
    must agree with it (pass None). See `make_grain_llm_dataset` and
    `make_grain_multihost_iterator` for the other arguments.

    Returns:
      The iterator, the type `iterators_from_config` returns.
    """
    layout = data_host_layout(global_mesh, batch_axis_names)
    _check_against_mesh("dataloading_host_count", dataloading_host_count, layout.host_count)
    _check_against_mesh("dataloading_host_index", dataloading_host_index, layout.host_index)
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
        None,
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
