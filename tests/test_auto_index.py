"""ArrayRecord shards made elsewhere (MaxText's text shards) train with no `index` step."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import numpy as np
import pytest

import xlstm_data as xd
from tests.helpers import to_numpy
from xlstm_data.prepare import index_shards
from xlstm_data.sources import write_array_record
from xlstm_data.sources.lengths_cache import CACHE_DIR_ENV

LINES = [f"document {i} " + "word " * (i % 23) for i in range(300)]


def _text_shards(directory: Path) -> Path:
    directory.mkdir(parents=True)
    write_array_record(directory / "part-0.array_record", LINES[:170])
    write_array_record(directory / "part-1.array_record", LINES[170:])
    return directory


def _config(directory: Path, record_format: str = "text") -> dict:
    return {
        "train": {
            "web": {
                "kind": "array_record",
                "path": str(directory / "*.array_record"),
                "record_format": record_format,
            }
        },
        "global_batch_size": 4,
        "max_target_length": 32,
        "num_epochs": 1,
        "shuffle": False,
        "packing": "concat",  # documents in order
        "shift": False,  # inputs are the documents and their EOD, as read
        "drop_remainder": False,
    }


def _tokens(config: dict) -> np.ndarray:
    train, _ = xd.iterators_from_config(config, xd.create_mesh("dp:1,fsdp:-1,tp:1,sp:1"))
    try:
        batches = [to_numpy(b) for b in train]
    finally:
        train.close()
    return np.concatenate([b["inputs"][b["inputs_segmentation"] > 0] for b in batches])


@pytest.fixture
def counts(monkeypatch):
    """How many shards were counted (tokenized) in this process."""
    counted = []
    original = index_shards._counted  # noqa: SLF001 - where every count passes

    def counting(jobs, workers):
        counted.extend(job.path for job in jobs)
        return original(jobs, workers)

    monkeypatch.setattr(index_shards, "_counted", counting)
    return counted


def _expected_tokens() -> np.ndarray:
    eod = 1  # the byte tokenizer's end of document
    return np.concatenate(
        [np.concatenate([np.frombuffer(t.encode(), np.uint8) + 2, [eod]]) for t in LINES]
    )


def test_text_shards_train_with_no_index_step_and_the_second_start_does_not_recount(
    tmp_path, counts
):
    shards = _text_shards(tmp_path / "shards")
    first = _tokens(_config(shards))
    assert len(counts) == 2
    assert (shards / "index.json").exists() and (shards / "lengths.npy").exists()
    second = _tokens(_config(shards))
    assert len(counts) == 2  # read from the index written beside the shards
    np.testing.assert_array_equal(first, second)
    assert first.tolist() == _expected_tokens().tolist()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_a_read_only_directory_keeps_its_counts_in_the_cache(tmp_path, counts, monkeypatch):
    shards = _text_shards(tmp_path / "shards")
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))
    shards.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        first = _tokens(_config(shards))
        assert len(counts) == 2 and not (shards / "index.json").exists()
        second = _tokens(_config(shards))
        assert len(counts) == 2  # read back from the lengths cache
    finally:
        shards.chmod(stat.S_IRWXU)
    np.testing.assert_array_equal(first, second)


def test_an_unwritable_directory_keeps_its_counts_in_the_cache(tmp_path, counts, monkeypatch):
    """As above, with the directory reported unwritable (tests may run as root)."""
    shards = _text_shards(tmp_path / "shards")
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))
    real_access = os.access
    monkeypatch.setattr(
        os,
        "access",
        lambda path, mode: False if str(path) == str(shards) else real_access(path, mode),
    )
    first = _tokens(_config(shards))
    assert len(counts) == 2 and not (shards / "index.json").exists()
    assert list((tmp_path / "cache" / "lengths").glob("*.npy"))
    second = _tokens(_config(shards))
    assert len(counts) == 2
    np.testing.assert_array_equal(first, second)


def test_token_shards_made_elsewhere_are_counted_too(tmp_path, counts):
    shards = tmp_path / "tokens"
    shards.mkdir()
    docs = [np.arange(2, 2 + n, dtype=np.int32) for n in range(1, 80)]
    write_array_record(shards / "part-0.array_record", docs)
    got = _tokens(_config(shards, "tokens"))
    assert len(counts) == 1
    assert got.tolist() == np.concatenate([np.append(d, 1) for d in docs]).tolist()


def test_the_reference_factory_counts_text_shards_once(tmp_path, counts):
    shards = _text_shards(tmp_path / "shards")
    source = xd.sources.ArrayRecordSource(str(shards / "*.array_record"), "text")
    iterator = xd.make_grain_llm_iterator(
        None, None, xd.create_mesh(), source, 4, 32, False, 0, worker_count=0, num_epochs=1
    )
    iterator.close()
    assert len(counts) == 2 and (shards / "index.json").exists()


def test_a_bad_record_names_the_shard_and_record(tmp_path):
    shards = tmp_path / "shards"
    shards.mkdir()
    write_array_record(shards / "part-0.array_record", [b"fine", b"\xff\xfe not utf-8"])
    with pytest.raises(xd.DataReadError) as caught:
        xd.iterators_from_config(_config(shards), xd.create_mesh())
    message = str(caught.value)
    assert "data.train.web" in message and "part-0.array_record" in message
    assert not (shards / "index.json").exists()
