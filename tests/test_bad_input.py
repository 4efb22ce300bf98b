"""Every bad argument is reported with its name, value and what is valid, before reading data."""

from __future__ import annotations

import numpy as np
import pytest

import xlstm_data as xd
from tests.helpers import unique_token_docs

DOCS = unique_token_docs([5, 6, 7, 8])


class _ExplodingSource:
    """A source that fails the test if any document is read."""

    def __len__(self):
        return 4

    def __getitem__(self, index):
        raise AssertionError("data was read before the argument check")


def _dataset(**overrides):
    kwargs = dict(
        dataloading_host_index=0,
        dataloading_host_count=1,
        dataset=_ExplodingSource(),
        global_batch_size=4,
        max_target_length=8,
        shuffle=True,
        data_shuffle_seed=0,
    )
    kwargs.update(overrides)
    return xd.make_grain_llm_dataset(**kwargs)


def test_nothing_is_read_while_building():
    _dataset()


@pytest.mark.parametrize(
    "overrides,match",
    [
        ({"max_target_length": 1}, "max_target_length=1 is invalid"),
        ({"dataloading_host_index": 2, "dataloading_host_count": 2}, "dataloading_host_index=2"),
        ({"dataloading_host_index": -1}, "dataloading_host_index=-1"),
        ({"dataloading_host_count": 0}, "dataloading_host_count=0"),
        ({"global_batch_size": 3, "dataloading_host_count": 2}, "global_batch_size=3"),
        ({"num_epochs": 0}, "num_epochs=0"),
        ({"grain_packing_bin_count": 0, "grain_packing": True}, "grain_packing_bin_count=0"),
        ({"dataset": []}, "empty"),
    ],
)  # fmt: skip
def test_bad_dataset_arguments(overrides, match):
    with pytest.raises(xd.DataConfigError, match=match):
        _dataset(**overrides)


def test_global_batch_not_divisible_by_data_parallel_size():
    mesh = xd.create_mesh()
    with pytest.raises(xd.DataConfigError, match="global_batch_size 6 .* not divisible"):
        xd.make_grain_llm_iterator(None, None, mesh, _ExplodingSource(), 6, 8, True, 0)


def test_host_index_that_disagrees_with_the_mesh():
    mesh = xd.create_mesh()
    with pytest.raises(
        xd.DataConfigError, match="dataloading_host_count=2 disagrees with the mesh"
    ):
        xd.make_grain_llm_iterator(0, 2, mesh, DOCS, 4, 8, True, 0, worker_count=0)


def test_glob_without_match(tmp_path):
    from xlstm_data.sources import ArrayRecordSource

    with pytest.raises(xd.DataConfigError, match="nothing-here"):
        xd.make_grain_llm_iterator(
            None, None, xd.create_mesh(),
            ArrayRecordSource(str(tmp_path / "nothing-here*")),
            4, 8, True, 0,
        )  # fmt: skip


def test_token_ids_outside_the_vocabulary_name_the_record(tmp_path):
    from xlstm_data.sources import ArrayRecordSource, write_array_record

    path = tmp_path / "shard.array_record"
    write_array_record(path, [np.array([3, 4], np.int32), np.array([5, 999], np.int32)])
    source = ArrayRecordSource(str(path), vocab_size=258)
    with pytest.raises(xd.DataReadError, match=r"999.*258|258.*999") as error:
        xd.make_grain_llm_iterator(  # its lengths are counted: every record is read
            None, None, xd.create_mesh(), source, 4, 8, False, 0, worker_count=0, num_epochs=1
        )
    assert "shard.array_record" in str(error.value)
