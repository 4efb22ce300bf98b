"""CLU-style periodic actions for a JAX training loop, and a reference loop.

`CheckpointHook` saves the model and the data position in one orbax step and
`restore_or_initialize` resumes both; `DataMetricsHook` reports what the data
pipeline delivered; `ProgressHook` logs a progress line. `trainer_hooks.train`
is a complete config-driven training run built from them.
"""

from trainer_hooks.checkpointing import (
    CheckpointHook,
    checkpoint_manager,
    restore_or_initialize,
    save_args,
)
from trainer_hooks.config import default_config
from trainer_hooks.data_metrics import DataMetricsHook
from trainer_hooks.jsonl_writer import JsonlWriter
from trainer_hooks.progress import ProgressHook
from trainer_hooks.writers import TensorBoardWriter, make_writer

__all__ = [
    "CheckpointHook",
    "DataMetricsHook",
    "JsonlWriter",
    "ProgressHook",
    "TensorBoardWriter",
    "default_config",
    "make_writer",
    "checkpoint_manager",
    "restore_or_initialize",
    "save_args",
]
