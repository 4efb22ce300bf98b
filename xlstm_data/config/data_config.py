"""The data section of a run's `ml_collections` config, validated and frozen.

A config file declares datasets, mixture weights, the batch-size ramp-up and
the mesh as plain values that survive `ConfigDict.to_json()` and
`--config.data.<key>=...` overrides. `validate_data_config` turns that into a
frozen `DataConfig` and rejects every bad value, naming its key, before any
data is read. Checks that need the mesh (batch divisibility of each ramp-up
stage) run in `iterators_from_config`, still before reading.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import ml_collections

from xlstm_data.checks import check_int
from xlstm_data.errors import DataConfigError
from xlstm_data.plan.mixture import UNITS, MixtureSchedule, check_weight, parse_mixture_schedule
from xlstm_data.plan.packing import packing_mode
from xlstm_data.plan.schedule import RampupSchedule, parse_rampup
from xlstm_data.plan.skips import StepSkips, parse_skip_steps
from xlstm_data.plan.spec import DEFAULT_BLOCK_DOCUMENTS
from xlstm_data.sources.base import expand_files
from xlstm_data.sources.prepared_shards import shard_files

#: Options of each source kind: name -> (required, default).
SOURCE_KINDS: dict[str, dict[str, tuple[bool, Any]]] = {
    "array_record": {
        "path": (True, None),
        "record_format": (False, "tokens"),
        # None: the tokenizer `prepare` recorded in the shards' index.json (else bytes).
        "tokenizer": (False, None),
        "vocab_size": (False, None),
    },
    "megatron": {
        "path": (True, None),
        "vocab_size": (False, None),
        # None: no tokenizer (Megatron's files record none); the dtype bounds the ids.
        "tokenizer": (False, None),
        "end_of_document": (False, None),
        # None: every document; else Megatron's --split string, of which `split_part` is read.
        "split": (False, None),
        "split_part": (False, "train"),
    },
    "text": {"path": (True, None), "unit": (False, "line"), "tokenizer": (False, "byte")},
    "jsonl": {"path": (True, None), "field": (False, "text"), "tokenizer": (False, "byte")},
    "synthetic": {
        "num_documents": (True, None),
        "mean_length": (False, 256.0),
        "sigma": (False, 1.0),
        "vocab_size": (False, 258),
        "seed": (False, 0),
        "min_length": (False, 1),
        "max_length": (False, None),
    },
    "python_stdlib": {
        "part": (True, None),
        "max_files": (False, None),
        "tokenizer": (False, "byte"),
    },
}

#: Keys of the data section and their defaults (None: unset). packing, worker_count and
#: eod_token_id differ from the reference factories' defaults (False, 1, 0); see
#: `iterators_from_config` for why.
DATA_DEFAULTS: dict[str, Any] = {
    "train": None,
    "eval": None,
    "global_batch_size": None,
    "eval_global_batch_size": None,
    "max_target_length": None,
    "packing": "best_fit",
    "mixture_schedule": None,
    "mixture_unit": "tokens",
    "skip_steps": None,
    "logical_streams": None,
    "block_documents": DEFAULT_BLOCK_DOCUMENTS,
    "shift": True,
    "shift_target": True,
    # None: the tokenizer's own end-of-document id (resolved when sources are built).
    "eod_token_id": None,
    "shuffle": True,
    "data_shuffle_seed": 0,
    "num_epochs": None,
    "worker_count": 0,
    # Chunks each worker prepares ahead (consecutive steps, at least one:
    # `reading.planned_batches.CHUNK_TOKENS`). 1 stalled the 2-worker planned pipeline
    # on 2 cores: 2.0-3.3 M tok/s against 3.5-3.9 with 4, and 0.55-0.61 CPU s per
    # M tokens against 0.49-0.53 (bench corpus, 8 x 1024 rows, 2026-11-23).
    "worker_buffer_size": 4,
    "drop_remainder": True,
    "rampup": None,
    "prefetch": 2,
    "read_threads": None,
}

#: Keys of the old streaming pipeline that the planned config path does not have.
REMOVED_KEYS: dict[str, str] = {
    "packing_bin_count": (
        "the planned pipeline packs whole blocks of documents (data.block_documents) with "
        "data.packing='best_fit' or 'first_fit'; remove the key"
    ),
    "read_buffer_size": (
        "the planned pipeline reads exactly the documents of each batch; remove the key "
        "(data.read_threads sets the reading threads)"
    ),
}


#: Types of the data keys whose default is None, so a command-line override
#: (`--config.data.<key>=...`) is parsed right even when the config file leaves
#: the key unset. `object` takes any Python literal (lists, dicts, None).
_UNSET_KEY_TYPES: dict[str, type] = {
    "global_batch_size": int,
    "eval_global_batch_size": int,
    "max_target_length": int,
    "logical_streams": int,
    "mixture_schedule": object,
    "skip_steps": object,
    "eod_token_id": int,
    "num_epochs": int,
    "rampup": object,
    "read_threads": int,
}


def default_data_config() -> ml_collections.ConfigDict:
    """The data section with every key present, set to its default.

    Config files start from this (through `trainer_hooks.default_config()`)
    so that every documented key can be overridden on the command line, also
    when the file does not set it: `ml_collections` only overrides keys that
    exist, and only with values of the key's type. Unset keys are typed
    placeholders; `rampup` takes any literal (`[[step, factor], ...]` or
    `{step: factor}`), since `config_flags` cannot override a plain list.
    """
    data = ml_collections.ConfigDict()
    for key, default in DATA_DEFAULTS.items():
        if key in ("train", "eval"):
            data[key] = ml_collections.ConfigDict()
        elif key in _UNSET_KEY_TYPES:
            data[key] = ml_collections.FieldReference(default, field_type=_UNSET_KEY_TYPES[key])
        elif key == "packing":  # a mode name, or True/False as aliases
            data[key] = ml_collections.FieldReference(default, field_type=object)
        else:
            data[key] = default
    return data


@dataclasses.dataclass(frozen=True)
class SourceConfig:
    """One named dataset: its kind, options and mixture weight."""

    name: str
    kind: str
    weight: float
    options: tuple[tuple[str, Any], ...]

    def option(self, key: str) -> Any:
        return dict(self.options)[key]

    def build(self) -> Any:
        """Creates the document source (this may read file indexes).

        Each kind imports only its own module: a start on prepared shards
        imported the text and synthetic sources too, 4-5 ms of its first batch
        where no bytecode cache is written (bench/peers cold start).
        """
        o = dict(self.options)
        if self.kind == "array_record":  # either layout `prepare` writes (see prepared_shards)
            from xlstm_data.sources import open_shards

            return open_shards(
                o["path"],
                o["record_format"],
                tokenizer=o["tokenizer"],
                vocab_size=o["vocab_size"],
                unprepared_tokenizer="byte",  # unprepared ids stay checked, as documented
            )
        if self.kind == "megatron":  # Megatron-LM's .bin/.idx, read in place
            from xlstm_data.sources.megatron_indexed import MegatronIndexedSource

            return MegatronIndexedSource(
                o["path"],
                vocab_size=o["vocab_size"],
                tokenizer=o["tokenizer"],
                end_of_document=o["end_of_document"],
                split=o["split"],
                split_part=o["split_part"],
            )
        if self.kind in ("text", "jsonl"):
            from xlstm_data.sources import TextFileSource

            if self.kind == "text":
                return TextFileSource(o["path"], tokenizer=o["tokenizer"], unit=o["unit"])
            return TextFileSource(
                o["path"], tokenizer=o["tokenizer"], unit="line", jsonl_field=o["field"]
            )
        if self.kind == "synthetic":
            from xlstm_data.sources import SyntheticSource

            return SyntheticSource(**o)
        from xlstm_data.sources import stdlib_corpus  # only this kind needs it

        return stdlib_corpus.stdlib_source(o["part"], o["tokenizer"], o["max_files"])


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """The validated data section (see `DATA_DEFAULTS` for the keys)."""

    train: tuple[SourceConfig, ...]
    eval: tuple[SourceConfig, ...]
    global_batch_size: int
    eval_global_batch_size: int
    max_target_length: int
    packing: str
    shift: bool
    shift_target: bool
    eod_token_id: int | None
    shuffle: bool
    data_shuffle_seed: int
    num_epochs: int | None
    worker_count: int
    worker_buffer_size: int
    drop_remainder: bool
    rampup: RampupSchedule
    prefetch: int
    read_threads: int | None = None
    mixture_schedule: MixtureSchedule | None = None
    mixture_unit: str = "tokens"
    block_documents: int = DEFAULT_BLOCK_DOCUMENTS
    skip_steps: StepSkips = StepSkips()

    @property
    def mixture(self) -> MixtureSchedule:
        """Weights by step: `mixture_schedule`, or the static weights as one stage."""
        if self.mixture_schedule is not None:
            return self.mixture_schedule
        return parse_mixture_schedule(
            None, [s.name for s in self.train], {s.name: s.weight for s in self.train}
        )

    @property
    def mixed_names(self) -> tuple[str, ...]:
        """Train datasets with a weight > 0 in some stage (the ones the plan reads).

        Sorted by name, not in declaration order: the plan (which source index
        a block's documents and a saved cursor's counts refer to) must not
        depend on the order of `data.train`, so reordering datasets in a config
        changes no batch and a checkpoint resumes under the reordered config.
        """
        mixture = self.mixture
        return tuple(
            sorted(
                name
                for i, name in enumerate(mixture.names)
                if any(weights[i] > 0 for weights in mixture.weights)
            )
        )

    def to_json_dict(self) -> dict[str, Any]:
        """A JSON-able view (used for fingerprints and `inspect`)."""
        out = dataclasses.asdict(self)
        out["rampup"] = self.rampup.to_pairs()
        out["mixture_schedule"] = self.mixture.to_pairs()
        out["skip_steps"] = self.skip_steps.to_pairs()
        for split in ("train", "eval"):
            out[split] = {
                s.name: {"kind": s.kind, "weight": s.weight, **dict(s.options)}
                for s in getattr(self, split)
            }
        return out


def _plain(value: Any) -> Any:
    if isinstance(value, ml_collections.ConfigDict | ml_collections.FrozenConfigDict):
        return value.to_dict()
    return value


def _bool(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise DataConfigError(f"{key}={value!r} is invalid; expected True or False")
    return value


def _source(split: str, name: str, spec: Any, with_weight: bool) -> SourceConfig:
    key = f"data.{split}.{name}"
    spec = _plain(spec)
    if not isinstance(spec, Mapping):
        raise DataConfigError(f"{key} must be a dict with a 'kind', got {spec!r}")
    kind = spec.get("kind")
    if kind not in SOURCE_KINDS:
        raise DataConfigError(
            f"{key}.kind={kind!r} is not a known source kind; valid kinds: {sorted(SOURCE_KINDS)}"
        )
    allowed = SOURCE_KINDS[kind]
    extra = set(spec) - set(allowed) - {"kind", "weight"}
    if extra:
        raise DataConfigError(
            f"{key} has unknown keys {sorted(extra)} for kind {kind!r}; valid keys: "
            f"{sorted(allowed) + ['kind'] + (['weight'] if with_weight else [])}"
        )
    options = {}
    for option, (required, default) in allowed.items():
        value = spec.get(option, default)
        if required and value is None:
            raise DataConfigError(f"{key}.{option} is missing; kind {kind!r} requires it")
        options[option] = value
    if kind == "array_record":  # a prepared directory, or a glob of shards
        shard_files(options["path"], f"{key}.path")
    elif kind == "megatron":  # prefixes, not files
        from xlstm_data.sources import megatron_indexed

        prefixes = megatron_indexed.megatron_prefixes(options["path"], f"{key}.path")
        megatron_indexed.check_end_of_document(options["end_of_document"], f"{key}.end_of_document")
        megatron_indexed.split_bookends(options["split"], options["split_part"], f"{key}.split")
        if options["vocab_size"] is None and options["tokenizer"] is None:
            megatron_indexed.check_ids_are_bounded(prefixes, f"{key}.vocab_size")
    elif "path" in options:
        expand_files(options["path"], f"{key}.path")  # what the source will open
    weight = spec.get("weight", 1.0)
    if with_weight:
        check_weight(f"{key}.weight", weight)
    elif "weight" in spec:
        raise DataConfigError(f"{key}.weight is set but eval datasets are not mixed; remove it")
    return SourceConfig(name, kind, float(weight), tuple(sorted(options.items())))


def _sources(split: str, value: Any, with_weight: bool) -> tuple[SourceConfig, ...]:
    value = _plain(value) or {}
    if not isinstance(value, Mapping):
        raise DataConfigError(f"data.{split} must map dataset names to dicts, got {value!r}")
    return tuple(_source(split, name, spec, with_weight) for name, spec in value.items())


def validate_data_config(config: Any) -> DataConfig:
    """Validates the data section of a config (or a whole config with `.data`).

    Args:
      config: A `ConfigDict`/dict of the data section, or a config holding it
        under `data`.

    Returns:
      The frozen, typed `DataConfig`.
    """
    if isinstance(config, DataConfig):
        return config
    data = _plain(config)
    if isinstance(data, Mapping) and "data" in data and "train" not in data:
        data = _plain(data["data"])
    if not isinstance(data, Mapping):
        raise DataConfigError(f"the data config must be a dict or ConfigDict, got {type(data)}")
    removed = sorted(set(data) & set(REMOVED_KEYS))
    if removed and any(data[k] is not None for k in removed):
        key = next(k for k in removed if data[k] is not None)
        raise DataConfigError(f"data.{key} is no longer a data key: {REMOVED_KEYS[key]}")
    data = {k: v for k, v in data.items() if k not in REMOVED_KEYS}
    unknown = set(data) - set(DATA_DEFAULTS)
    if unknown:
        raise DataConfigError(
            f"data has unknown keys {sorted(unknown)}; valid keys: {sorted(DATA_DEFAULTS)}"
        )
    d = {**DATA_DEFAULTS, **data}
    train = _sources("train", d["train"], with_weight=True)
    if not train:
        raise DataConfigError("data.train declares no dataset; add at least one")
    evals = _sources("eval", d["eval"], with_weight=False)
    collisions = sorted({s.name for s in train} & {s.name for s in evals})
    if collisions:
        raise DataConfigError(
            f"data.eval names {collisions} collide with data.train names; give eval datasets "
            "distinct names"
        )
    parse_mixture_schedule(None, [s.name for s in train], {s.name: s.weight for s in train})
    global_batch_size = check_int("data.global_batch_size", d["global_batch_size"], 1)
    num_epochs = check_int("data.num_epochs", d["num_epochs"], 1, optional=True)
    if num_epochs is not None and sum(s.weight > 0 for s in train) > 1:
        raise DataConfigError(
            f"data.num_epochs={num_epochs} cannot bound a mixture of {len(train)} datasets "
            "(the mix would stop at the first dataset's end and skip the rest); set "
            "data.num_epochs=None and bound the run by train steps"
        )
    read_threads = check_int("data.read_threads", d["read_threads"], 0, optional=True)
    schedule = d["mixture_schedule"]
    mixture_schedule = None
    if schedule is not None:
        mixture_schedule = parse_mixture_schedule(
            _plain(schedule), [s.name for s in train], {}, key="data.mixture_schedule"
        )
        if num_epochs is not None:
            raise DataConfigError(
                "data.mixture_schedule cannot be combined with data.num_epochs (which bounds a "
                "single dataset); bound the run by train steps"
            )
    if d["logical_streams"] is not None:
        raise DataConfigError(
            f"data.logical_streams={d['logical_streams']!r}: the plan has no logical streams "
            "any more (every host plans the whole global batch, so shares, stages and epochs "
            "are exact over the global batch); valid: None, or leave the key out"
        )
    return DataConfig(
        train=train,
        eval=evals,
        global_batch_size=global_batch_size,
        eval_global_batch_size=check_int(
            "data.eval_global_batch_size", d["eval_global_batch_size"], 1, optional=True
        )
        or global_batch_size,
        max_target_length=_row_length(d["max_target_length"]),
        packing=packing_mode(d["packing"]),
        shift=_bool("data.shift", d["shift"]),
        shift_target=_bool("data.shift_target", d["shift_target"]),
        eod_token_id=check_int("data.eod_token_id", d["eod_token_id"], 0, optional=True),
        shuffle=_bool("data.shuffle", d["shuffle"]),
        data_shuffle_seed=check_int("data.data_shuffle_seed", d["data_shuffle_seed"], 0),
        num_epochs=num_epochs,
        worker_count=check_int("data.worker_count", d["worker_count"], 0),
        worker_buffer_size=check_int("data.worker_buffer_size", d["worker_buffer_size"], 1),
        drop_remainder=_bool("data.drop_remainder", d["drop_remainder"]),
        rampup=parse_rampup(_plain(d["rampup"]), key="data.rampup"),
        prefetch=check_int("data.prefetch", d["prefetch"], 1),
        read_threads=read_threads,
        mixture_schedule=mixture_schedule,
        mixture_unit=_choice("data.mixture_unit", d["mixture_unit"], UNITS),
        block_documents=check_int("data.block_documents", d["block_documents"], 1),
        skip_steps=parse_skip_steps(_plain(d["skip_steps"])),
    )


def _choice(key: str, value: Any, valid: tuple[str, ...]) -> str:
    if value not in valid:
        raise DataConfigError(f"{key}={value!r} is invalid; expected one of {list(valid)}")
    return value


#: Longest row accepted (16 Mi tokens): a longer one could not be allocated as
#: a batch, nor embedded by a model, and would fail late (an OverflowError in
#: the model at 10^11) instead of at validation.
MAX_ROW_LENGTH = 1 << 24


def _row_length(value: Any) -> int:
    length = check_int("data.max_target_length", value, 2)
    if length > MAX_ROW_LENGTH:
        raise DataConfigError(
            f"data.max_target_length={length} is invalid; expected an integer in "
            f"[2, {MAX_ROW_LENGTH}] (tokens per row)"
        )
    return length
