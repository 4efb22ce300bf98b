"""SourceDataset: a token source as a grain MapDataset leaf."""

from __future__ import annotations

import numpy as np

from xlstm_data.sources import InMemorySource
from xlstm_data.streaming.source_dataset import SourceDataset


def _docs(n):
    return InMemorySource([np.arange(i + 1, dtype=np.int32) for i in range(n)])


def test_reads_slices_and_wraps_like_a_map_dataset():
    dataset = SourceDataset(_docs(5))
    assert len(dataset) == 5
    assert list(dataset[3]["tokens"]) == [0, 1, 2, 3]
    assert len(dataset[7]["tokens"]) == 3  # indices wrap, as grain sources do
    odd = dataset[1::2]
    assert [len(d["tokens"]) for d in odd] == [2, 4]
    assert "InMemorySource" in str(dataset)


def test_shuffles_repeats_and_iterates_through_grain():
    dataset = SourceDataset(_docs(6)).shuffle(seed=3).repeat(2)
    lengths = [len(d["tokens"]) for d in dataset.to_iter_dataset()]
    assert sorted(lengths) == sorted(list(range(1, 7)) * 2)
    assert lengths[:6] != lengths[6:]  # each epoch is shuffled anew
