"""Random-access document sources: where token ids enter the pipeline.

Every source here is a grain random-access data source (`__len__`,
`__getitem__`) whose elements are documents `{"tokens": int32 1-D array}`.
Global shuffling, sharding and checkpointing in grain rely only on indices, so a
source must return the same document for the same index in every process and in
any access order.

Sources are built in the launcher process and pickled into grain worker
processes; they therefore validate their arguments (and peek at the first
record) at construction, keep only picklable state, and open file handles
lazily in the process that reads. Corrupt or mismatched data raises
`DataReadError` naming the file and record, so a bad shard can be found without
reading our code.

Every source also reports every document's token count through `lengths()`
without the pipeline reading documents: a global data plan (and an exact epoch
length) is fixed before training starts. Synthetic lengths are drawn from the
seed, prepared shards carry `lengths.npy`, Megatron-LM's `.idx` files hold
them, in-memory documents are counted
once, and text/JSONL files are tokenized once per machine with the counts kept
in the on-disk cache of `xlstm_data.sources.lengths_cache`. ArrayRecord files that
`xlstm-data prepare` did not write have no lengths: `lengths()` raises naming
the command, and `has_lengths()` lets a caller ask first.

The names below load on first use (PEP 562), so a light module (the config's
checks, the command line's parser) can import `xlstm_data.sources.base`
without loading grain.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from xlstm_data.lazy_names import lazy_names as _lazy_names

#: Public name -> the module that defines it.
_EXPORTS = {
    "TEXT_UNITS": "xlstm_data.sources.base",
    "ArrayRecordSource": "xlstm_data.sources.array_record",
    "FlatTokenSource": "xlstm_data.sources.flat_tokens",
    "InMemorySource": "xlstm_data.sources.in_memory",
    "MegatronIndexedSource": "xlstm_data.sources.megatron_indexed",
    "SyntheticSource": "xlstm_data.sources.synthetic",
    "TextFileSource": "xlstm_data.sources.text_files",
    "TokenSource": "xlstm_data.sources.base",
    "as_token_source": "xlstm_data.sources.in_memory",
    "expand_files": "xlstm_data.sources.base",
    "open_shards": "xlstm_data.sources.prepared_shards",
    "write_array_record": "xlstm_data.sources.array_record",
    "tokenizers": "xlstm_data.sources.tokenizers",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = _lazy_names(__name__, _EXPORTS)


if TYPE_CHECKING:  # for type checkers and IDEs: the same names, imported eagerly
    from xlstm_data.sources import tokenizers as tokenizers
    from xlstm_data.sources.array_record import ArrayRecordSource as ArrayRecordSource
    from xlstm_data.sources.array_record import write_array_record as write_array_record
    from xlstm_data.sources.base import TEXT_UNITS as TEXT_UNITS
    from xlstm_data.sources.base import TokenSource as TokenSource
    from xlstm_data.sources.base import expand_files as expand_files
    from xlstm_data.sources.flat_tokens import FlatTokenSource as FlatTokenSource
    from xlstm_data.sources.in_memory import InMemorySource as InMemorySource
    from xlstm_data.sources.in_memory import as_token_source as as_token_source
    from xlstm_data.sources.megatron_indexed import MegatronIndexedSource as MegatronIndexedSource
    from xlstm_data.sources.prepared_shards import open_shards as open_shards
    from xlstm_data.sources.synthetic import SyntheticSource as SyntheticSource
    from xlstm_data.sources.text_files import TextFileSource as TextFileSource
