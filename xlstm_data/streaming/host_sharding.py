"""Which slice of a dataset each data-loading host reads.

Contiguous slices keep each host's reads local in the underlying files. When
the dataset does not divide evenly, the first hosts get one element more, so
every element lands on exactly one host and none is dropped.
"""

from __future__ import annotations

import grain

from xlstm_data.checks import check_int
from xlstm_data.errors import DataConfigError


def shard_bounds(num_elements: int, host_index: int, host_count: int) -> tuple[int, int]:
    """Returns the `[start, stop)` element range of one host.

    Args:
      num_elements: Length of the dataset being sharded.
      host_index: Index of the data-loading host, in `[0, host_count)`.
      host_count: Number of data-loading hosts.

    Returns:
      The contiguous `(start, stop)` range this host reads.
    """
    check_int("dataloading_host_count", host_count, 1)
    if not isinstance(host_index, int) or not 0 <= host_index < host_count:
        raise DataConfigError(
            f"dataloading_host_index={host_index!r} is out of range; valid values are "
            f"0..{host_count - 1} for dataloading_host_count={host_count}"
        )
    base, extra = divmod(num_elements, host_count)
    start = host_index * base + min(host_index, extra)
    stop = start + base + (1 if host_index < extra else 0)
    return start, stop


def shard_grain_dataset(
    grain_dataset: grain.MapDataset, dataloading_host_index: int, dataloading_host_count: int
) -> grain.MapDataset:
    """Shards a grain dataset for multi-host training.

    Args:
      grain_dataset: The `grain.MapDataset` to shard.
      dataloading_host_index: Index of this data-loading host.
      dataloading_host_count: Number of data-loading hosts.

    Returns:
      The contiguous slice of `grain_dataset` this host reads. The first
      `len % count` hosts get one element more than the others.
    """
    if not isinstance(grain_dataset, grain.MapDataset):
        raise DataConfigError(
            f"grain_dataset must be a grain.MapDataset (random access) to be sharded, "
            f"got {type(grain_dataset).__name__}"
        )
    length = len(grain_dataset)
    start, stop = shard_bounds(length, dataloading_host_index, dataloading_host_count)
    if stop <= start:
        raise DataConfigError(
            f"dataset of {length} elements leaves host {dataloading_host_index} of "
            f"{dataloading_host_count} with no elements; use a dataset with at least "
            f"{dataloading_host_count} elements or fewer data-loading hosts"
        )
    return grain_dataset.slice(slice(start, stop))
