"""The whole run config of `trainer_hooks.train`: every key, its default, its checks.

Shipped configs start from `default_config()`, so every documented key exists
in them and `--config.<key>=...` can override it even where the file keeps the
default (`ml_collections` overrides only keys that exist). A config written
without it (a plain dict, an older file) is completed by `with_defaults`,
which also refuses unknown keys by name: a typo would otherwise train with a
default silently.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from ml_collections import ConfigDict, FieldReference, FrozenConfigDict

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
    # vocab_size None: the data's vocabulary (the largest of its sources').
    "model": {"vocab_size": None, "d_model": 64, "num_layers": 2, "num_heads": 4, "mlp_dim": 256},
    "checkpoint": {"every_steps": 50, "every_secs": None, "max_to_keep": 2},
    # every_steps 0: the config's mixture as is; > 0: AdaptiveMixtureHook (README).
    "adaptive_mixture": {
        "every_steps": 0,
        "step_size": 1.0,
        "smoothing": 0.1,
        "reference_loss": None,
    },
    # batch_axis_names None: the dp/fsdp axes the mesh has (e.g. "data" for a mesh "data:-1").
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
    merged["data"] = given.get("data")
    return ConfigDict(merged)
