"""xlstm-data: multi-host, checkpointable grain data pipelines for JAX training loops."""

from xlstm_data import sources
from xlstm_data.batch import SOURCE_ID_FIELD, SOURCE_ID_PADDING, LLMBatch
from xlstm_data.checkpoint import DataCheckpointHandler, DataCheckpointRestore, DataCheckpointSave
from xlstm_data.config.data_config import default_data_config
from xlstm_data.errors import DataCheckpointError, DataConfigError, DataReadError
from xlstm_data.factories import (
    LLMDataset,
    make_grain_llm_dataset,
    make_grain_llm_iterator,
    make_grain_multihost_iterator,
)
from xlstm_data.from_config import iterators_from_config
from xlstm_data.multihost.host_layout import DataHostLayout, data_host_layout
from xlstm_data.multihost.iterator import MultiHostDataLoadIterator, PlannedDataIterator
from xlstm_data.multihost.mesh import create_mesh, data_parallel_size, data_sharding
from xlstm_data.multihost.resources import IteratorClosedError
from xlstm_data.source_loss import loss_by_source
from xlstm_data.sources import tokenizers

__all__ = [
    "DataCheckpointError",
    "DataCheckpointHandler",
    "DataCheckpointRestore",
    "DataCheckpointSave",
    "DataConfigError",
    "DataHostLayout",
    "DataReadError",
    "IteratorClosedError",
    "LLMBatch",
    "LLMDataset",
    "MultiHostDataLoadIterator",
    "PlannedDataIterator",
    "SOURCE_ID_FIELD",
    "SOURCE_ID_PADDING",
    "create_mesh",
    "data_host_layout",
    "data_parallel_size",
    "default_data_config",
    "data_sharding",
    "iterators_from_config",
    "loss_by_source",
    "make_grain_llm_dataset",
    "make_grain_llm_iterator",
    "make_grain_multihost_iterator",
    "sources",
    "tokenizers",
]
