"""The tokenizer and vocabulary `prepare` records are honoured by sources and `inspect`."""

from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.test_tokenizers import write_byte_bpe
from xlstm_data.cli.main import main as cli_main
from xlstm_data.errors import DataConfigError, DataReadError
from xlstm_data.prepare.corpus import prepare_corpus as prepare_any_layout
from xlstm_data.sources import ArrayRecordSource
from xlstm_data.sources.tokenizers import HFTokenizer

# These tests read the ArrayRecord layout; tests/test_flat_layout.py covers the flat default.
prepare_corpus = functools.partial(prepare_any_layout, layout="array_record")

TEXT = ["the quick brown fox jumps", "over the lazy dog", "pack my box with five dozen"]


@pytest.fixture
def bpe(tmp_path: Path) -> Path:
    return write_byte_bpe(tmp_path / "tok" / "bpe.json")


@pytest.fixture
def hf_corpus(tmp_path: Path, bpe: Path) -> Path:
    """Text prepared with the BPE tokenizer: ids above 258, eod id 399."""
    # Four times over: a global batch of 4 rows must not exceed the corpus.
    (tmp_path / "raw.txt").write_text("\n".join(TEXT * 4) + "\n")
    out = tmp_path / "hf_corpus"
    prepare_corpus([str(tmp_path / "raw.txt")], str(out), tokenizer=str(bpe))
    return out


@pytest.fixture
def token_corpus(tmp_path: Path) -> Path:
    """Token arrays with ids up to 339, prepared with vocab_size=400."""
    rows = np.arange(200, 340, dtype=np.int32).reshape(10, 14)
    np.save(tmp_path / "ids.npy", rows)
    out = tmp_path / "token_corpus"
    prepare_corpus([str(tmp_path / "ids.npy")], str(out), vocab_size=400)
    return out


def _write_config(path: Path, corpus: Path, **options) -> Path:
    spec = {"kind": "array_record", "path": str(corpus / "*.array_record"), **options}
    path.write_text(
        "import ml_collections\n\n"
        "def get_config():\n"
        "    config = ml_collections.ConfigDict()\n"
        f"    config.data = dict(train={{'corpus': {spec!r}}}, global_batch_size=4,\n"
        "                       max_target_length=16, packing=False, shuffle=False)\n"
        "    return config\n"
    )
    return path


def _inspect(config: Path, tmp_path: Path) -> list[str]:
    return ["inspect", f"--config={config}", f"--png={tmp_path / 'p.png'}", "--steps=2"]


def test_index_records_the_tokenizer(hf_corpus: Path, bpe: Path) -> None:
    index = json.loads((hf_corpus / "index.json").read_text())
    tokenizer = HFTokenizer(bpe)
    assert index["tokenizer"] == str(bpe)
    assert index["vocab_size"] == index["tokenizer_vocab_size"] == tokenizer.vocab_size
    assert index["eod_id"] == tokenizer.eod_id


def test_array_record_source_takes_the_index_tokenizer_and_vocab(
    hf_corpus: Path, bpe: Path
) -> None:
    pattern = str(hf_corpus / "*.array_record")
    source = ArrayRecordSource(pattern)
    tokenizer = HFTokenizer(bpe)
    assert source.vocab_size == tokenizer.vocab_size
    assert isinstance(source.tokenizer, HFTokenizer) and source.tokenizer.path == str(bpe)
    documents = [source[i]["tokens"] for i in range(len(source))]
    assert max(int(d.max()) for d in documents) > 258
    assert [tokenizer.decode(d) for d in documents] == TEXT * 4
    # The same tokenizer may be named; another one is refused, naming both.
    assert ArrayRecordSource(pattern, tokenizer=str(bpe)).vocab_size == tokenizer.vocab_size
    with pytest.raises(DataConfigError) as error:
        ArrayRecordSource(pattern, tokenizer="byte")
    message = str(error.value)
    assert "tokenizer='byte' (vocab_size 258, eod_id 1)" in message
    assert str(bpe) in message and "index.json" in message


def test_a_moved_tokenizer_must_be_named(hf_corpus: Path, bpe: Path, tmp_path: Path) -> None:
    copy = tmp_path / "elsewhere.json"
    shutil.move(bpe, copy)
    pattern = str(hf_corpus / "*.array_record")
    with pytest.raises(DataConfigError, match=r"bpe\.json.*not a file on this machine"):
        ArrayRecordSource(pattern)
    assert ArrayRecordSource(pattern, tokenizer=str(copy)).tokenizer.path == str(copy)


def test_index_vocab_bounds_token_arrays(token_corpus: Path) -> None:
    pattern = str(token_corpus / "*.array_record")
    source = ArrayRecordSource(pattern)
    # Ids beyond the byte tokenizer's: not its tokens, so no end-of-document id is forced.
    assert source.vocab_size == 400 and source.tokenizer is None
    assert source[9]["tokens"].tolist() == list(range(326, 340))
    with pytest.raises(DataConfigError, match=r"258 ids, fewer than the shards' vocab_size 400"):
        ArrayRecordSource(pattern, tokenizer="byte")
    # An index whose vocabulary is smaller than the ids: the read names the record.
    index = json.loads((token_corpus / "index.json").read_text())
    index["vocab_size"] = 300
    (token_corpus / "index.json").write_text(json.dumps(index))
    source = ArrayRecordSource(pattern)
    assert source.vocab_size == 300
    with pytest.raises(DataReadError, match=r"record 7 of file .*shard-00000.*id 300.*=300"):
        source[7]


def test_inspect_decodes_a_prepared_hf_corpus(
    hf_corpus: Path, bpe: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    eod = HFTokenizer(bpe).eod_id
    for options in ({"tokenizer": str(bpe)}, {"tokenizer": None}):
        config = _write_config(tmp_path / "hf.py", hf_corpus, **options)
        assert cli_main(_inspect(config, tmp_path)) == 0, capsys.readouterr().err
        out = capsys.readouterr().out
        assert f"vocab {HFTokenizer(bpe).vocab_size}" in out
        assert f"end-of-document id: {eod}" in out
        assert "the quick brown fox jumps" in out  # decoded with the corpus's tokenizer


def test_inspect_shows_ids_the_tokenizer_cannot_decode(
    token_corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _write_config(tmp_path / "ids.py", token_corpus)
    assert cli_main(_inspect(config, tmp_path)) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "vocab 400" in out and "end-of-document id: 1" in out
    assert "[ids 2" in out or "[ids 3" in out


def test_inspect_names_the_record_beyond_the_index_vocab(
    token_corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    index = json.loads((token_corpus / "index.json").read_text())
    index["vocab_size"] = 300
    (token_corpus / "index.json").write_text(json.dumps(index))
    config = _write_config(tmp_path / "ids.py", token_corpus)
    assert cli_main(_inspect(config, tmp_path)) == 2
    error = capsys.readouterr().err
    assert "shard-00000-of-00001.array_record" in error and "vocab_size=300" in error
