"""The reference factories on the plan: resume anywhere, workers never change data, refusals."""

from __future__ import annotations

import grain
import numpy as np
import pytest

import xlstm_data as xd
from tests.multiprocess import run_processes
from xlstm_data.errors import DataConfigError


def _mesh():
    return xd.create_mesh("dp:1,fsdp:-1,tp:1,sp:1")


def _documents(count=300, seed=0):
    rng = np.random.default_rng(seed)
    return [
        {"tokens": rng.integers(2, 250, size=int(n), dtype=np.int32)}
        for n in rng.integers(1, 90, size=count)
    ]


def _iterator(dataset=None, **overrides):
    args = dict(
        dataloading_host_index=None,
        dataloading_host_count=None,
        global_mesh=_mesh(),
        dataset=_documents() if dataset is None else dataset,
        global_batch_size=8,
        max_target_length=32,
        shuffle=True,
        data_shuffle_seed=5,
        grain_packing=True,
        worker_count=0,
    )
    return xd.make_grain_llm_iterator(**{**args, **overrides})


def _take(iterator, steps):
    try:
        return [
            {k: np.asarray(v) for k, v in next(iterator).items() if k != xd.SOURCE_ID_FIELD}
            for _ in range(steps)
        ]
    finally:
        iterator.close()


def _same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.keys() == y.keys()
        for key in x:
            np.testing.assert_array_equal(x[key], y[key], err_msg=key)


@pytest.mark.parametrize("processes", [1, 3])
def test_the_readme_example_saved_on_two_processes_resumes_on_another_count(tmp_path, processes):
    params = {"directory": str(tmp_path / "ckpt"), "save_at": 3, "end": 7}
    saved = run_processes(
        "factory_resume", 2, tmp_path, {**params, "mode": "save", "worker_count": 1}
    )[0]
    (tmp_path / "resume").mkdir()
    resumed = run_processes(
        "factory_resume",
        processes,
        tmp_path / "resume",
        {**params, "mode": "resume", "worker_count": 0},
    )
    assert sorted(saved, key=int) == ["3", "4", "5", "6"]
    assert all(r == saved for r in resumed)


def test_the_factory_returns_the_config_path_iterator_type():
    iterator = _iterator()
    try:
        assert type(iterator) is xd.PlannedDataIterator
        assert iterator.source_names == ("0",)
    finally:
        iterator.close()


def test_worker_count_never_changes_the_data():
    _same(_take(_iterator(worker_count=0), 6), _take(_iterator(worker_count=2), 6))


def test_a_grain_map_dataset_and_a_plain_list_give_the_same_batches():
    documents = _documents()
    as_grain = grain.MapDataset.source(documents)
    _same(_take(_iterator(documents), 4), _take(_iterator(as_grain), 4))


class _Doubled(grain.transforms.Map):
    def map(self, element):
        return {"tokens": np.concatenate([element["tokens"], element["tokens"]])}


class _Prefixed(grain.transforms.MapWithIndex):
    def map_with_index(self, index, element):
        return {"tokens": np.concatenate([[index % 200 + 2], element["tokens"]])}


def test_operations_are_applied_before_the_lengths_are_counted():
    documents = _documents(40)
    iterator = _iterator(
        documents,
        operations=[_Doubled(), _Prefixed()],
        shuffle=False,
        grain_packing=False,
        num_epochs=1,
        shift=False,
        drop_remainder=False,
    )
    try:
        served = [(np.asarray(b["inputs"]), np.asarray(b["inputs_segmentation"])) for b in iterator]
    finally:
        iterator.close()
    tokens = np.concatenate([x[s > 0] for x, s in served])
    expected = np.concatenate(
        [
            np.concatenate([[i % 200 + 2], d["tokens"], d["tokens"], [0]])
            for i, d in enumerate(documents)
        ]
    )
    np.testing.assert_array_equal(tokens, expected)


class _Dropper(grain.transforms.Filter):
    def filter(self, element):
        return True


class _Noisy(grain.transforms.RandomMap):
    def random_map(self, element, rng):
        return element


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"operations": [_Doubled(), _Dropper()]}, "operations[1] is a _Dropper"),
        ({"operations": [_Noisy()]}, "operations[0] is a _Noisy"),
        ({"operations": [lambda x: x]}, "operations[0] is a function"),
        ({"apply_padding": False}, "apply_padding=False cannot be honoured"),
        ({"dataloading_host_count": 2}, "dataloading_host_count=2 disagrees with the mesh"),
        ({"dataloading_host_index": 1}, "dataloading_host_index=1 disagrees with the mesh"),
        ({"global_batch_size": 7}, "global_batch_size 7"),
        ({"batch_rampup_factors": {0: 0.3, 5: 1.0}}, "batch_rampup_factors"),
        ({"global_batch_size": 10**9}, "global_batch_size=1000000000 rows is more"),
        ({"max_target_length": 1}, "max_target_length"),
        ({"data_shuffle_seed": -1}, "data_shuffle_seed"),
        ({"dataset": []}, "empty"),
        ({"dataset": [{"ids": [1, 2]}]}, "without a 'tokens' key"),
    ],
)
def test_arguments_the_plan_cannot_honour_are_refused_by_name(overrides, message):
    with pytest.raises(DataConfigError, match=None) as caught:
        _iterator(**overrides).close()
    assert message in str(caught.value)


def _dataset(documents, **overrides):
    args = dict(
        dataloading_host_index=0,
        dataloading_host_count=1,
        dataset=documents,
        global_batch_size=8,
        max_target_length=32,
        shuffle=True,
        data_shuffle_seed=5,
        grain_packing=True,
    )
    return xd.make_grain_llm_dataset(**{**args, **overrides})


def test_a_mixture_of_factory_datasets_serves_its_weights():
    a, b = _documents(400, seed=1), _documents(400, seed=2)
    iterator = xd.make_grain_multihost_iterator(
        {"a": _dataset(a), "b": _dataset(b)},
        [400, 400],
        _mesh(),
        8,
        dataset_weights={"a": 3, "b": 1},
        worker_count=0,
    )
    try:
        assert iterator.mixture_weights_at(0) == {"a": 0.75, "b": 0.25}
        ids = np.concatenate([np.asarray(next(iterator)["source_ids"]).ravel() for _ in range(30)])
    finally:
        iterator.close()
    counts = np.bincount(ids[ids >= 0], minlength=2)
    assert abs(counts[0] / counts.sum() - 0.75) < 0.05


@pytest.mark.parametrize(
    "datasets, lengths, weights, message",
    [
        ("differ", None, None, "grain_datasets disagree on max_target_length"),
        ("epochs", None, None, "num_epochs bounds a single dataset"),
        ("same", [1, 2], None, "dataset_lengths=[1, 2] disagrees"),
        ("same", None, [1.0], "dataset_weights has 1 weights for 2 datasets"),
        ("same", None, {"c": 1.0}, "unknown datasets ['c']"),
        ("same", None, [0, 0], "dataset_weights"),
        ("pipeline", None, None, "grain_datasets['0'] is a"),
    ],
)
def test_bad_mixtures_are_refused_by_name(datasets, lengths, weights, message):
    docs = _documents(100)
    built = {
        "differ": [_dataset(docs), _dataset(docs, max_target_length=64)],
        "epochs": [_dataset(docs, num_epochs=1), _dataset(docs, num_epochs=1)],
        "same": [_dataset(docs), _dataset(docs)],
        "pipeline": [grain.MapDataset.source(docs).to_iter_dataset()],
    }[datasets]
    with pytest.raises(DataConfigError) as caught:
        xd.make_grain_multihost_iterator(
            built, lengths, _mesh(), 8, dataset_weights=weights, worker_count=0
        ).close()
    assert message in str(caught.value)


def test_id_shards_without_a_tokenizer_are_counted_once_per_machine(tmp_path, monkeypatch):
    """MaxText-style int32 ArrayRecord shards, no index, no tokenizer: counted at the first
    start, read from the lengths cache at the next, and read in batches (`read_many`)."""
    from xlstm_data.sources import ArrayRecordSource, write_array_record
    from xlstm_data.sources.mapped import MappedSource
    from xlstm_data.sources.with_lengths import WithLengths

    monkeypatch.setenv("XLSTM_DATA_CACHE_DIR", str(tmp_path / "cache"))
    documents = _documents(120)
    paths = [str(tmp_path / f"part-{i}.array_record") for i in range(2)]
    write_array_record(paths[0], [d["tokens"] for d in documents[:70]])
    write_array_record(paths[1], [d["tokens"] for d in documents[70:]])
    counted = []
    count = MappedSource._count
    monkeypatch.setattr(MappedSource, "_count", lambda self: counted.append(1) or count(self))

    def dataset():
        return xd.make_grain_llm_dataset(0, 1, ArrayRecordSource(paths), 8, 32, True, 5)

    first = dataset()
    again = dataset()
    assert counted == [1]  # the second start read the cache
    assert isinstance(first.documents, WithLengths) and isinstance(again.documents, WithLengths)
    expected = [len(d["tokens"]) for d in documents]
    assert again.documents.lengths().tolist() == expected
    _same(_take(_iterator(ArrayRecordSource(paths)), 4), _take(_iterator(documents), 4))
