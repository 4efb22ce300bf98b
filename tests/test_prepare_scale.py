"""`prepare` at scale: output shards apart from input files, a held-out split, bad lines,
named special tokens, the Beam runner and remote paths."""

from __future__ import annotations

import functools
import gzip
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.test_tokenizers import write_byte_bpe
from xlstm_data.cli.main import main as cli_main
from xlstm_data.errors import DataConfigError, DataReadError
from xlstm_data.prepare.corpus import prepare_corpus as prepare_any_layout
from xlstm_data.prepare.settings import load_tokenizer
from xlstm_data.sources import ArrayRecordSource
from xlstm_data.sources.tokenizers import ByteTokenizer

# These tests read the ArrayRecord layout; tests/test_flat_layout.py covers the flat default.
prepare_corpus = functools.partial(prepare_any_layout, layout="array_record")


def texts(count: int, seed: int = 0) -> list[str]:
    """Distinct documents of varied length (so each is identifiable by its tokens)."""
    rng = np.random.default_rng(seed)
    return [f"doc {i} " + "x" * int(rng.integers(0, 120)) for i in range(count)]


def write_jsonl(path: Path, documents: list[str]) -> Path:
    data = "".join(json.dumps({"text": d}) + "\n" for d in documents).encode()
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
    return path


@pytest.fixture
def raw(tmp_path) -> tuple[Path, list[str]]:
    """Twelve JSON-lines files of 1..23 documents, a few gzipped."""
    directory = tmp_path / "raw"
    directory.mkdir()
    documents, start = texts(150), 0
    for number in range(12):
        count = 1 + (number * 7) % 23
        suffix = ".jsonl.gz" if number % 4 == 0 else ".jsonl"
        write_jsonl(directory / f"f{number:02d}{suffix}", documents[start : start + count])
        start += count
    return directory, documents[:start]


def decoded(pattern: str) -> list[str]:
    source = ArrayRecordSource(pattern)
    decode = ByteTokenizer().decode
    return [decode(source[i]["tokens"]) for i in range(len(source))]


def output_files(directory: Path) -> dict[str, bytes]:
    """Every file `prepare` leaves for readers (its bookkeeping in .prepare aside)."""
    return {
        str(p.relative_to(directory)): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file() and ".prepare" not in p.parts
    }


# ---------------------------------------------------------------- shards apart from files


def test_num_shards_merges_small_inputs_keeping_every_document_once(tmp_path, raw):
    directory, documents = raw
    out = tmp_path / "out"
    index = prepare_corpus([str(directory / "*")], str(out), num_shards=3)
    assert [s["file"] for s in index["shards"]] == [
        f"shard-0000{k}-of-00003.array_record" for k in range(3)
    ]
    assert decoded(str(out / "*.array_record")) == documents
    tokens = [s["tokens"] for s in index["shards"]]
    longest = max(len(d.encode()) for d in documents)
    assert max(tokens) - min(tokens) <= 2 * longest  # cut by tokens, not by files
    assert sum(len(s["inputs"]) for s in index["shards"]) >= 12
    assert ArrayRecordSource(str(out / "*.array_record")).lengths().tolist() == [
        len(d.encode()) for d in documents
    ]


def test_num_shards_splits_big_inputs(tmp_path):
    documents = texts(400)
    write_jsonl(tmp_path / "one.jsonl", documents)
    out = tmp_path / "out"
    index = prepare_corpus([str(tmp_path / "one.jsonl")], str(out), num_shards=7)
    assert len(index["shards"]) == 7 and all(s["documents"] for s in index["shards"])
    assert decoded(str(out / "*.array_record")) == documents
    sized = prepare_corpus(
        [str(tmp_path / "one.jsonl")], str(tmp_path / "sized"), shard_size_mb=0.01
    )
    assert len(sized["shards"]) == -(-index["tokens"] * 4 // int(0.01 * 2**20))
    assert decoded(str(tmp_path / "sized" / "*.array_record")) == documents


def test_splitting_an_input_into_parts_changes_no_byte(tmp_path):
    rng = np.random.default_rng(1)
    lines = [f"line {i} " + "y" * int(rng.integers(0, 300)) for i in range(14_000)]
    (tmp_path / "big.txt").write_text("\n".join(lines) + "\n")
    assert (tmp_path / "big.txt").stat().st_size > 2 << 20
    whole = prepare_corpus([str(tmp_path / "big.txt")], str(tmp_path / "whole"), num_shards=2)
    parts = prepare_corpus(
        [str(tmp_path / "big.txt")], str(tmp_path / "parts"), num_shards=2, part_mb=1, workers=2
    )
    assert len(list((tmp_path / "parts" / ".prepare" / "parts").glob("*.done.json"))) == 3
    assert whole == parts
    assert output_files(tmp_path / "whole") == output_files(tmp_path / "parts")


def test_a_rerun_after_an_interruption_redoes_only_the_missing_shard(tmp_path, raw):
    directory, documents = raw
    out = tmp_path / "out"
    prepare_corpus([str(directory / "*")], str(out), num_shards=4)
    stamps = {p.name: p.stat().st_mtime_ns for p in out.glob("*.array_record")}
    (out / ".prepare" / "shards" / "train-shard-00002-of-00004.array_record.done.json").unlink()
    prepare_corpus([str(directory / "*")], str(out), num_shards=4)
    after = {p.name: p.stat().st_mtime_ns for p in out.glob("*.array_record")}
    changed = [name for name in stamps if after[name] != stamps[name]]
    assert changed == ["shard-00002-of-00004.array_record"]
    assert decoded(str(out / "*.array_record")) == documents
    assert not list((out / ".prepare" / "parts").glob("*.tokens"))  # the bulk is deleted


# ---------------------------------------------------------------- the held-out split


def test_validation_split_is_exact_disjoint_and_chosen_by_the_seed(tmp_path, raw):
    directory, documents = raw
    out = tmp_path / "out"
    index = prepare_corpus([str(directory / "*")], str(out), validation_fraction=0.1, seed=3)
    train, held = (
        decoded(str(out / "*.array_record")),
        decoded(str(out / "validation/*.array_record")),
    )
    assert len(held) == round(0.1 * len(documents)) == index["validation"]["documents"]
    assert sorted(train + held) == sorted(documents) and not set(train) & set(held)
    assert train == [d for d in documents if d in set(train)]  # input order kept
    assert held == [d for d in documents if d in set(held)]
    assert index["held_out"]["documents"] == len(held) and index["held_out"]["seed"] == 3
    validation = json.loads((out / "validation" / "index.json").read_text())
    assert validation["split"] == "validation" and validation["documents"] == len(held)
    assert ArrayRecordSource(str(out / "validation/*.array_record")).lengths().tolist() == [
        len(d.encode()) for d in held
    ]
    again = tmp_path / "again"
    prepare_corpus([str(directory / "*")], str(again), validation_fraction=0.1, seed=3)
    assert output_files(out) == output_files(again)
    other = tmp_path / "other"
    prepare_corpus([str(directory / "*")], str(other), validation_documents=15, seed=4)
    other_held = decoded(str(other / "validation/*.array_record"))
    assert len(other_held) == 15 and set(other_held) != set(held[:15])
    # Dropping the split removes its files.
    prepare_corpus([str(directory / "*")], str(other))
    assert not list((other / "validation").glob("*"))
    assert decoded(str(other / "*.array_record")) == documents


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"validation_fraction": 0.0}, r"--validation_fraction=0.0 is outside \(0, 1\)"),
        ({"validation_fraction": 1.0}, r"--validation_fraction=1.0 is outside \(0, 1\)"),
        ({"validation_fraction": 0.1, "validation_documents": 3}, r"pass one of them"),
        ({"validation_documents": 0}, r"--validation_documents=0 is invalid"),
        ({"num_shards": 0}, r"--num_shards=0 is invalid"),
        ({"num_shards": 2, "shard_size_mb": 1}, r"pass one of them"),
        ({"shard_size_mb": -1}, r"--shard_size_mb=-1 is invalid"),
        ({"eod_token": "</s>"}, r"--eod_token names a special token, but --tokenizer='byte'"),
    ],
)
def test_bad_settings_are_named_before_reading(tmp_path, raw, options, expected):
    directory, _ = raw
    with pytest.raises(DataConfigError, match=expected):
        prepare_corpus([str(directory / "*")], str(tmp_path / "out"), **options)
    assert not (tmp_path / "out").exists()


def test_holding_out_every_document_is_refused(tmp_path, raw):
    directory, documents = raw
    with pytest.raises(DataConfigError, match=rf"holds out {len(documents)} of the corpus's"):
        prepare_corpus(
            [str(directory / "*")], str(tmp_path / "out"), validation_documents=len(documents)
        )


# ---------------------------------------------------------------- bad lines, special tokens


def test_bad_lines_stop_the_run_or_are_skipped_and_counted(tmp_path, capsys):
    good = ['{"text": "one"}', '{"text": "two"}']
    (tmp_path / "a.jsonl").write_text("\n".join([good[0], "{broken", good[1], "[1]"]) + "\n")
    (tmp_path / "b.jsonl").write_text("\n".join(good) + "\n")
    with pytest.raises(DataReadError, match=r"line 2 of .*a\.jsonl"):
        prepare_corpus([str(tmp_path / "*.jsonl")], str(tmp_path / "out"))
    code = cli_main(
        [
            "prepare",
            str(tmp_path / "*.jsonl"),
            f"--output={tmp_path / 'out'}",
            "--skip_bad_lines",
            "--layout=array_record",
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert f"skipped 2 bad lines in {tmp_path / 'a.jsonl'}" in printed
    assert "b.jsonl" not in printed.split("prepared")[0]
    index = json.loads((tmp_path / "out" / "index.json").read_text())
    assert index["skipped_lines"] == {str(tmp_path / "a.jsonl"): 2}
    assert decoded(str(tmp_path / "out" / "*.array_record")) == ["one", "two", "one", "two"]


def write_bpe_with_a_custom_end_token(path: Path) -> Path:
    import tokenizers

    bpe = write_byte_bpe(path.parent / "base.json")
    tokenizer = tokenizers.Tokenizer.from_file(str(bpe))
    tokenizer.add_special_tokens(["<|doc_end|>"])
    tokenizer.save(str(path))
    return path


def test_a_named_end_of_document_token_is_recorded_and_read_back(tmp_path):
    tokenizer = write_bpe_with_a_custom_end_token(tmp_path / "tok" / "custom.json")
    (tmp_path / "raw.txt").write_text("the quick brown fox\nover the lazy dog\n")
    out = tmp_path / "out"
    index = prepare_corpus(
        [str(tmp_path / "raw.txt")], str(out), tokenizer=str(tokenizer), eod_token="<|doc_end|>"
    )
    from xlstm_data.sources.tokenizers import HFTokenizer

    expected = HFTokenizer(tokenizer, eod_token="<|doc_end|>").eod_id
    assert index["eod_token"] == "<|doc_end|>" and index["eod_id"] == expected
    source = ArrayRecordSource(str(out / "*.array_record"))
    assert source.tokenizer.eod_id == expected
    with pytest.raises(DataConfigError, match=r"eod_token='<\|nope\|>' is not in the vocabulary"):
        prepare_corpus(
            [str(tmp_path / "raw.txt")], str(out), tokenizer=str(tokenizer), eod_token="<|nope|>"
        )


def test_the_tokenizer_is_loaded_once_per_process_not_per_file(tmp_path, raw):
    directory, _ = raw
    bpe = write_byte_bpe(tmp_path / "tok" / "bpe.json")
    load_tokenizer.cache_clear()
    prepare_corpus([str(directory / "*")], str(tmp_path / "out"), tokenizer=str(bpe))
    assert load_tokenizer.cache_info().misses == 1  # 12 files, 1 load


# ---------------------------------------------------------------- Beam and remote paths


def test_beam_direct_runner_writes_the_same_bytes_as_the_local_runner(tmp_path, raw):
    directory, _ = raw
    options = {"num_shards": 3, "validation_fraction": 0.2, "seed": 5}
    local = prepare_corpus([str(directory / "*")], str(tmp_path / "local"), workers=2, **options)
    beam = prepare_corpus(
        [str(directory / "*")],
        str(tmp_path / "beam"),
        runner="beam",
        beam_options=["--direct_num_workers=2", "--direct_running_mode=multi_threading"],
        **options,
    )
    assert beam == local
    assert output_files(tmp_path / "beam") == output_files(tmp_path / "local")
    assert len(output_files(tmp_path / "beam")) == 3 + 2 + 1 + 2  # shards, indexes


def test_beam_errors_name_the_runner_and_the_extra(tmp_path, raw, monkeypatch, capsys):
    directory, _ = raw
    argv = ["prepare", str(directory / "*"), f"--output={tmp_path / 'out'}", "--runner=beam"]
    assert cli_main([*argv, "--beam_options=--runner=NoSuchRunner"]) == 2
    assert "runner 'NoSuchRunner' is not available" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "apache_beam", None)
    assert cli_main(argv) == 2
    assert "pip install 'xlstm-data[beam]'" in capsys.readouterr().err
    assert cli_main(["prepare", str(directory / "*"), "--output=o", "--beam_options=x"]) == 2
    assert "--beam_options='x' needs --runner=beam" in capsys.readouterr().err


def test_inputs_and_output_on_a_remote_filesystem(tmp_path, raw, memory_gs):
    directory, _ = raw
    for path in sorted(directory.iterdir()):
        memory_gs.pipe(f"gs://bucket/raw/{path.name}", path.read_bytes())
    options = {"num_shards": 2, "validation_documents": 5}
    remote = prepare_corpus(["gs://bucket/raw/*"], "gs://bucket/out", **options)
    local = prepare_corpus([str(directory / "*")], str(tmp_path / "local"), **options)
    assert remote["documents"] == local["documents"] and remote["tokens"] == local["tokens"]
    for name, data in output_files(tmp_path / "local").items():
        if name.endswith(".array_record") or name.endswith(".npy"):
            assert memory_gs.cat(f"gs://bucket/out/{name}") == data, name


def test_lengths_are_written_piece_by_piece_as_np_save_writes_them(tmp_path):
    """`lengths.npy` is streamed from each shard's lengths (never all in memory)."""
    import io

    from xlstm_data.prepare import paths

    pieces = [np.arange(5), np.array([], dtype=np.int64), np.arange(7, 10)]
    expected = io.BytesIO()
    np.save(expected, np.concatenate(pieces).astype(np.int32))
    paths.write_npy_in_pieces(str(tmp_path / "l.npy"), iter(pieces), 8, np.int32)
    assert (tmp_path / "l.npy").read_bytes() == expected.getvalue()
    for count in (7, 9):
        with pytest.raises(ValueError, match=f"expected {count} values"):
            paths.write_npy_in_pieces(str(tmp_path / "m.npy"), iter(pieces), count, np.int32)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["l.npy"]
