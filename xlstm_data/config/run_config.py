"""The whole run config of `trainer_hooks.train`: every key, its default, its checks.

It lives in the library, not in `trainer_hooks`, because the command line
reads the same run configs (`xlstm-data inspect --config=run.py`, `batch`,
`bench`) and refuses the same unknown keys, and the command line is built on
the library alone; `trainer_hooks.config` re-exports these names.

Shipped configs start from `default_config()`, so every documented key exists
in them and `--config.<key>=...` can override it even where the file keeps the
default (`ml_collections` overrides only keys that exist). A config written
without it (a plain dict, an older file) is completed by `with_defaults`,
which also refuses unknown keys by name: a typo would otherwise train with a
default silently.
"""

from __future__ import annotations

import copy
import math
import numbers
from collections.abc import Mapping
from typing import Any

from ml_collections import ConfigDict, FieldReference, FrozenConfigDict

from xlstm_data.checks import check_int
from xlstm_data.config.data_config import default_data_config
from xlstm_data.errors import DataConfigError

#: Keys of the training part of a config, with their defaults. None marks a
#: key that is unset by default; its type is in `_UNSET_KEY_TYPES`.
TRAIN_DEFAULTS: dict[str, Any] = {
    "seed": 0,
    "num_train_steps": 100,
    "learning_rate": 3e-3,
    "warmup_steps": 20,
    "log_every_steps": 10,
    "eval_every_steps": 0,
    # vocab_size None: the data's vocabulary (the largest of its sources'). The
    # reference model only consumes the batches; at 32 wide it trains the demo's
    # 32 x 128-token steps 3-4x faster on 2 CPU cores than at 64 wide.
    "model": {"vocab_size": None, "d_model": 32, "num_layers": 1, "num_heads": 2, "mlp_dim": 128},
    "checkpoint": {"every_steps": 50, "every_secs": None, "max_to_keep": 2},
    # every_steps 0: the config's mixture as is; > 0: AdaptiveMixtureHook (README).
    "adaptive_mixture": {
        "every_steps": 0,
        "step_size": 1.0,
        "smoothing": 0.1,
        "reference_loss": None,
    },
    # batch_axis_names None: the data/dp/fsdp axes the mesh has (a mesh "batch:-1" must name it).
    "mesh": {"axis_dims": "dp:1,fsdp:-1,tp:1,sp:1", "batch_axis_names": None},
}

_UNSET_KEY_TYPES: dict[str, type] = {
    "model.vocab_size": int,
    "checkpoint.every_secs": float,
    "mesh.batch_axis_names": object,
    "adaptive_mixture.reference_loss": object,
}


def _as_config_dict(defaults: Mapping[str, Any], prefix: str = "") -> ConfigDict:
    config = ConfigDict()
    for key, value in defaults.items():
        if isinstance(value, Mapping):
            config[key] = _as_config_dict(value, f"{prefix}{key}.")
        elif f"{prefix}{key}" in _UNSET_KEY_TYPES:
            config[key] = FieldReference(value, field_type=_UNSET_KEY_TYPES[f"{prefix}{key}"])
        else:
            # Typed by the default, but None stays allowed (e.g. max_to_keep=None keeps all).
            config[key] = FieldReference(value, field_type=type(value))
    return config


def default_config() -> ConfigDict:
    """A run config with every key at its default; `data.train` is still empty.

    Returns:
      A `ConfigDict` holding the training keys (`TRAIN_DEFAULTS`) and the data
      section (`xlstm_data.config.data_config.default_data_config()`).
    """
    config = _as_config_dict(TRAIN_DEFAULTS)
    config.data = default_data_config()
    return config


def _plain(value: Any) -> Any:
    if isinstance(value, ConfigDict | FrozenConfigDict):
        return value.to_dict()
    return value


def check_train_keys(config: Any) -> None:
    """Rejects unknown keys outside `data`, naming the key and the valid ones."""
    known = {**TRAIN_DEFAULTS, "data": None}

    def check(section: Mapping[str, Any], defaults: Mapping[str, Any], prefix: str) -> None:
        for key, value in section.items():
            if key not in defaults:
                raise DataConfigError(
                    f"config key {prefix}{key} is unknown; valid keys here: {sorted(defaults)}"
                )
            if isinstance(defaults[key], Mapping):
                if not isinstance(value, Mapping):
                    raise DataConfigError(
                        f"config key {prefix}{key}={value!r} must be a section with keys "
                        f"{sorted(defaults[key])}"
                    )
                check(value, defaults[key], f"{prefix}{key}.")

    check(_plain(config), known, "")


def with_defaults(config: Any) -> ConfigDict:
    """`config` completed with the default of every key it leaves out.

    Args:
      config: A run config (`ConfigDict` or dict), complete or not.

    Returns:
      A new `ConfigDict` with every training key present. The `data` section
      is kept as given; `xlstm_data.validate_data_config` fills and checks it.

    Raises:
      DataConfigError: A key outside `data` is unknown.
    """
    check_train_keys(config)
    given = _plain(config)

    def merge(defaults: Mapping[str, Any], values: Mapping[str, Any]) -> dict[str, Any]:
        out = copy.deepcopy(dict(defaults))
        for key, value in values.items():
            if isinstance(defaults.get(key), Mapping):
                out[key] = merge(defaults[key], value)
            else:
                out[key] = value
        return out

    merged = merge(TRAIN_DEFAULTS, {k: v for k, v in given.items() if k != "data"})
    check_train_values(merged)
    merged["data"] = given.get("data")
    return ConfigDict(merged)


#: Largest size a model key may take: an embedding of more rows or columns would
#: not fit in any accelerator's memory, and would overflow the model's own
#: index arithmetic (max_target_length=10^11 did) long after the data checks.
MAX_MODEL_SIZE = 1 << 24


def check_train_values(config: Mapping[str, Any]) -> None:
    """Refuses a training key whose value would fail late or silently, by key.

    Checked before any data is read: a zero interval would divide by zero
    after the first step, `max_to_keep=0` would keep no checkpoint and the
    rerun would start over silently, a NaN learning rate would train on NaN.
    """
    check_int("seed", config["seed"], 0)
    check_int("num_train_steps", config["num_train_steps"], 1)
    check_int("warmup_steps", config["warmup_steps"], 0)
    check_int("log_every_steps", config["log_every_steps"], 1)
    check_int("eval_every_steps", config["eval_every_steps"], 0, optional=True)
    rate = config["learning_rate"]
    if not _real(rate) or not math.isfinite(rate) or rate <= 0:
        raise DataConfigError(f"learning_rate={rate!r} is invalid; expected a finite number > 0")
    model = config["model"]
    check_int("model.vocab_size", model["vocab_size"], 2, optional=True)
    for key in ("d_model", "num_layers", "num_heads", "mlp_dim", "vocab_size"):
        value = check_int(f"model.{key}", model[key], 1, optional=key == "vocab_size")
        if value is not None and value > MAX_MODEL_SIZE:
            raise DataConfigError(
                f"model.{key}={value} is invalid; expected an integer <= {MAX_MODEL_SIZE}"
            )
    if model["d_model"] % model["num_heads"]:
        raise DataConfigError(
            f"model.num_heads={model['num_heads']} does not divide model.d_model="
            f"{model['d_model']}; choose a divisor of d_model"
        )
    checkpoint = config["checkpoint"]
    check_int("checkpoint.every_steps", checkpoint["every_steps"], 1, optional=True)
    check_int("checkpoint.max_to_keep", checkpoint["max_to_keep"], 1, optional=True)
    secs = checkpoint["every_secs"]
    if secs is not None and (not _real(secs) or not math.isfinite(secs) or secs <= 0):
        raise DataConfigError(
            f"checkpoint.every_secs={secs!r} is invalid; expected a finite number > 0 or None"
        )
    check_int("adaptive_mixture.every_steps", config["adaptive_mixture"]["every_steps"], 0)


def _real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)
