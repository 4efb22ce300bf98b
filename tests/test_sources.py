"""Tests for xlstm_data.sources: random access, error messages and pickling."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import grain
import numpy as np
import pytest

from xlstm_data.errors import DataConfigError, DataReadError
from xlstm_data.sources import (
    ArrayRecordSource,
    InMemorySource,
    SyntheticSource,
    TextFileSource,
    TokenSource,
    as_token_source,
    write_array_record,
)
from xlstm_data.sources.tokenizers import ByteTokenizer


def _tokens(source: Any) -> list[list[int]]:
    """All documents of a source as lists, checking the document contract."""
    out = []
    for i in range(len(source)):
        doc = source[i]
        assert set(doc) == {"tokens"}
        tokens = doc["tokens"]
        assert isinstance(tokens, np.ndarray) and tokens.dtype == np.int32 and tokens.ndim == 1
        out.append(tokens.tolist())
    return out


def _assert_pickles(source: Any) -> None:
    """The source survives pickling and yields identical documents after."""
    before = _tokens(source)
    clone = pickle.loads(pickle.dumps(source))
    assert len(clone) == len(source)
    assert _tokens(clone) == before
    assert repr(clone) == repr(source)


# ---------------------------------------------------------------- ArrayRecord


@pytest.fixture
def token_files(tmp_path: Path) -> tuple[str, list[list[int]]]:
    """Two ArrayRecord token files (3 + 2 records); returns (glob, documents)."""
    docs = [[5, 6, 7], [8], [], [9, 10], [11, 12, 13, 14]]
    assert write_array_record(tmp_path / "tok-00000.arrayrecord", [np.array(d) for d in docs[:3]])
    assert write_array_record(tmp_path / "tok-00001.arrayrecord", docs[3:]) == 2
    return str(tmp_path / "tok-*.arrayrecord"), docs


def test_array_record_tokens_across_files(token_files: tuple[str, list[list[int]]]) -> None:
    pattern, docs = token_files
    src = ArrayRecordSource(pattern)
    assert isinstance(src, TokenSource)
    assert len(src) == 5 and src.vocab_size is None
    assert _tokens(src) == docs
    # Global indices map onto (file, index in file) across the file boundary.
    assert src.locate(2)[0].endswith("tok-00000.arrayrecord") and src.locate(2)[1] == 2
    assert src.locate(3)[0].endswith("tok-00001.arrayrecord") and src.locate(3)[1] == 0
    assert src[-1]["tokens"].tolist() == docs[-1]
    with pytest.raises(IndexError, match="0..4"):
        src[5]
    assert "records=5" in repr(src) and "'tokens'" in repr(src)
    _assert_pickles(src)


def test_array_record_list_of_paths_sorted(
    token_files: tuple[str, list[list[int]]], tmp_path: Path
) -> None:
    _, docs = token_files
    files = [str(tmp_path / "tok-00001.arrayrecord"), str(tmp_path / "tok-0000[0].arrayrecord")]
    src = ArrayRecordSource(files, vocab_size=15)
    assert _tokens(src) == docs
    assert src.files == sorted(src.files)


def test_array_record_text_round_trip(tmp_path: Path) -> None:
    texts = ["hello", "grüße 東京", "", "x" * 50]
    write_array_record(tmp_path / "t-0.arrayrecord", texts[:1])
    write_array_record(tmp_path / "t-1.arrayrecord", texts[1:])
    src = ArrayRecordSource(str(tmp_path / "t-*.arrayrecord"), record_format="text")
    assert src.vocab_size == 258
    tok = ByteTokenizer()
    assert [tok.decode(d) for d in _tokens(src)] == texts
    _assert_pickles(src)


def test_array_record_no_match(tmp_path: Path) -> None:
    pattern = str(tmp_path / "missing-*.arrayrecord")
    with pytest.raises(DataConfigError, match="missing-"):
        ArrayRecordSource(pattern)
    with pytest.raises(DataConfigError, match="empty"):
        ArrayRecordSource([])


def test_array_record_bad_arguments(token_files: tuple[str, list[list[int]]]) -> None:
    pattern, _ = token_files
    with pytest.raises(DataConfigError, match=r"record_format='json'.*'tokens', 'text'"):
        ArrayRecordSource(pattern, record_format="json")
    with pytest.raises(DataConfigError, match="vocab_size=0"):
        ArrayRecordSource(pattern, vocab_size=0)
    with pytest.raises(DataConfigError, match="tokenizer="):
        ArrayRecordSource(pattern, tokenizer="gpt2")


def test_array_record_empty_and_not_array_record(tmp_path: Path) -> None:
    write_array_record(tmp_path / "empty.arrayrecord", [])
    with pytest.raises(DataConfigError, match="no records"):
        ArrayRecordSource(str(tmp_path / "empty.arrayrecord"))
    (tmp_path / "junk.arrayrecord").write_bytes(b"not an array record file at all")
    with pytest.raises(DataConfigError, match="junk.arrayrecord"):
        ArrayRecordSource(str(tmp_path / "junk.arrayrecord"))


def test_array_record_bad_token_bytes(tmp_path: Path) -> None:
    # Bad first record: reported at construction, before any iteration.
    write_array_record(tmp_path / "first.arrayrecord", [b"12345", np.arange(2)])
    with pytest.raises(DataReadError, match=r"record 0 of file .*first\.arrayrecord.*int32"):
        ArrayRecordSource(str(tmp_path / "first.arrayrecord"))
    # Bad later record: reported when read, naming the file and its local index.
    write_array_record(tmp_path / "a.arrayrecord", [np.arange(2)])
    write_array_record(tmp_path / "b.arrayrecord", [np.arange(3), b"12345"])
    src = ArrayRecordSource([str(tmp_path / "a.arrayrecord"), str(tmp_path / "b.arrayrecord")])
    assert src[1]["tokens"].tolist() == [0, 1, 2]
    with pytest.raises(DataReadError, match=r"record 1 of file .*b\.arrayrecord.*5 bytes"):
        src[2]


def test_array_record_invalid_utf8(tmp_path: Path) -> None:
    write_array_record(tmp_path / "t.arrayrecord", ["fine", b"\xff\xfe bad"])
    src = ArrayRecordSource(str(tmp_path / "t.arrayrecord"), record_format="text")
    with pytest.raises(DataReadError, match=r"record 1 of file .*t\.arrayrecord.*UTF-8"):
        src[1]
    write_array_record(tmp_path / "first.arrayrecord", [b"\xc3("])
    with pytest.raises(DataReadError, match=r"record 0 of file .*first\.arrayrecord"):
        ArrayRecordSource(str(tmp_path / "first.arrayrecord"), record_format="text")


def test_array_record_vocab_check(tmp_path: Path) -> None:
    write_array_record(tmp_path / "v.arrayrecord", [[1, 2], [3, 300, 4], [-7]])
    path = str(tmp_path / "v.arrayrecord")
    src = ArrayRecordSource(path, tokenizer=ByteTokenizer())
    assert src.vocab_size == 258
    assert src[0]["tokens"].tolist() == [1, 2]
    with pytest.raises(DataReadError, match=r"record 1 of file .*id 300.*vocab_size=258"):
        src[1]
    with pytest.raises(DataReadError, match="id -7"):
        src[2]  # Negative ids are rejected even without a vocab size.
    unchecked = ArrayRecordSource(path)
    assert unchecked[1]["tokens"].tolist() == [3, 300, 4]
    with pytest.raises(DataReadError, match="id -7"):
        unchecked[2]
    with pytest.raises(DataReadError, match="id 3 .*vocab_size=3"):
        ArrayRecordSource(path, vocab_size=3)[1]


def test_array_record_read_many(token_files: tuple[str, list[list[int]]]) -> None:
    """One call reads any mix of files, repeats and negative indices, as single reads do."""
    pattern, docs = token_files
    src = ArrayRecordSource(pattern)
    order = [4, 0, 3, 0, -1, 2, 1]
    got = src.read_many(order)
    assert [t.tolist() for t in got] == [docs[i] for i in order]
    assert all(t.dtype == np.int32 and t.ndim == 1 and t.flags.writeable for t in got)
    got[0][:] = 0  # each array is the caller's: changing one leaves the others
    assert [t.tolist() for t in got[1:]] == [docs[i] for i in order[1:]]
    assert src.read_many(np.array([], dtype=np.int64)) == []
    with pytest.raises(IndexError, match="index 5 is out of range.*0..4"):
        src.read_many([1, 5])
    clone = pickle.loads(pickle.dumps(src))  # batch readers are reopened after pickling
    assert [t.tolist() for t in clone.read_many([3, 1])] == [docs[3], docs[1]]


def test_array_record_read_many_names_bad_records(tmp_path: Path) -> None:
    """A batch with a bad record fails naming that record's file and index, as a single read."""
    write_array_record(tmp_path / "a.arrayrecord", [[1, 2], [3]])
    write_array_record(tmp_path / "b.arrayrecord", [[4], [3, 300, 4], [-7], b"12345"])
    src = ArrayRecordSource(str(tmp_path / "*.arrayrecord"), tokenizer=ByteTokenizer())
    assert [t.tolist() for t in src.read_many([0, 2])] == [[1, 2], [4]]
    with pytest.raises(DataReadError, match=r"record 1 of file .*b\.arrayrecord.*id 300"):
        src.read_many([0, 3, 1])
    with pytest.raises(DataReadError, match=r"record 2 of file .*b\.arrayrecord.*id -7"):
        src.read_many([4, 0])
    with pytest.raises(DataReadError, match=r"record 3 of file .*b\.arrayrecord.*5 bytes"):
        src.read_many([0, 5])
    text = tmp_path / "t.arrayrecord"
    write_array_record(text, ["ab", "c", b"\xff"])
    src = ArrayRecordSource(str(text), record_format="text")
    assert [t.tolist() for t in src.read_many([1, 0])] == [
        src[1]["tokens"].tolist(),
        src[0]["tokens"].tolist(),
    ]
    with pytest.raises(DataReadError, match=r"record 2 of file .*t\.arrayrecord.*UTF-8"):
        src.read_many([0, 2])


def test_read_many_default() -> None:
    """Sources without a batched read answer `read_many` one document at a time."""
    src = InMemorySource([[1, 2], [3], [4, 5, 6]])
    assert [t.tolist() for t in src.read_many([2, 0, -2])] == [[4, 5, 6], [1, 2], [3]]
    with pytest.raises(IndexError):
        src.read_many([3])


def test_write_array_record_errors(tmp_path: Path) -> None:
    out = tmp_path / "sub" / "w.arrayrecord"
    with pytest.raises(DataConfigError, match=r"record 1 .*float"):
        write_array_record(out, [np.arange(3), np.ones(2)])
    assert not out.exists()  # Partial file removed.
    with pytest.raises(DataConfigError, match="record 0 has type int"):
        write_array_record(out, [3])
    with pytest.raises(DataConfigError, match="int32 range"):
        write_array_record(out, [np.array([2**40])])
    assert write_array_record(out, (np.arange(i) for i in range(4))) == 4
    assert _tokens(ArrayRecordSource(str(out)))[3] == [0, 1, 2]


def test_array_record_with_grain(token_files: tuple[str, list[list[int]]]) -> None:
    pattern, docs = token_files
    ds = grain.MapDataset.source(ArrayRecordSource(pattern)).shuffle(seed=0)
    got = sorted(d["tokens"].tolist() for d in ds)
    assert got == sorted(docs)


# ---------------------------------------------------------------- Text files


def test_text_lines(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_bytes(b"first line\n\n   \nsecond \xc3\xbc\r\nthird")
    (tmp_path / "b.txt").write_text("fourth\n")
    src = TextFileSource(str(tmp_path / "*.txt"))
    tok = ByteTokenizer()
    assert [tok.decode(d) for d in _tokens(src)] == ["first line", "second ü", "third", "fourth"]
    assert src.vocab_size == 258
    assert "documents=4" in repr(src)
    _assert_pickles(src)
    # Random access in any order gives the same documents.
    assert tok.decode(src[3]["tokens"]) == "fourth"
    assert tok.decode(src[1]["tokens"]) == "second ü"


def test_text_file_unit(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("doc one\nstill one\n")
    (tmp_path / "b.txt").write_text("")
    (tmp_path / "c.txt").write_text("doc two")
    src = TextFileSource([str(tmp_path / "c.txt"), str(tmp_path / "*.txt")], unit="file")
    tok = ByteTokenizer()
    assert [tok.decode(d) for d in _tokens(src)] == ["doc one\nstill one\n", "doc two"]
    _assert_pickles(src)


def test_text_invalid_utf8_names_line(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_bytes(b"ok\nbad \xff\n")
    src = TextFileSource(str(tmp_path / "a.txt"))
    with pytest.raises(DataReadError, match=r"line 2 of file .*a\.txt.*UTF-8"):
        src[1]


def test_jsonl(tmp_path: Path) -> None:
    lines = [json.dumps({"text": "alpha", "id": 1}), "", json.dumps({"text": "beta"})]
    (tmp_path / "d.jsonl").write_text("\n".join(lines) + "\n")
    src = TextFileSource(str(tmp_path / "d.jsonl"))
    tok = ByteTokenizer()
    assert [tok.decode(d) for d in _tokens(src)] == ["alpha", "beta"]
    _assert_pickles(src)
    (tmp_path / "e.json_lines").write_text(json.dumps({"body": "gamma"}) + "\n")
    custom = TextFileSource(str(tmp_path / "e.json_lines"), jsonl_field="body")
    assert tok.decode(custom[0]["tokens"]) == "gamma"


def test_json_file_is_not_read_as_text(tmp_path: Path) -> None:
    rows = [{"text": "first {doc}"}, {"text": "second"}]
    (tmp_path / "d.json").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (tmp_path / "e.txt").write_text("plain\n")
    with pytest.raises(DataConfigError) as error:
        TextFileSource(str(tmp_path / "*"))
    message = str(error.value)
    assert "d.json" in message and "kind='jsonl'" in message and "jsonl_field" in message
    decode = ByteTokenizer().decode
    lines = TextFileSource(str(tmp_path / "d.json"), jsonl_field="text")
    assert [decode(d) for d in _tokens(lines)] == ["first {doc}", "second"]
    raw = TextFileSource(str(tmp_path / "d.json"), json_as_text=True)
    assert [decode(d) for d in _tokens(raw)] == [json.dumps(r) for r in rows]
    _assert_pickles(raw)


def test_jsonl_bad_lines(tmp_path: Path) -> None:
    rows = [
        json.dumps({"text": "ok"}),
        "{not json",
        json.dumps({"content": "x"}),
        json.dumps([1, 2]),
        json.dumps({"text": 5}),
    ]
    (tmp_path / "bad.jsonl").write_text("\n".join(rows))
    src = TextFileSource(str(tmp_path / "bad.jsonl"))
    assert len(src) == 5
    with pytest.raises(DataReadError, match=r"line 2 of file .*bad\.jsonl.*not valid JSON"):
        src[1]
    with pytest.raises(DataReadError, match=r"line 3 of file .*no 'text' key.*content"):
        src[2]
    with pytest.raises(DataReadError, match=r"line 4 .*JSON list"):
        src[3]
    with pytest.raises(DataReadError, match=r"line 5 .*'text' is a int"):
        src[4]


def test_text_errors(tmp_path: Path) -> None:
    with pytest.raises(DataConfigError, match=r"nothing-\*\.txt"):
        TextFileSource(str(tmp_path / "nothing-*.txt"))
    with pytest.raises(DataConfigError, match="directory"):
        TextFileSource(str(tmp_path))
    (tmp_path / "blank.txt").write_text("\n \n\n")
    with pytest.raises(DataConfigError, match="no documents"):
        TextFileSource(str(tmp_path / "blank.txt"))
    (tmp_path / "a.txt").write_text("x\n")
    with pytest.raises(DataConfigError, match=r"unit='page'.*'line', 'file'"):
        TextFileSource(str(tmp_path / "a.txt"), unit="page")
    (tmp_path / "d.jsonl").write_text('{"text": "x"}\n')
    with pytest.raises(DataConfigError, match=r"unit='file'.*d\.jsonl"):
        TextFileSource(str(tmp_path / "d.jsonl"), unit="file")
    with pytest.raises(DataConfigError, match="jsonl_field=''"):
        TextFileSource(str(tmp_path / "d.jsonl"), jsonl_field="")


# ---------------------------------------------------------------- In memory


@pytest.mark.parametrize(
    "data",
    [
        [{"tokens": [3, 4]}, {"tokens": np.array([5], np.int64)}],
        [np.array([3, 4], np.uint16), [5]],
        [(3, 4), (5,)],
        np.array([[3, 4], [5, 6]], np.int64),
    ],
    ids=["dicts", "arrays_and_lists", "tuples", "2d_array"],
)
def test_in_memory_token_kinds(data: Any) -> None:
    src = InMemorySource(data)
    got = _tokens(src)
    assert got[0] == [3, 4] and got[1][0] == 5
    _assert_pickles(src)


def test_in_memory_strings_and_copies() -> None:
    src = InMemorySource(["héllo", "", {"tokens": "via dict"}])
    tok = ByteTokenizer()
    assert [tok.decode(d) for d in _tokens(src)] == ["héllo", "", "via dict"]
    arr = np.array([[1, 2]], np.int32)
    doc = InMemorySource(arr)[0]["tokens"]
    doc[0] = 99
    assert arr[0, 0] == 1  # Reads return copies, never views of the user's data.
    objs = np.empty(2, dtype=object)
    objs[0], objs[1] = np.arange(3), np.arange(1)
    assert _tokens(InMemorySource(objs)) == [[0, 1, 2], [0]]


def test_in_memory_errors() -> None:
    with pytest.raises(DataConfigError, match="empty"):
        InMemorySource([])
    with pytest.raises(DataConfigError, match="document 0 has unsupported type int"):
        InMemorySource([1, 2, 3])
    with pytest.raises(DataConfigError, match="type str"):
        InMemorySource("abc")
    with pytest.raises(DataConfigError, match=r"shape \(3,\)"):
        InMemorySource(np.arange(3))
    with pytest.raises(DataConfigError, match="float64"):
        InMemorySource([[1.5, 2.0]])
    with pytest.raises(DataConfigError, match="without a 'tokens' key"):
        InMemorySource([{"ids": [1]}])
    lazy = InMemorySource([[1], None])  # Only the first element is checked eagerly.
    with pytest.raises(DataConfigError, match="document 1 has unsupported type NoneType"):
        lazy[1]
    checked = InMemorySource([[1, 2], [3, 9]], vocab_size=5)
    with pytest.raises(DataReadError, match=r"document 1: token id 9 .*vocab_size=5"):
        checked[1]
    with pytest.raises(DataReadError, match="id 4294967296"):
        InMemorySource([np.array([2**32])])


def test_as_token_source() -> None:
    syn = SyntheticSource(3)
    assert as_token_source(syn) is syn

    class Custom:
        def __len__(self) -> int:
            return 1

        def __getitem__(self, i: int) -> dict[str, np.ndarray]:
            return {"tokens": np.arange(2, dtype=np.int32)}

    custom = Custom()
    assert as_token_source(custom) is custom
    wrapped = as_token_source([[1, 2], [3]])
    assert isinstance(wrapped, InMemorySource) and _tokens(wrapped) == [[1, 2], [3]]
    dicts = as_token_source([{"tokens": [7]}])
    assert isinstance(dicts, InMemorySource) and dicts[0]["tokens"].dtype == np.int32
    assert ByteTokenizer().decode(as_token_source(["hi"])[0]["tokens"]) == "hi"


# ---------------------------------------------------------------- Synthetic


def test_synthetic_deterministic_and_order_independent() -> None:
    a = SyntheticSource(3000, mean_length=20, vocab_size=50, seed=7)
    b = SyntheticSource(3000, mean_length=20, vocab_size=50, seed=7)
    order = np.random.default_rng(0).permutation(len(b))
    by_index = {int(i): b[int(i)]["tokens"].tolist() for i in order}
    forward = _tokens(a)
    assert forward == [by_index[i] for i in range(len(a))]
    assert _tokens(a) == forward  # Repeatable.
    other_seed = SyntheticSource(3000, mean_length=20, vocab_size=50, seed=8)
    assert _tokens(other_seed) != forward
    tokens = np.concatenate([np.asarray(t) for t in forward])
    assert tokens.min() >= 2 and tokens.max() < 50
    assert len(np.unique(tokens)) == 48  # Covers [min_token_id, vocab_size).


def test_synthetic_length_distribution() -> None:
    src = SyntheticSource(20_000, mean_length=256, sigma=1.0, seed=1)
    lengths = src.lengths()
    assert lengths.shape == (20_000,)
    assert abs(lengths.mean() / 256 - 1) < 0.05
    mu = np.log(256) - 0.5
    assert abs(np.median(lengths) / np.exp(mu) - 1) < 0.05
    assert abs(np.log(lengths).std() - 1.0) < 0.05
    assert [src.length(i) for i in range(len(src))] == lengths.tolist()
    for i in [0, 1, 1023, 1024, 1025, 19_999]:
        assert len(src[i]["tokens"]) == lengths[i]
    sample = np.random.default_rng(1).choice(20_000, 300, replace=False)
    assert [len(src[int(i)]["tokens"]) for i in sample] == lengths[sample].tolist()


def test_synthetic_clipping_and_constant() -> None:
    src = SyntheticSource(5000, mean_length=100, sigma=2.0, min_length=10, max_length=120)
    lengths = src.lengths()
    assert lengths.min() == 10 and lengths.max() == 120
    const = SyntheticSource(10, mean_length=7, sigma=0.0, vocab_size=3, min_token_id=2)
    assert _tokens(const) == [[2] * 7] * 10


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_documents": 0}, "num_documents=0"),
        ({"mean_length": 0}, "mean_length=0"),
        ({"mean_length": float("nan")}, "mean_length=nan"),
        ({"sigma": -1}, "sigma=-1"),
        ({"vocab_size": 0}, "vocab_size=0"),
        ({"min_token_id": 258}, r"min_token_id=258.*vocab_size=258"),
        ({"min_token_id": -1}, "min_token_id=-1"),
        ({"min_length": 0}, "min_length=0"),
        ({"min_length": 5, "max_length": 4}, "max_length=4.*>= 5"),
        ({"seed": -3}, "seed=-3"),
        ({"num_documents": 2.5}, "num_documents=2.5"),
    ],
)
def test_synthetic_argument_errors(kwargs: dict[str, Any], match: str) -> None:
    kwargs = {"num_documents": 10, **kwargs}
    with pytest.raises(DataConfigError, match=match):
        SyntheticSource(**kwargs)


def test_synthetic_pickle() -> None:
    src = SyntheticSource(50, mean_length=10, seed=3, max_length=40)
    _assert_pickles(src)
    assert "max_length=40" in repr(src)


def test_blank_lines_are_skipped_with_a_warning_naming_the_file(tmp_path, caplog):
    import logging

    from xlstm_data.sources import TextFileSource

    path = tmp_path / "notes.txt"
    path.write_text("first\n\n   \nsecond\n\n")
    with caplog.at_level(logging.WARNING):
        source = TextFileSource(str(path), unit="line")
    assert len(source) == 2
    assert f"{path}: 3 blank line(s) skipped" in caplog.text
