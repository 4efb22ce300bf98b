"""The whole run config of `trainer_hooks.train`: every key, its default, its checks.

Defined in `xlstm_data.config.run_config`, which the `xlstm-data` command line
reads run configs with too (the library does not import `trainer_hooks`);
configs and callers import these names from here.
"""

from xlstm_data.config.run_config import (
    MAX_MODEL_SIZE,
    TRAIN_DEFAULTS,
    check_train_keys,
    check_train_values,
    default_config,
    with_defaults,
)

__all__ = [
    "MAX_MODEL_SIZE",
    "TRAIN_DEFAULTS",
    "check_train_keys",
    "check_train_values",
    "default_config",
    "with_defaults",
]
