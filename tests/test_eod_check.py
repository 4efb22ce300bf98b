"""`data.eod_token_id` is settled against the sources' tokenizers and vocabularies."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import xlstm_data as xd
from tests.test_tokenizers import write_byte_bpe
from xlstm_data.config.end_of_document import resolve_eod_token_id
from xlstm_data.errors import DataConfigError
from xlstm_data.from_config import iterators_from_config
from xlstm_data.sources import InMemorySource, SyntheticSource, TextFileSource
from xlstm_data.sources.tokenizers import HFTokenizer

TEXT = ["the quick brown fox", "jumps over the lazy dog", "pack my box", "sphinx of quartz"] * 4


@pytest.fixture(scope="module")
def mesh():
    return xd.create_mesh()


@pytest.fixture
def bpe(tmp_path: Path) -> Path:
    return write_byte_bpe(tmp_path / "bpe.json")


@pytest.fixture
def text_file(tmp_path: Path) -> Path:
    path = tmp_path / "docs.txt"
    path.write_text("\n".join(TEXT) + "\n")
    return path


def _config(train: dict, **data) -> dict:
    return {
        "train": train,
        "global_batch_size": 4,
        "max_target_length": 16,
        "packing": False,
        "shuffle": False,
        **data,
    }


def test_unset_uses_the_tokenizers_own_id_in_the_batches(mesh, bpe, text_file):
    eod = HFTokenizer(bpe).eod_id
    assert eod > 258  # not the byte tokenizer's 1
    config = _config({"web": {"kind": "text", "path": str(text_file), "tokenizer": str(bpe)}})
    train, _ = iterators_from_config(config, mesh)
    batch = next(train)
    train.close()
    targets = np.asarray(batch.targets)
    segmentation = np.asarray(batch.targets_segmentation)
    # Every unpadded row ends its document with the tokenizer's end-of-document id.
    last = [row[seg != 0][-1] for row, seg in zip(targets, segmentation, strict=True)]
    assert last == [eod] * len(last)
    assert not np.any(targets[segmentation != 0] == 1)


def test_configured_id_disagreeing_with_the_tokenizer_is_refused(mesh, bpe, text_file):
    eod = HFTokenizer(bpe).eod_id
    config = _config(
        {"web": {"kind": "text", "path": str(text_file), "tokenizer": str(bpe)}},
        eod_token_id=1,
    )
    with pytest.raises(DataConfigError) as error:
        iterators_from_config(config, mesh)
    message = str(error.value)
    assert "data.eod_token_id=1" in message and "data.train.web" in message
    assert f"end-of-document id is {eod}" in message and "bpe.json" in message
    # The matching id is accepted.
    config["eod_token_id"] = eod
    train, _ = iterators_from_config(config, mesh)
    train.close()


def test_configured_id_outside_a_vocabulary_is_refused(mesh, text_file):
    config = _config({"web": {"kind": "text", "path": str(text_file)}}, eod_token_id=300)
    with pytest.raises(
        DataConfigError,
        match=r"data.eod_token_id=300 is id 300, outside the vocabulary of data.train.web "
        r"\(vocab_size=258, valid ids 0..257\)",
    ):
        iterators_from_config(config, mesh)


def test_eval_sources_are_checked_too(mesh, bpe, text_file):
    config = _config(
        {"synthetic": {"kind": "synthetic", "num_documents": 50}},
        eval={"held_out": {"kind": "text", "path": str(text_file), "tokenizer": str(bpe)}},
    )
    # Synthetic data has no tokenizer; the eval set's decides (and its vocab holds it).
    eod = HFTokenizer(bpe).eod_id
    with pytest.raises(DataConfigError, match=f"id {eod}, outside the vocabulary of data.train"):
        iterators_from_config(config, mesh)
    config["train"]["synthetic"]["vocab_size"] = HFTokenizer(bpe).vocab_size
    train, evals = iterators_from_config(config, mesh)
    row = np.asarray(next(evals["held_out"]).targets)[0]
    assert eod in row.tolist()
    train.close()
    evals["held_out"].close()


def test_tokenizers_disagreeing_with_the_key_unset_are_named(mesh, bpe, text_file):
    config = _config(
        {
            "bytes": {"kind": "text", "path": str(text_file)},
            "bpe": {"kind": "text", "path": str(text_file), "tokenizer": str(bpe)},
        }
    )
    with pytest.raises(DataConfigError) as error:
        iterators_from_config(config, mesh)
    message = str(error.value)
    eod = HFTokenizer(bpe).eod_id
    assert "data.eod_token_id is unset" in message
    assert "data.train.bytes: 1" in message and f"data.train.bpe: {eod}" in message


def test_sources_without_a_tokenizer_follow_the_byte_convention(text_file, bpe):
    synthetic = SyntheticSource(10, vocab_size=100)
    arrays = InMemorySource([[5, 6], [7]])
    assert synthetic.tokenizer is None and arrays.tokenizer is None
    assert resolve_eod_token_id(None, {"data.train.s": synthetic, "data.train.a": arrays}) == 1
    # Any id inside their vocabularies may be configured.
    assert resolve_eod_token_id(42, {"data.train.s": synthetic}) == 42
    # ... but not one outside, nor the byte convention when the vocabulary lacks it.
    with pytest.raises(DataConfigError, match="vocab_size=100"):
        resolve_eod_token_id(100, {"data.train.s": synthetic})
    tiny = SyntheticSource(10, vocab_size=1, min_token_id=0)
    with pytest.raises(DataConfigError, match=r"unset: 1, as no dataset has a.*vocab_size=1"):
        resolve_eod_token_id(None, {"data.train.tiny": tiny})
    # Beside a tokenizer, that tokenizer decides.
    text = TextFileSource(str(text_file), tokenizer=str(bpe))
    both = {"data.train.s": SyntheticSource(10, vocab_size=400), "data.train.t": text}
    assert resolve_eod_token_id(None, both) == text.tokenizer.eod_id


def test_factories_resolve_the_id_against_the_dataset_the_same_way(mesh, text_file):
    source = TextFileSource(str(text_file))  # byte tokenizer: end of document is 1
    kwargs = dict(
        global_mesh=mesh,
        dataset=source,
        global_batch_size=4 * xd.data_parallel_size(mesh),
        max_target_length=16,
        shuffle=False,
        data_shuffle_seed=0,
        worker_count=0,
    )
    with pytest.raises(DataConfigError, match=r"eod_token_id=0 disagrees .* id is 1"):
        xd.make_grain_llm_iterator(None, None, eod_token_id=0, **kwargs)
    iterator = xd.make_grain_llm_iterator(None, None, **kwargs)  # unset: the tokenizer's 1
    batch = next(iterator)
    iterator.close()
    targets = np.asarray(batch.targets)
    segments = np.asarray(batch.targets_segmentation)
    # The last target of every document (shift left) is the end-of-document id 1.
    ends = (segments != 0) & (np.roll(segments, -1, axis=1) != segments)
    assert set(targets[ends].tolist()) == {1}
    # A dataset without a tokenizer keeps the reference API's default, 0.
    plain = xd.make_grain_llm_iterator(None, None, **{**kwargs, "dataset": [[5, 6, 7]] * 80})
    plain.close()
