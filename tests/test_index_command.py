"""`xlstm-data index`: the lengths index for ArrayRecord shards made elsewhere."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
import pytest

import xlstm_data as xd
from tests.test_tokenizers import write_byte_bpe
from xlstm_data.cli.main import main as cli_main
from xlstm_data.errors import DataConfigError
from xlstm_data.prepare.corpus import prepare_corpus as prepare_any_layout
from xlstm_data.prepare.index_shards import index_shards
from xlstm_data.sources import ArrayRecordSource, write_array_record
from xlstm_data.sources.tokenizers import HFTokenizer

# These tests read the ArrayRecord layout; tests/test_flat_layout.py covers the flat default.
prepare_corpus = functools.partial(prepare_any_layout, layout="array_record")

TEXT = [
    "the quick brown fox jumps over the lazy dog",
    "grüße aus 東京 🚀",
    "",
    "pack my box with five dozen liquor jugs\nand a second line",
    "x",
]


def _token_documents(seed: int = 0) -> list[np.ndarray]:
    """Three shards' worth of documents; each shard's documents share a length (.npy rows)."""
    rng = np.random.default_rng(seed)
    return [
        rng.integers(0, 258, (rows, width)).astype(np.int32)
        for rows, width in ((4, 7), (1, 30), (6, 3))
    ]


def _write_text_shards(directory: Path) -> list[str]:
    write_array_record(directory / "a.array_record", TEXT[:3])
    write_array_record(directory / "b.array_record", TEXT[3:])
    return TEXT


@pytest.fixture
def bpe(tmp_path: Path) -> Path:
    return write_byte_bpe(tmp_path / "tok" / "bpe.json")


def test_token_shards_get_the_index_prepare_writes(tmp_path: Path) -> None:
    arrays = _token_documents()
    inputs = tmp_path / "raw"
    inputs.mkdir()
    for k, array in enumerate(arrays):
        np.save(inputs / f"{k}.npy", array)
    prepared = tmp_path / "prepared"
    expected = prepare_corpus([str(inputs / "*.npy")], str(prepared))
    shards = tmp_path / "shards"
    for k, array in enumerate(arrays):  # prepare's names, so the "file" entries agree
        write_array_record(shards / f"shard-{k:05d}-of-00003.array_record", list(array))

    index = index_shards([str(shards / "*.array_record")])

    written = json.loads((shards / "index.json").read_text())
    assert written == index
    for entry in index["shards"]:
        assert entry.pop("source") == str(shards / entry["file"])
    # prepare also says which split and which input files each shard came from.
    expected.pop("split")
    for entry in expected["shards"]:
        del entry["source"], entry["inputs"]
    assert index == expected
    ours, theirs = np.load(shards / "lengths.npy"), np.load(prepared / "lengths.npy")
    assert ours.dtype == theirs.dtype and ours.tolist() == theirs.tolist()

    source = ArrayRecordSource(str(shards / "*.array_record"))
    assert source.prepared is not None and source.has_lengths()
    assert source.lengths().tolist() == [len(row) for array in arrays for row in array]
    assert source.tokenizer is not None and source.tokenizer.eod_id == 1


def test_text_shards_count_the_tokens_a_text_source_reads(tmp_path: Path, bpe: Path) -> None:
    for tokenizer in ("byte", str(bpe)):
        shards = tmp_path / ("byte" if tokenizer == "byte" else "bpe")
        _write_text_shards(shards)
        index = index_shards(str(shards / "*"), record_format="text", tokenizer=tokenizer)
        assert index["record_format"] == "text" and index["tokenizer"] == tokenizer
        plain = ArrayRecordSource(
            [str(shards / "a.array_record"), str(shards / "b.array_record")],
            record_format="text",
            tokenizer=tokenizer,
        )
        source = ArrayRecordSource(str(shards / "*.array_record"), record_format="text")
        assert source.has_lengths()
        read = [len(source[i]["tokens"]) for i in range(len(source))]
        assert source.lengths().tolist() == read == [len(plain[i]["tokens"]) for i in range(5)]
        assert read == [len(plain.tokenizer.encode(t)) for t in TEXT]
    assert isinstance(source.tokenizer, HFTokenizer)  # the index's tokenizer by default
    assert read != [len(t.encode()) for t in TEXT]  # BPE merges bytes: not the byte counts

    # Another tokenizer would read other lengths: refused, as for token shards.
    with pytest.raises(DataConfigError, match="is not the tokenizer the shards were prepared"):
        ArrayRecordSource(
            str(tmp_path / "byte" / "*.array_record"), record_format="text", tokenizer=str(bpe)
        )
    # The index says text: reading the records as tokens is refused, naming both formats.
    with pytest.raises(DataConfigError, match=r"record_format='tokens'.*'text'"):
        ArrayRecordSource(str(tmp_path / "byte" / "*.array_record"))


def test_indexed_text_shards_give_an_exact_epoch_length(tmp_path: Path) -> None:
    shards = tmp_path / "shards"
    _write_text_shards(shards)
    assert cli_main(["index", str(shards / "*"), "--record_format=text"]) == 0
    config = {
        "train": {
            "corpus": {
                "kind": "array_record",
                "path": str(shards / "*.array_record"),
                "record_format": "text",
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


def test_the_eod_token_is_recorded_and_read_back(tmp_path: Path, bpe: Path) -> None:
    import tokenizers

    tok = tokenizers.Tokenizer.from_file(str(bpe))
    tok.add_special_tokens(["<|custom|>"])
    custom = tmp_path / "custom.json"
    tok.save(str(custom))
    eod = tok.token_to_id("<|custom|>")
    assert HFTokenizer(custom).eod_id != eod  # detected: "<|endoftext|>"
    shards = tmp_path / "shards"
    write_array_record(shards / "a.array_record", [np.array([5, 6, eod]), np.array([7])])

    index = index_shards(str(shards / "*"), tokenizer=str(custom), eod_token="<|custom|>")

    assert index["eod_token"] == "<|custom|>" and index["eod_id"] == eod
    assert "pad_token" not in index
    source = ArrayRecordSource(str(shards / "a.array_record"), tokenizer=None)
    assert source.tokenizer is not None and source.tokenizer.eod_id == eod
    assert source.prepared is not None and source.prepared.eod_token == "<|custom|>"


def test_workers_give_a_byte_identical_index(tmp_path: Path) -> None:
    shards = tmp_path / "shards"
    for k, array in enumerate(_token_documents(1)):
        write_array_record(shards / f"{k}.array_record", list(array))
    written = []
    for workers in (1, 2):
        seen: list[tuple[int, int]] = []
        index_shards(
            str(shards / "*"), workers=workers, progress=lambda *a, seen=seen: seen.append(a[:2])
        )
        assert seen == [(1, 3), (2, 3), (3, 3)]
        written.append([(shards / n).read_bytes() for n in ("index.json", "lengths.npy")])
    assert written[0] == written[1]


# ---------------------------------------------------------------- the command line


def test_cli_prints_the_index_and_the_config_to_use(tmp_path: Path, capsys) -> None:
    shards = tmp_path / "shards"
    for k, array in enumerate(_token_documents()):
        write_array_record(shards / f"{k}.array_record", list(array))
    pattern = str(shards / "*.array_record")
    assert cli_main(["index", pattern]) == 0
    out, err = capsys.readouterr()
    assert out == (
        f"indexed 11 documents, 76 tokens in 3 shards: {shards / 'index.json'} "
        f"(use kind='array_record', path={pattern!r}, record_format='tokens')\n"
    )
    assert "3/3" in err  # the progress bar
    # A rerun on DIR/* skips the index files it wrote, and suggests a path that skips them too.
    assert cli_main(["index", str(shards / "*")]) == 0
    assert f"path={pattern!r}" in capsys.readouterr().out

    assert cli_main(["index", "--help"]) == 0
    text = capsys.readouterr().out
    assert "usage: xlstm-data index PATH_GLOB" in text and "--record_format" in text
    assert cli_main(["--help"]) == 0
    assert "  index " in capsys.readouterr().out


def _bad_record(directory: Path, record: object) -> None:
    write_array_record(directory / "a.array_record", [np.array([2, 3]), record])


@pytest.mark.parametrize(
    "make, argv, expected",
    [
        (lambda d: (d / "notes.txt").write_text("hi"), [], ["notes.txt", "not an ArrayRecord"]),
        (None, ["{d}/nothing*.array_record"], ["nothing*.array_record", "matches no file"]),
        (None, ["{d}/*/*.array_record"], ["2 directories", "/one'", "/two'"]),
        (None, ["--record_format=csv"], ["--record_format='csv'", "'tokens', 'text'"]),
        (
            lambda d: _bad_record(d, b"abcdef"),
            [],
            ["record 1 of shard", "a.array_record", "6 bytes", "--record_format=text"],
        ),
        (
            lambda d: _bad_record(d, np.array([4, 300])),
            [],
            ["record 1 of shard", "token id 300", "[0, 258)", "--vocab_size", "--tokenizer"],
        ),
        (
            lambda d: _bad_record(d, b"ok \xff"),
            ["--record_format=text", "--workers=2"],  # raised in a worker process
            ["record 1 of shard", "not valid UTF-8", "--record_format=tokens"],
        ),
        (None, ["--vocab_size=100"], ["--vocab_size=100", "258 ids", ">= 258"]),
        (None, ["--workers=0"], ["--workers=0", ">= 1"]),
        (None, ["--tokenizer=byte", "--eod_token=<x>"], ["--eod_token", "--tokenizer='byte'"]),
    ],
)
def test_bad_input_is_named(tmp_path: Path, capsys, make, argv, expected) -> None:
    shards = tmp_path / "shards"
    for name in ("one", "two"):
        write_array_record(shards / name / "s.array_record", [np.array([2, 3])])
    write_array_record(shards / "s.array_record", [np.array([2, 3])])
    if make is not None:
        make(shards)
    flags = [a for a in argv if a.startswith("--")]
    patterns = [a.format(d=shards) for a in argv if not a.startswith("--")]
    code = cli_main(["index", *(patterns or [str(shards / "*")]), *flags])
    error = capsys.readouterr().err
    assert code == 2, error
    for part in expected:
        assert part in error, error
    assert not (shards / "index.json").exists()


def test_no_path_glob_is_a_usage_error(capsys) -> None:
    assert cli_main(["index"]) == 2
    assert "no PATH_GLOB given" in capsys.readouterr().err


# ---------------------------------------------------------------- shards on a remote filesystem


def test_shards_on_a_remote_filesystem_get_the_same_index(
    tmp_path: Path, memory_gs, capsys
) -> None:
    local = tmp_path / "shards"
    for k, array in enumerate(_token_documents()):
        write_array_record(local / f"{k}.array_record", list(array))
    for path in sorted(local.iterdir()):
        memory_gs.pipe(f"gs://bucket/corpus/{path.name}", path.read_bytes())
    memory_gs.pipe("gs://bucket/corpus/sub/x.array_record", b"a directory's file: not matched")
    expected = index_shards([str(local / "*.array_record")])

    pattern = "gs://bucket/corpus/*.array_record"
    assert cli_main(["index", pattern]) == 0
    out = capsys.readouterr().out
    assert "indexed 11 documents, 76 tokens in 3 shards: gs://bucket/corpus/index.json" in out
    assert f"path={pattern!r}" in out
    written = json.loads(memory_gs.cat("gs://bucket/corpus/index.json"))
    for theirs, ours in zip(expected["shards"], written["shards"], strict=True):
        assert ours.pop("source") == f"gs://bucket/corpus/{ours['file']}"
        del theirs["source"]
    assert written == expected
    assert memory_gs.cat("gs://bucket/corpus/lengths.npy") == (local / "lengths.npy").read_bytes()
    assert [p for p in memory_gs.ls("gs://bucket/corpus", detail=False) if "partial" in p] == []

    # A rerun on DIR/* skips its own index files; a file that is not ArrayRecord is named.
    assert cli_main(["index", "gs://bucket/corpus/*"]) == 0
    capsys.readouterr()
    memory_gs.pipe("gs://bucket/corpus/notes.txt", b"hi")
    assert cli_main(["index", "gs://bucket/corpus/*"]) == 2
    error = capsys.readouterr().err
    assert "'gs://bucket/corpus/notes.txt', which is not an ArrayRecord file" in error
    for bad, expected_error in (
        ("gs://bucket/nothing/*.array_record", "matches no file"),
        ("gs://bucket/corpus/none.array_record", "matches no file"),
        ("gs://buck*/corpus/*", "a wildcard in the bucket name"),
    ):
        assert cli_main(["index", bad]) == 2
        assert expected_error in capsys.readouterr().err, bad
