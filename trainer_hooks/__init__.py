"""CLU-style periodic actions for a JAX training loop, and a reference loop.

`CheckpointHook` saves the model and the data position in one orbax step and
`restore_or_initialize` resumes both; `DataMetricsHook` reports what the data
pipeline delivered; `ProgressHook` logs a progress line. `trainer_hooks.train`
is a complete config-driven training run built from them.

Its names are imported on first use (PEP 562): `python -m trainer_hooks.train`
imports this package first, and a multi-process run's launched process, which
only watches the process that trains (`trainer_hooks.launch`), needs none of
JAX or orbax.
"""

from __future__ import annotations

from xlstm_data.lazy_names import lazy_names as _lazy_names

#: Each exported name and the module that defines it.
_EXPORTS = {
    "CheckpointHook": "trainer_hooks.checkpointing",
    "checkpoint_manager": "trainer_hooks.checkpointing",
    "restore_or_initialize": "trainer_hooks.checkpointing",
    "save_args": "trainer_hooks.checkpointing",
    "default_config": "trainer_hooks.config",
    "DataMetricsHook": "trainer_hooks.data_metrics",
    "JsonlWriter": "trainer_hooks.jsonl_writer",
    "ProgressHook": "trainer_hooks.progress",
    "TensorBoardWriter": "trainer_hooks.writers",
    "make_writer": "trainer_hooks.writers",
}

__all__ = list(_EXPORTS)

__getattr__, __dir__ = _lazy_names(__name__, _EXPORTS)
