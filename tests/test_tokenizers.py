"""Tests for xlstm_data.sources.tokenizers: byte tokenizer, HF wrapper, get_tokenizer."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from xlstm_data.errors import DataConfigError
from xlstm_data.sources.tokenizers import ByteTokenizer, HFTokenizer, Tokenizer, get_tokenizer


@pytest.fixture
def hf() -> Any:
    """The HuggingFace `tokenizers` module (installed by the `[test]` extra, never skipped)."""
    import tokenizers

    return tokenizers


@pytest.fixture
def hf_json(hf: Any, tmp_path: Path) -> Path:
    """A tiny word-level tokenizer file, built locally (no download)."""
    vocab = {"[UNK]": 0, "<pad>": 1, "<|endoftext|>": 2, "hello": 3, "world": 4, "foo": 5}
    tok = hf.Tokenizer(hf.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = hf.pre_tokenizers.Whitespace()
    tok.add_special_tokens(["[UNK]", "<pad>", "<|endoftext|>"])
    path = tmp_path / "tok.json"
    tok.save(str(path))
    return path


BPE_TEXT = [
    "the quick brown fox jumps over the lazy dog",
    "pack my box with five dozen liquor jugs",
    "sphinx of black quartz, judge my vow",
] * 20


def write_byte_bpe(path: Path, vocab_size: int = 400) -> Path:
    """Writes a byte-level BPE tokenizer trained offline on `BPE_TEXT`.

    Ids: 0 is "<pad>", the 256 byte symbols and merges follow (so common words
    get ids above 258), and "<|endoftext|>" is added last as a special token.
    """
    import tokenizers
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(BPE_TEXT, trainer)
    tok.add_special_tokens(["<|endoftext|>"])
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return path


# ---------------------------------------------------------------- ByteTokenizer


@pytest.mark.parametrize("text", ["", "hello world", "grüße, 東京 🚀\n\ttab", "\x00\xff"])
def test_byte_round_trip(text: str) -> None:
    tok = ByteTokenizer()
    ids = tok.encode(text)
    assert ids.dtype == np.int32 and ids.ndim == 1
    assert len(ids) == len(text.encode("utf-8"))
    assert tok.decode(ids) == text
    assert tok.decode(ids.tolist()) == text


def test_byte_ids_range_and_specials() -> None:
    tok = ByteTokenizer()
    assert (tok.vocab_size, tok.eod_id, tok.pad_id) == (258, 1, 0)
    ids = tok.encode(bytes(range(256)).decode("latin-1"))
    assert ids.min() >= 2 and ids.max() < tok.vocab_size
    assert tok.encode("A").tolist() == [ord("A") + 2]
    # Pad and eod are skipped on decode; broken UTF-8 becomes U+FFFD.
    assert tok.decode([0, 1, ord("a") + 2, 1, 0]) == "a"
    assert tok.decode([0xFF + 2]) == "\ufffd"


def test_byte_errors() -> None:
    tok = ByteTokenizer()
    with pytest.raises(DataConfigError, match="258"):
        tok.decode([258])
    with pytest.raises(DataConfigError, match="-1"):
        tok.decode([-1])
    with pytest.raises(DataConfigError, match="bytes"):
        tok.encode(b"abc")  # type: ignore[arg-type]


def test_byte_pickle_and_protocol() -> None:
    tok = ByteTokenizer()
    clone = pickle.loads(pickle.dumps(tok))
    assert clone == tok
    assert clone.decode(clone.encode("ünï")) == "ünï"
    assert isinstance(tok, Tokenizer)
    with pytest.raises(AttributeError):
        tok.vocab_size = 5  # type: ignore[misc]


# ---------------------------------------------------------------- HFTokenizer


def test_hf_encode_decode(hf_json: Path) -> None:
    tok = HFTokenizer(hf_json)
    assert isinstance(tok, Tokenizer)
    assert tok.vocab_size == 6
    assert (tok.eod_id, tok.pad_id) == (2, 1)  # Auto-detected <|endoftext|> and <pad>.
    ids = tok.encode("hello world foo")
    assert ids.dtype == np.int32 and ids.tolist() == [3, 4, 5]
    assert tok.encode("hello nope").tolist() == [3, 0]
    assert tok.decode(ids) == "hello world foo"
    assert tok.decode([2, 3, 1]) == "hello"  # Special tokens skipped.


def test_hf_explicit_tokens(hf_json: Path) -> None:
    tok = HFTokenizer(str(hf_json), eod_token="<pad>", pad_token="[UNK]")
    assert (tok.eod_id, tok.pad_id) == (1, 0)


def test_hf_unknown_token(hf_json: Path) -> None:
    with pytest.raises(DataConfigError, match=r"eod_token='</s>'.*not in the vocabulary"):
        HFTokenizer(hf_json, eod_token="</s>")
    with pytest.raises(DataConfigError, match=r"pad_token='\[PAD\]'"):
        HFTokenizer(hf_json, pad_token="[PAD]")


def test_hf_no_eod_candidate(hf: Any, tmp_path: Path) -> None:
    tok = hf.Tokenizer(hf.models.WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    path = tmp_path / "plain.json"
    tok.save(str(path))
    with pytest.raises(DataConfigError, match="eod_token=None"):
        HFTokenizer(path)
    only_eod = HFTokenizer(path, eod_token="a")
    assert only_eod.pad_id == only_eod.eod_id == 1  # pad falls back to eod.


def test_hf_missing_and_invalid_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.json"
    with pytest.raises(DataConfigError, match="nope.json"):
        HFTokenizer(missing)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(DataConfigError, match="bad.json"):
        HFTokenizer(bad)


def test_hf_pickle(hf_json: Path) -> None:
    tok = HFTokenizer(hf_json, eod_token="<|endoftext|>")
    data = pickle.dumps(tok)
    assert len(data) < 1000  # Only the path and options travel.
    clone = pickle.loads(data)
    assert (clone.vocab_size, clone.eod_id, clone.pad_id) == (6, 2, 1)
    assert clone.encode("foo hello").tolist() == tok.encode("foo hello").tolist()
    assert "tok.json" in repr(clone)


def test_hf_missing_dependency(monkeypatch: pytest.MonkeyPatch, hf_json: Path) -> None:
    import importlib

    real = importlib.import_module

    def fake_import(name: str, *args: object) -> object:
        if name == "tokenizers":
            raise ImportError("no tokenizers")
        return real(name, *args)

    monkeypatch.setattr(importlib, "import_module", fake_import)
    with pytest.raises(DataConfigError, match=r"pip install xlstm-data\[hf\]"):
        HFTokenizer(hf_json)


def test_hf_spelled_special_token_is_text(tmp_path: Path) -> None:
    tok = HFTokenizer(write_byte_bpe(tmp_path / "bpe.json"))
    assert tok.eod_token == "<|endoftext|>" and tok.eod_id == tok.vocab_size - 1
    text = "a web page quoting <|endoftext|> and <pad> mid-sentence"
    for clone in (tok, pickle.loads(pickle.dumps(tok))):
        ids = clone.encode(text)
        assert tok.eod_id not in ids.tolist() and tok.pad_id not in ids.tolist()
        assert clone.decode(ids) == text  # every character survives as text
    # The control tokens themselves still exist and decode as nothing.
    assert tok.decode([*tok.encode("the dog").tolist(), tok.eod_id]) == "the dog"


def test_hf_spelled_special_token_with_word_level(hf_json: Path) -> None:
    tok = HFTokenizer(hf_json)
    assert tok.eod_id == 2
    ids = tok.encode("hello <|endoftext|> world").tolist()
    assert 2 not in ids and ids[0] == 3 and ids[-1] == 4


# ---------------------------------------------------------------- get_tokenizer


def test_get_tokenizer(hf_json: Path) -> None:
    assert isinstance(get_tokenizer(None), ByteTokenizer)
    assert isinstance(get_tokenizer("byte"), ByteTokenizer)
    assert isinstance(get_tokenizer(str(hf_json)), HFTokenizer)
    assert isinstance(get_tokenizer(hf_json), HFTokenizer)
    tok = ByteTokenizer()
    assert get_tokenizer(tok) is tok


@pytest.mark.parametrize("spec", ["gpt2", "tokenizer.model", 3, object()])
def test_get_tokenizer_errors(spec: object) -> None:
    with pytest.raises(DataConfigError, match=r"'byte'.*\.json"):
        get_tokenizer(spec)  # type: ignore[arg-type]


def test_get_tokenizer_missing_json(tmp_path: Path) -> None:
    with pytest.raises(DataConfigError, match="missing.json"):
        get_tokenizer(str(tmp_path / "missing.json"))
