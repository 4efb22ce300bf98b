"""How many documents each source reads ahead, and with how many threads.

grain reads a MapDataset ahead in a thread pool when it becomes an
IterDataset. Its default (16 threads, a 500-document buffer) suits remote
storage, but on local files it costs most of the pipeline's CPU (the buffer
is walked once per document) and makes every restore re-issue 500 reads
(`bench/README.md`). This library defaults to a few threads and a short
buffer; the order of the data and the iterator state do not depend on it.
"""

from __future__ import annotations

import grain

from xlstm_data.checks import check_int
from xlstm_data.errors import DataConfigError

DEFAULT_READ_THREADS = 2
DEFAULT_READ_BUFFER_SIZE = 64


def read_options(
    threads: int | None = None,
    buffer_size: int | None = None,
    *,
    keys: tuple[str, str] = ("read_threads", "read_buffer_size"),
) -> grain.ReadOptions:
    """grain `ReadOptions` for one source, with this library's defaults.

    Args:
      threads: Reader threads per source and process (0: read in the
        iterating thread); default `DEFAULT_READ_THREADS`.
      buffer_size: Documents read ahead per source and process; default
        `DEFAULT_READ_BUFFER_SIZE`, or 0 with 0 threads.
      keys: Names of the two settings in error messages.
    """
    threads_key, buffer_key = keys
    threads = DEFAULT_READ_THREADS if threads is None else check_int(threads_key, threads, 0)
    if buffer_size is None:
        buffer_size = DEFAULT_READ_BUFFER_SIZE if threads else 0
    check_int(buffer_key, buffer_size, 0)
    if threads and buffer_size < threads:
        raise DataConfigError(
            f"{buffer_key}={buffer_size} is smaller than {threads_key}={threads}: every reader "
            f"thread needs a slot to read into; use {buffer_key} >= {threads}, or "
            f"{threads_key}=0 to read inline"
        )
    return grain.ReadOptions(num_threads=threads, prefetch_buffer_size=buffer_size)
