"""The flat shard layout `prepare` writes by default: memory-mapped tokens and document offsets."""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from xlstm_data.config.data_config import validate_data_config
from xlstm_data.errors import DataConfigError, DataReadError
from xlstm_data.plan.global_plan import GlobalPlan
from xlstm_data.prepare.corpus import prepare_corpus
from xlstm_data.reading.planned_batches import PlannedBatchDataset
from xlstm_data.sources import ArrayRecordSource, FlatTokenSource, open_shards
from xlstm_data.sources.flat_tokens import token_dtype
from xlstm_data.sources.identity import file_table, table_digest

LENGTHS = [int(n) for n in np.random.default_rng(3).integers(1, 300, 120)]


def _documents(vocab: int = 258) -> list[np.ndarray]:
    rng = np.random.default_rng(5)
    return [rng.integers(2, vocab, n).astype(np.int32) for n in LENGTHS]


@pytest.fixture(scope="module")
def corpora(tmp_path_factory) -> tuple[Path, Path, list[np.ndarray]]:
    """The same token arrays prepared in both layouts (4 shards each)."""
    root = tmp_path_factory.mktemp("layouts")
    documents = _documents()
    np.savez(root / "ids.npz", *documents)
    flat, ar = root / "flat", root / "ar"
    prepare_corpus([str(root / "ids.npz")], str(flat), num_shards=4)
    prepare_corpus([str(root / "ids.npz")], str(ar), num_shards=4, layout="array_record")
    return flat, ar, documents


def _copy(directory: Path, to: Path) -> Path:
    shutil.copytree(directory, to)
    return to


def test_prepare_writes_flat_shards_by_default(corpora):
    flat, _, documents = corpora
    index = json.loads((flat / "index.json").read_text())
    assert index["layout"] == "flat" and index["token_dtype"] == "uint16"
    names = sorted(p.name for p in flat.iterdir() if p.is_file())
    shards = [f"shard-{k:05d}-of-00004" for k in range(4)]
    expected = [f"{s}.{kind}.npy" for s in shards for kind in ("offsets", "tokens")]
    assert names == sorted(["index.json", "lengths.npy", *expected])
    first = np.load(flat / f"{shards[0]}.tokens.npy")
    offsets = np.load(flat / f"{shards[0]}.offsets.npy")
    assert first.dtype == np.uint16 and offsets.dtype == np.int64 and offsets[0] == 0
    assert offsets[-1] == len(first) == index["shards"][0]["tokens"]
    np.testing.assert_array_equal(first[offsets[0] : offsets[1]], documents[0])


def test_both_layouts_read_the_same_documents_and_lengths(corpora):
    flat, ar, documents = corpora
    a, b = open_shards(str(ar)), open_shards(str(flat))
    assert isinstance(a, ArrayRecordSource) and isinstance(b, FlatTokenSource)
    assert len(a) == len(b) == len(documents)
    np.testing.assert_array_equal(a.lengths(), b.lengths())
    assert b.lengths().tolist() == LENGTHS
    for i, document in enumerate(documents):
        got = b[i]["tokens"]
        assert got.dtype == np.int32 and got.flags.writeable
        np.testing.assert_array_equal(got, document)
    order = np.array([5, -1, 0, 5, 119, 60, 61, 30])
    for x, y in zip(a.read_many(order), b.read_many(order), strict=True):
        np.testing.assert_array_equal(x, y)
    views = b.read_many(order)
    assert all(v.dtype == np.uint16 and not v.flags.writeable for v in views)
    assert b.tokenizer is not None and b.tokenizer.eod_id == a.tokenizer.eod_id
    assert b.vocab_size == a.vocab_size == 258


@pytest.mark.parametrize("packing", ["best_fit", "concat"])
def test_both_layouts_give_the_same_batches(corpora, packing):
    from bench.common import plan_spec

    flat, ar, _ = corpora
    spec = plan_spec(["corpus"], {"corpus": 1.0}, 4, 64, packing)
    datasets = []
    for path in (ar, flat):
        source = open_shards(str(path))
        plan = GlobalPlan(spec, [source.lengths()])
        datasets.append(PlannedBatchDataset(plan, [source], 0, 1, 1, read_threads=2))
    for step in range(40):
        np.testing.assert_array_equal(datasets[0][step]["fields"], datasets[1][step]["fields"])


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(st.integers(-len(LENGTHS), len(LENGTHS) - 1), max_size=50))
def test_read_many_is_every_document_in_the_order_asked(corpora, indices):
    flat, _, documents = corpora
    source = open_shards(str(flat))
    got = source.read_many(indices)
    assert len(got) == len(indices)
    for i, tokens in zip(indices, got, strict=True):
        np.testing.assert_array_equal(tokens, documents[i])


def test_the_dtype_is_the_smallest_that_holds_the_vocabulary(tmp_path):
    assert token_dtype(258) == token_dtype(65536) == "uint16"
    assert token_dtype(65537) == token_dtype(2**31) == "uint32"
    documents = [np.array([0, 69_999, 65_536, 3]), np.array([65_535])]
    np.savez(tmp_path / "ids.npz", *documents)
    prepare_corpus([str(tmp_path / "ids.npz")], str(tmp_path / "out"), vocab_size=70_000)
    source = open_shards(str(tmp_path / "out"))
    assert source.token_dtype == np.uint32
    assert [t.tolist() for t in source.read_many([0, 1])] == [[0, 69_999, 65_536, 3], [65_535]]
    np.savez(tmp_path / "ids16.npz", np.array([0, 65_535]))
    prepare_corpus([str(tmp_path / "ids16.npz")], str(tmp_path / "out16"), vocab_size=65_536)
    source = open_shards(str(tmp_path / "out16"))
    assert source.token_dtype == np.uint16 and source[0]["tokens"].tolist() == [0, 65_535]


def test_nothing_is_opened_until_a_document_is_read(corpora, monkeypatch):
    from xlstm_data.sources import flat_tokens

    flat, ar, _ = corpora
    opened = []
    original_load, original_open = np.load, open

    def recording_load(path, *args, **kwargs):
        opened.append(str(path))
        return original_load(path, *args, **kwargs)

    def recording_open(path, *args, **kwargs):
        opened.append(str(path))
        return original_open(path, *args, **kwargs)

    monkeypatch.setattr(np, "load", recording_load)
    monkeypatch.setattr(flat_tokens, "open", recording_open, raising=False)

    def shards_opened():
        return [p for p in opened if p.endswith((".tokens.npy", ".offsets.npy"))]

    source = open_shards(str(flat))
    source.lengths()
    assert not shards_opened()
    clone = pickle.loads(pickle.dumps(source))
    assert len(pickle.dumps(source)) < 5_000
    clone.read_many([0])
    assert shards_opened() == [
        str(flat / "shard-00000-of-00004.tokens.npy"),
        str(flat / "shard-00000-of-00004.offsets.npy"),
    ]

    import grain

    def refuse(path, *args, **kwargs):
        raise AssertionError(f"opened {path}")

    monkeypatch.setattr(grain.sources, "ArrayRecordDataSource", refuse)
    prepared_ar = open_shards(str(ar))  # counts from index.json: no shard opened
    assert len(prepared_ar) == len(LENGTHS)
    assert prepared_ar.read_many([3])[0].size == LENGTHS[3]  # its batch reader opens lazily


def test_a_truncated_shard_is_one_error_naming_the_file(corpora, tmp_path):
    flat = _copy(corpora[0], tmp_path / "flat")
    shard = flat / "shard-00001-of-00004.tokens.npy"
    shard.write_bytes(shard.read_bytes()[:-10])
    with pytest.raises(DataReadError, match=r"shard-00001-of-00004.tokens.npy: is \d+ bytes but"):
        open_shards(str(flat))
    index = json.loads((flat / "index.json").read_text())
    index["shards"][1]["bytes"] = shard.stat().st_size  # an index that agrees with the damage
    (flat / "index.json").write_text(json.dumps(index))
    source = open_shards(str(flat))
    source.read_many([0])  # other shards still read
    with pytest.raises(DataReadError, match=r"shard-00001-of-00004.tokens.npy: cannot be memory"):
        source.read_many(np.arange(len(source)))


def test_an_edited_shard_is_one_error_naming_the_file_and_document(corpora, tmp_path):
    flat = _copy(corpora[0], tmp_path / "flat")
    shard = flat / "shard-00002-of-00004.tokens.npy"
    tokens = np.load(shard, mmap_mode="r+")
    offsets = np.load(flat / "shard-00002-of-00004.offsets.npy")
    tokens[offsets[3] + 1] = 1000  # outside the byte vocabulary, same file size
    tokens.flush()
    del tokens
    source = open_shards(str(flat))
    shards = json.loads((flat / "index.json").read_text())["shards"]
    starts = np.cumsum([0, *[shard["documents"] for shard in shards]])
    bad = int(starts[2]) + 3
    with pytest.raises(
        DataReadError,
        match=rf"document 3 of .*shard-00002-of-00004.tokens.npy.*index {bad}.*token id 1000",
    ):
        source.read_many([0, bad, 1])
    with pytest.raises(DataReadError, match="token id 1000"):
        source[bad]
    source.read_many([bad - 1, bad + 1])  # its neighbours are fine

    offsets_file = flat / "shard-00002-of-00004.offsets.npy"
    edited = offsets.copy()
    edited[5] = edited[6] + 1  # decreasing
    np.save(offsets_file, edited)
    with pytest.raises(
        DataReadError, match=r"shard-00002-of-00004.offsets.npy: document 5 .*damaged"
    ):
        open_shards(str(flat)).read_many([int(starts[2]) + 5])
    edited = offsets.copy()
    edited[-1] += 1
    np.save(offsets_file, edited)
    with pytest.raises(DataReadError, match=r"offsets.npy: offsets run from 0 to"):
        open_shards(str(flat)).read_many([int(starts[2])])


def test_the_identity_covers_tokens_and_offsets(corpora, tmp_path):
    flat = _copy(corpora[0], tmp_path / "flat")
    source = open_shards(str(flat))
    table = file_table(source)
    assert sorted(Path(p).name for p in table) == sorted(
        p.name for p in flat.iterdir() if p.name.startswith("shard-")
    )
    before = table_digest(table)
    offsets = flat / "shard-00000-of-00004.offsets.npy"
    stat = offsets.stat()  # rewritten in place: another modification time
    os.utime(offsets, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert table_digest(file_table(source)) != before


def test_a_config_names_either_layout_by_its_directory(corpora, tmp_path):
    flat, ar, _ = corpora
    for path in (flat, ar):
        config = validate_data_config(
            {
                "train": {"corpus": {"kind": "array_record", "path": str(path)}},
                "global_batch_size": 2,
                "max_target_length": 32,
            }
        )
        assert len(config.train[0].build()) == len(LENGTHS)
    assert isinstance(open_shards(str(flat / "*.tokens.npy")), FlatTokenSource)
    with pytest.raises(DataConfigError, match=r"matches no file.*flat layout.*pass path="):
        open_shards(str(flat / "*.array_record"), arg="data.train.corpus.path")
    with pytest.raises(DataConfigError, match=r"holds flat token shards.*record_format='text'"):
        open_shards(str(flat), record_format="text")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataConfigError, match=r"is a directory without index.json"):
        open_shards(str(tmp_path / "empty"))
    with pytest.raises(DataConfigError, match=r"flat token shards .* and .*lengths.npy"):
        open_shards([str(flat / "*.tokens.npy"), str(flat / "lengths.npy")])
    with pytest.raises(DataConfigError, match=r"'flat' layout, not ArrayRecord"):
        ArrayRecordSource(str(flat / "*.tokens.npy"))
    with pytest.raises(DataConfigError, match=r"not a flat token shard"):
        FlatTokenSource(str(ar / "*.array_record"))


def test_a_rerun_in_the_other_layout_replaces_the_shards(tmp_path):
    documents = _documents()[:20]
    np.savez(tmp_path / "ids.npz", *documents)
    out = tmp_path / "out"
    prepare_corpus([str(tmp_path / "ids.npz")], str(out), num_shards=2)
    prepare_corpus([str(tmp_path / "ids.npz")], str(out), num_shards=2, layout="array_record")
    assert sorted(p.suffix for p in out.glob("shard-*")) == [".array_record"] * 2
    assert isinstance(open_shards(str(out)), ArrayRecordSource)
    prepare_corpus([str(tmp_path / "ids.npz")], str(out), num_shards=2)
    assert len(list(out.glob("shard-*"))) == 4 and not list(out.glob("*.array_record"))
    source = open_shards(str(out))
    for i, document in enumerate(documents):
        np.testing.assert_array_equal(source[i]["tokens"], document)


def test_workers_read_flat_shards_as_the_main_process_does(corpora):
    """The source pickles to grain workers (as paths) and maps its shards there."""
    from xlstm_data import create_mesh, iterators_from_config

    flat, ar, _ = corpora
    batches = {}
    for name, path, workers in (("flat", flat, 0), ("flat_workers", flat, 2), ("ar", ar, 0)):
        data = {
            "train": {"corpus": {"kind": "array_record", "path": str(path)}},
            "global_batch_size": 8,
            "max_target_length": 64,
            "worker_count": workers,
        }
        train, _ = iterators_from_config(data, create_mesh())
        try:
            batches[name] = [
                {k: np.asarray(v) for k, v in next(train).to_dict().items()} for _ in range(6)
            ]
        finally:
            train.close()
    for other in ("flat_workers", "ar"):
        for x, y in zip(batches["flat"], batches[other], strict=True):
            for key in x:
                np.testing.assert_array_equal(x[key], y[key], err_msg=f"{other} {key}")


def _as_an_earlier_versions_part(out: Path, ids: np.ndarray) -> Path:
    """Makes the one part of `out` one an earlier version wrote: int32 `ids`, no dtype named.

    Every shard's marker is removed, so a rerun rewrites the shards from it.
    Returns the part's marker.
    """
    (marker,) = (out / ".prepare" / "parts").glob("*.done.json")
    summary = json.loads(marker.read_text())
    assert summary["token_dtype"] == "<u2"
    del summary["token_dtype"]
    marker.write_text(json.dumps(summary))
    marker.with_name(marker.name.replace(".done.json", ".tokens")).write_bytes(ids.tobytes())
    for done in (out / ".prepare" / "shards").glob("*.done.json"):
        done.unlink()
    return marker


def test_parts_hold_the_shards_dtype_and_an_int32_part_of_an_earlier_version_still_reads(
    tmp_path,
):
    """Parts are written in the flat shards' dtype (half the bytes of int32 for uint16 ids).

    A part tokenized before parts named their dtype is int32 and its marker
    names none: a rerun that must rewrite the shards from it reads it as int32.
    """
    documents = _documents()
    np.savez(tmp_path / "ids.npz", *documents)
    out = tmp_path / "flat"
    prepare_corpus([str(tmp_path / "ids.npz")], str(out), num_shards=4)
    marker = _as_an_earlier_versions_part(out, np.concatenate(documents).astype("<i4"))
    for shard in out.glob("shard-*.npy"):
        shard.unlink()
    prepare_corpus([str(tmp_path / "ids.npz")], str(out), num_shards=4)
    assert "token_dtype" not in json.loads(marker.read_text())  # read, not tokenized again
    source = open_shards(str(out))
    assert len(source) == len(documents)
    for got, want in zip(source.read_many(np.arange(len(documents))), documents, strict=True):
        np.testing.assert_array_equal(got, want)


def test_an_int32_part_with_an_id_the_shards_dtype_cannot_hold_fails_naming_it(tmp_path):
    """Narrowing an earlier version's int32 part is checked: an id would wrap without a sound."""
    documents = _documents()
    np.savez(tmp_path / "ids.npz", *documents)
    out = tmp_path / "flat"
    prepare_corpus([str(tmp_path / "ids.npz")], str(out), num_shards=4)
    ids = np.concatenate(documents).astype("<i4")
    ids[len(ids) // 2] = 70_000  # the work file was changed: does not fit in uint16
    _as_an_earlier_versions_part(out, ids)
    with pytest.raises(DataReadError, match=r"holds id 70000 .*outside \[0, 65535\]"):
        prepare_corpus([str(tmp_path / "ids.npz")], str(out), num_shards=4)
