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
seed, prepared shards carry `lengths.npy`, in-memory documents are counted
once, and text/JSONL files are tokenized once per machine with the counts kept
in the on-disk cache of `xlstm_data.sources.lengths_cache`. ArrayRecord files that
`xlstm-data prepare` did not write have no lengths: `lengths()` raises naming
the command, and `has_lengths()` lets a caller ask first.
"""

from xlstm_data.sources.array_record import ArrayRecordSource, write_array_record
from xlstm_data.sources.base import TEXT_UNITS, TokenSource, expand_files
from xlstm_data.sources.flat_tokens import FlatTokenSource
from xlstm_data.sources.in_memory import InMemorySource, as_token_source
from xlstm_data.sources.prepared_shards import open_shards
from xlstm_data.sources.synthetic import SyntheticSource
from xlstm_data.sources.text_files import TextFileSource

__all__ = [
    "TEXT_UNITS",
    "ArrayRecordSource",
    "FlatTokenSource",
    "InMemorySource",
    "SyntheticSource",
    "TextFileSource",
    "TokenSource",
    "as_token_source",
    "expand_files",
    "open_shards",
    "write_array_record",
]
