"""`xlstm-data prepare`: exact round trips, the index, resumption, errors."""

from __future__ import annotations

import functools
import json
import os

import numpy as np
import pytest

import xlstm_data as xd
from xlstm_data.cli.main import main as cli_main
from xlstm_data.errors import DataConfigError, DataReadError
from xlstm_data.prepare.corpus import prepare_corpus as prepare_any_layout
from xlstm_data.sources import ArrayRecordSource, write_array_record
from xlstm_data.sources.tokenizers import ByteTokenizer

# These tests read the ArrayRecord layout; tests/test_flat_layout.py covers the flat default.
prepare_corpus = functools.partial(prepare_any_layout, layout="array_record")

LINES = ["first document", "zweites Dokument ü", "", "third one\twith a tab", "x"]
JSONL = [{"text": "json one", "id": 1}, {"text": "json two ✓"}, {"text": "three"}]


@pytest.fixture
def inputs(tmp_path):
    directory = tmp_path / "raw"
    directory.mkdir()
    (directory / "a.txt").write_text("\n".join(LINES) + "\n")
    (directory / "b.jsonl").write_text("\n".join(json.dumps(r) for r in JSONL) + "\n")
    np.save(directory / "c.npy", np.arange(200, 240, dtype=np.int32))
    np.savez(directory / "d.npz", x=np.array([5, 6, 7]), y=np.array([8]))
    return directory


def expected_documents() -> list[list[int]]:
    encode = ByteTokenizer().encode
    docs = [encode(line).tolist() for line in LINES if line]
    docs += [encode(r["text"]).tolist() for r in JSONL]
    return docs + [list(range(200, 240)), [5, 6, 7], [8]]


def test_prepare_round_trips_tokens_and_indexes_them(tmp_path, inputs):
    out = tmp_path / "prepared"
    index = prepare_corpus([str(inputs / "*")], str(out), workers=2)
    source = ArrayRecordSource(str(out / "*.array_record"))
    got = [source[i]["tokens"].tolist() for i in range(len(source))]
    assert got == expected_documents()
    assert index["documents"] == len(got)
    assert index["tokens"] == sum(map(len, got))
    assert [s["documents"] for s in index["shards"]] == [4, 3, 1, 2]
    assert [os.path.basename(s["source"]) for s in index["shards"]] == [
        "a.txt",
        "b.jsonl",
        "c.npy",
        "d.npz",
    ]
    assert source.lengths().tolist() == [len(d) for d in got]
    # A subset of the shards gets its own slice of the lengths.
    subset = ArrayRecordSource(str(out / "shard-0000[12]-*.array_record"))
    assert subset.lengths().tolist() == [len(d) for d in got[4:8]]


def test_workers_do_not_change_the_output(tmp_path, inputs):
    prepare_corpus([str(inputs / "*")], str(tmp_path / "one"), workers=1)
    prepare_corpus([str(inputs / "*")], str(tmp_path / "two"), workers=2)
    one = ArrayRecordSource(str(tmp_path / "one" / "*.array_record"))
    two = ArrayRecordSource(str(tmp_path / "two" / "*.array_record"))
    assert [one[i]["tokens"].tolist() for i in range(len(one))] == [
        two[i]["tokens"].tolist() for i in range(len(two))
    ]


def test_rerun_keeps_finished_shards_and_redoes_the_rest(tmp_path, inputs):
    out = tmp_path / "prepared"
    prepare_corpus([str(inputs / "*")], str(out))
    shards = sorted(out.glob("*.array_record"))
    stamps = {p.name: p.stat().st_mtime_ns for p in shards}
    # Interrupted mid-way: shard 2 never finished (no done marker, half a file).
    (out / ".prepare" / "shards" / f"train-{shards[2].name}.done.json").unlink()
    shards[2].write_bytes(b"partial")
    # And an input changed since its shard was made.
    (inputs / "a.txt").write_text("changed\n")
    prepare_corpus([str(inputs / "*")], str(out))
    after = {p.name: p.stat().st_mtime_ns for p in sorted(out.glob("*.array_record"))}
    assert after[shards[1].name] == stamps[shards[1].name]  # kept
    assert after[shards[3].name] == stamps[shards[3].name]  # kept
    assert after[shards[2].name] != stamps[shards[2].name]  # redone
    source = ArrayRecordSource(str(out / "*.array_record"))
    assert source[0]["tokens"].tolist() == ByteTokenizer().encode("changed").tolist()
    assert len(source) == 1 + 3 + 1 + 2


def test_bad_input_names_the_file_and_line(tmp_path, inputs, capsys):
    (inputs / "bad.jsonl").write_text('{"text": "ok"}\n{"text": broken\n')
    code = cli_main(["prepare", str(inputs / "bad.jsonl"), "--output", str(tmp_path / "o")])
    assert code == 2
    message = capsys.readouterr().err
    assert "line 2" in message and "bad.jsonl" in message


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--format", "csv"], "--format='csv' is invalid"),
        (["--workers", "0"], "workers=0 is invalid"),
        (["--unit", "page"], "--unit='page' is invalid; valid units: ['line', 'file']"),
        (["--tokenizer", "nope"], "tokenizer='nope' is not valid"),
    ],
)
def test_bad_arguments_are_named(tmp_path, inputs, capsys, argv, expected):
    code = cli_main(["prepare", str(inputs / "a.txt"), "--output", str(tmp_path / "o"), *argv])
    assert code == 2
    assert expected in capsys.readouterr().err


def test_missing_input_is_named(tmp_path, capsys):
    code = cli_main(["prepare", str(tmp_path / "nothing*.txt"), "--output", str(tmp_path / "o")])
    assert code == 2
    assert "nothing*.txt" in capsys.readouterr().err


def test_cli_prints_progress_and_the_config_path(tmp_path, inputs, capsys):
    out = tmp_path / "prepared"
    assert cli_main(["prepare", str(inputs / "*"), "--output", str(out)]) == 0
    captured = capsys.readouterr()
    # Not a terminal: a plain line per tenth of the work, never a carriage return.
    assert "parts: 4/4\n" in captured.err and "shards: 4/4\n" in captured.err
    assert "\r" not in captured.err
    assert f"{out}/*.tokens.npy (use kind='array_record', path='{out}')" in captured.out


def test_prepared_corpus_gives_an_exact_epoch_length(tmp_path, inputs):
    out = tmp_path / "prepared"
    prepare_corpus([str(inputs / "*")], str(out))
    config = {
        "train": {
            "corpus": {
                "kind": "array_record",
                "path": str(out / "*.array_record"),
            }
        },
        "global_batch_size": 4,
        "max_target_length": 8,
        "packing": False,
        "num_epochs": 1,
        "drop_remainder": False,
    }
    train, _ = xd.iterators_from_config(config, xd.create_mesh("dp:1,fsdp:-1,tp:1,sp:1"))
    assert train.epoch_length.exact
    assert train.iterator_length == train.epoch_length.steps
    assert sum(1 for _ in train) == train.epoch_length.steps
    train.close()


def test_rerun_with_other_settings_redoes_the_shards(tmp_path, inputs):
    out = tmp_path / "prepared"
    prepare_corpus([str(inputs / "a.txt")], str(out))
    prepare_corpus([str(inputs / "a.txt")], str(out), unit="file")
    source = ArrayRecordSource(str(out / "*.array_record"))
    assert len(source) == 1  # the whole file is now one document


# ---------------------------------------------------------------- vocabulary


def test_ids_outside_the_vocabulary_are_refused_unless_declared(tmp_path, capsys):
    np.save(tmp_path / "ids.npy", np.arange(250, 300, dtype=np.int32).reshape(5, 10))
    out = tmp_path / "o"
    code = cli_main(["prepare", str(tmp_path / "ids.npy"), "--output", str(out)])
    assert code == 2
    error = capsys.readouterr().err
    assert "document 0 of" in error and "ids.npy" in error and "token id 258" in error
    assert "[0, 258)" in error and "tokenizer='byte'" in error
    assert not list(out.glob("*.array_record*"))  # nothing half-written is left
    index = prepare_corpus([str(tmp_path / "ids.npy")], str(out), vocab_size=300)
    assert (index["vocab_size"], index["tokenizer_vocab_size"], index["eod_id"]) == (300, 258, 1)
    assert ArrayRecordSource(str(out / "*.array_record")).vocab_size == 300
    with pytest.raises(DataConfigError, match=r"vocab_size=100 is smaller .*\(258 ids\)"):
        prepare_corpus([str(tmp_path / "ids.npy")], str(out), vocab_size=100)


# ---------------------------------------------------------------- .json inputs


def test_json_input_is_read_as_json_lines_only_when_it_holds_them(tmp_path, capsys):
    records = [{"text": "one {braced}"}, {"text": "two"}]
    (tmp_path / "data.json").write_text("\n".join(json.dumps(r) for r in records) + "\n")
    out = tmp_path / "o"
    decode = ByteTokenizer().decode
    prepare_corpus([str(tmp_path / "data.json")], str(out))
    source = ArrayRecordSource(str(out / "*.array_record"))
    assert [decode(source[i]["tokens"]) for i in range(len(source))] == ["one {braced}", "two"]
    # Asked for explicitly, the raw characters (braces, keys) are the text.
    prepare_corpus([str(tmp_path / "data.json")], str(out), input_format="text")
    source = ArrayRecordSource(str(out / "*.array_record"))
    assert decode(source[0]["tokens"]) == json.dumps(records[0])
    # One JSON document (not one object per line) is refused, naming the way out.
    (tmp_path / "doc.json").write_text(json.dumps(records, indent=2))
    assert cli_main(["prepare", str(tmp_path / "doc.json"), "--output", str(tmp_path / "d")]) == 2
    error = capsys.readouterr().err
    assert "doc.json" in error and "--format=text" in error
    assert not list((tmp_path / "d").glob("*.array_record"))


# ---------------------------------------------------------------- stale shards and index


def test_rerun_with_fewer_inputs_removes_only_its_stale_shards(tmp_path, inputs):
    out = tmp_path / "prepared"
    prepare_corpus([str(inputs / "*")], str(out))
    (out / "notes.txt").write_text("mine")
    (out / "shard-extra.array_record").write_text("not prepare's naming")
    prepare_corpus([str(inputs / "a.txt"), str(inputs / "d.npz")], str(out))
    assert sorted(p.name for p in out.glob("shard-*")) == [
        "shard-00000-of-00002.array_record",
        "shard-00001-of-00002.array_record",
        "shard-extra.array_record",
    ]
    assert sorted(p.name for p in (out / ".prepare" / "shards").iterdir()) == [
        "train-shard-00000-of-00002.array_record.done.json",
        "train-shard-00000-of-00002.array_record.lengths.npy",
        "train-shard-00001-of-00002.array_record.done.json",
        "train-shard-00001-of-00002.array_record.lengths.npy",
    ]
    parts = sorted(p.name.split(".", 1)[1] for p in (out / ".prepare" / "parts").iterdir())
    assert parts == ["done.json", "done.json", "lengths.npy", "lengths.npy"]
    assert (out / "notes.txt").read_text() == "mine"
    source = ArrayRecordSource(str(out / "shard-*-of-*.array_record"))
    docs = expected_documents()
    assert [source[i]["tokens"].tolist() for i in range(len(source))] == docs[:4] + docs[-2:]
    assert source.lengths().tolist() == [len(d) for d in docs[:4] + docs[-2:]]


def _prepared(tmp_path, inputs):
    out = tmp_path / "prepared"
    prepare_corpus([str(inputs / "*")], str(out))
    return out, str(out / "*.array_record")


def _edit_index(out, change):
    index = json.loads((out / "index.json").read_text())
    change(index)
    (out / "index.json").write_text(json.dumps(index))


def test_a_shard_the_index_does_not_list_is_an_error(tmp_path, inputs):
    out, pattern = _prepared(tmp_path, inputs)
    (out / "shard-00000-of-00009.array_record").write_bytes(
        (out / "shard-00000-of-00004.array_record").read_bytes()
    )
    with pytest.raises(DataReadError, match=r"shard-00000-of-00009.*index.json does not list it"):
        ArrayRecordSource(pattern)


def test_record_count_or_size_disagreeing_with_the_index_is_an_error(tmp_path, inputs):
    out, pattern = _prepared(tmp_path, inputs)

    def move_a_document(index):  # the totals still agree with lengths.npy
        index["shards"][1]["documents"] += 1
        index["shards"][2]["documents"] -= 1

    _edit_index(out, move_a_document)
    source = ArrayRecordSource(pattern)  # counts from the index: no shard opened yet
    with pytest.raises(DataReadError, match=r"shard-00001-of-00004.* holds 3 records but .*says"):
        source.read_many(np.arange(len(source)))
    one_by_one = ArrayRecordSource(pattern)
    with pytest.raises(DataReadError, match=r"shard-00001-of-00004.* holds 3 records but .*says"):
        for i in range(len(one_by_one)):
            one_by_one[i]
    out, pattern = _prepared(tmp_path / "again", inputs)
    shard = out / "shard-00002-of-00004.array_record"
    noise = np.random.default_rng(0).integers(2, 258, 200_000, dtype=np.int32)
    write_array_record(shard, [noise])  # the same record count, another size
    with pytest.raises(DataReadError, match=r"shard-00002-of-00004.* is \d+ bytes but .*says"):
        ArrayRecordSource(pattern)


def test_lengths_disagreeing_with_the_index_is_an_error(tmp_path, inputs):
    out, pattern = _prepared(tmp_path, inputs)
    lengths = np.load(out / "lengths.npy")
    np.save(out / "lengths.npy", lengths[:-1])
    with pytest.raises(DataReadError, match=r"lengths.npy: holds 9 document lengths .* lists 10"):
        ArrayRecordSource(pattern)
    np.save(out / "lengths.npy", lengths + 1)
    source = ArrayRecordSource(pattern)
    with pytest.raises(DataReadError, match=r"lengths.npy: documents 0..3 sum to .* holds"):
        source.lengths()


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("{not json", r"index.json: is not a readable prepare index"),
        ('{"format_version": 1}', r"index.json: has format_version=1, .* reads format_version=2"),
        (None, r"index.json: key 'eod_id' is None, expected a int"),
    ],
)
def test_an_unreadable_or_old_index_is_an_error(tmp_path, inputs, content, expected):
    out, pattern = _prepared(tmp_path, inputs)
    if content is None:
        _edit_index(out, lambda index: index.pop("eod_id"))
    else:
        (out / "index.json").write_text(content)
    with pytest.raises(DataReadError, match=expected):
        ArrayRecordSource(pattern)


def test_an_index_rewritten_by_prepare_is_trusted_again(tmp_path, inputs):
    out, pattern = _prepared(tmp_path, inputs)
    np.save(out / "lengths.npy", np.zeros(3, np.int32))
    prepare_corpus([str(inputs / "*")], str(out))  # same inputs: shards kept, index rewritten
    assert ArrayRecordSource(pattern).lengths().tolist() == list(map(len, expected_documents()))
