"""`xlstm-data prepare`: exact round trips, the index, resumption, errors."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import xlstm_data as xd
from xlstm_data.cli import main as cli_main
from xlstm_data.prepare import prepare_corpus
from xlstm_data.sources import ArrayRecordSource
from xlstm_data.tokenizers import ByteTokenizer

LINES = ["first document", "zweites Dokument ü", "", "third one\twith a tab", "x"]
JSONL = [{"text": "json one", "id": 1}, {"text": "json two ✓"}, {"text": "three"}]


@pytest.fixture
def inputs(tmp_path):
    directory = tmp_path / "raw"
    directory.mkdir()
    (directory / "a.txt").write_text("\n".join(LINES) + "\n")
    (directory / "b.jsonl").write_text("\n".join(json.dumps(r) for r in JSONL) + "\n")
    np.save(directory / "c.npy", np.arange(300, 340, dtype=np.int32))
    np.savez(directory / "d.npz", x=np.array([5, 6, 7]), y=np.array([8]))
    return directory


def expected_documents() -> list[list[int]]:
    encode = ByteTokenizer().encode
    docs = [encode(line).tolist() for line in LINES if line]
    docs += [encode(r["text"]).tolist() for r in JSONL]
    return docs + [list(range(300, 340)), [5, 6, 7], [8]]


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
    (out / ".prepare" / (shards[2].name + ".done.json")).unlink()
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
    assert "4/4 shards" in captured.err
    assert f"path='{out}/*.array_record'" in captured.out


def test_prepared_corpus_gives_an_exact_epoch_length(tmp_path, inputs):
    out = tmp_path / "prepared"
    prepare_corpus([str(inputs / "*")], str(out))
    config = {
        "train": {
            "corpus": {
                "kind": "array_record",
                "path": str(out / "*.array_record"),
                "vocab_size": 400,  # the .npy document holds ids up to 339
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
