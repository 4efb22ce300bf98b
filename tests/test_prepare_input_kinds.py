"""Every input kind `prepare` reads round-trips token for token against plain JSON lines,
and every bad input is named."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from xlstm_data.errors import DataConfigError, DataReadError
from xlstm_data.prepare.corpus import prepare_corpus
from xlstm_data.prepare.inputs import SkippedLines, find_inputs, read_documents
from xlstm_data.sources import ArrayRecordSource, TextFileSource

DOCUMENTS = ["first", "zweites Dokument ü", "", "tab\there", "東京 🚀", "x" * 300]


def jsonl_bytes(documents=DOCUMENTS) -> bytes:
    return "".join(json.dumps({"text": d}) + "\n" for d in documents).encode()


def all_documents(pattern: str, **options) -> list:
    out = []
    for part in find_inputs([pattern], **{k: v for k, v in options.items() if k != "field"}):
        out += [
            d.tolist() if isinstance(d, np.ndarray) else d
            for d in read_documents(part, field=options.get("field", "text"))
        ]
    return out


def write_hf_dataset(directory: Path, documents) -> Path:
    """What `datasets.save_to_disk` writes: Arrow stream files listed in state.json."""
    directory.mkdir(parents=True)
    names = []
    for k, chunk in enumerate((documents[:3], documents[3:])):
        name = f"data-0000{k}-of-00002.arrow"
        table = pa.table({"text": chunk, "id": list(range(len(chunk)))})
        with (
            pa.OSFile(str(directory / name), "wb") as sink,
            pa.ipc.new_stream(sink, table.schema) as writer,
        ):
            writer.write_table(table)
        names.append({"filename": name})
    (directory / "state.json").write_text(json.dumps({"_data_files": names}))
    (directory / "dataset_info.json").write_text("{}")
    return directory


@pytest.fixture
def kinds(tmp_path) -> dict[str, Path]:
    data = jsonl_bytes()
    compressor = zstandard.ZstdCompressor()
    paths = {
        "jsonl": tmp_path / "plain.jsonl",
        "gzip": tmp_path / "a.jsonl.gz",
        "zstd": tmp_path / "a.jsonl.zst",
        "zstd frames": tmp_path / "frames.jsonl.zst",
        "json lines": tmp_path / "lines.json",
        "gzip, no suffix": tmp_path / "mystery.data",
        "parquet": tmp_path / "a.parquet",
        "hf": tmp_path / "hf_dataset",
    }
    paths["jsonl"].write_bytes(data)
    paths["gzip"].write_bytes(gzip.compress(data))
    paths["zstd"].write_bytes(compressor.compress(data))
    half = len(data) // 2
    paths["zstd frames"].write_bytes(
        compressor.compress(data[:half]) + compressor.compress(data[half:])
    )
    paths["json lines"].write_bytes(data)
    paths["gzip, no suffix"].write_bytes(gzip.compress(data))
    pq.write_table(pa.table({"text": DOCUMENTS}), paths["parquet"], row_group_size=2)
    write_hf_dataset(paths["hf"], DOCUMENTS)
    return paths


@pytest.mark.parametrize(
    "kind", ["gzip", "zstd", "zstd frames", "json lines", "gzip, no suffix", "parquet", "hf"]
)
def test_every_kind_yields_the_documents_of_plain_json_lines(kinds, kind):
    options = {"input_format": "jsonl"} if kind == "gzip, no suffix" else {}
    assert all_documents(str(kinds[kind]), **options) == all_documents(str(kinds["jsonl"]))
    assert all_documents(str(kinds["jsonl"])) == DOCUMENTS


def test_prepared_kinds_give_the_same_tokens(tmp_path, kinds):
    reference = prepare_corpus([str(kinds["jsonl"])], str(tmp_path / "ref"))
    for kind in ("zstd", "parquet", "hf"):
        index = prepare_corpus([str(kinds[kind])], str(tmp_path / kind))
        assert index["tokens"] == reference["tokens"], kind
        assert (tmp_path / kind / "lengths.npy").read_bytes() == (
            tmp_path / "ref" / "lengths.npy"
        ).read_bytes()


def test_plain_text_and_json_lines_match_the_text_file_source(tmp_path):
    text = "one\r\n\n  \nzwei ü\nlast line without newline"
    (tmp_path / "a.txt").write_text(text)
    (tmp_path / "b.jsonl").write_bytes(jsonl_bytes())
    for name in ("a.txt", "b.jsonl"):
        source = TextFileSource(str(tmp_path / name))
        expected = [source[i]["tokens"].tolist() for i in range(len(source))]
        index = prepare_corpus([str(tmp_path / name)], str(tmp_path / f"out-{name}"))
        prepared = ArrayRecordSource(str(tmp_path / f"out-{name}" / "*.array_record"))
        assert [prepared[i]["tokens"].tolist() for i in range(len(prepared))] == expected
        assert index["documents"] == len(expected)


@pytest.mark.parametrize("part_bytes", [1, 7, 20, 33, 100, 10_000])
def test_parts_of_a_file_yield_its_documents_once_each(tmp_path, part_bytes):
    lines = [f"line {i} " + "y" * (i * 7 % 23) for i in range(40)]
    (tmp_path / "a.txt").write_text("\n".join(lines) + "\n")
    parts = find_inputs([str(tmp_path / "a.txt")], part_bytes=part_bytes)
    assert [d for p in parts for d in read_documents(p)] == lines
    (tmp_path / "b.jsonl").write_bytes(jsonl_bytes(lines[:-1] + ["{bad"]))
    (tmp_path / "b.jsonl").write_bytes(jsonl_bytes(lines[:-1]) + b"{bad\n")
    with pytest.raises(DataReadError, match=r"line 40 of .*b\.jsonl"):
        for part in find_inputs([str(tmp_path / "b.jsonl")], part_bytes=part_bytes):
            list(read_documents(part))


def test_parquet_parts_are_runs_of_row_groups(tmp_path):
    table = pa.table({"tokens": [list(range(i, i + i % 5)) for i in range(50)]})
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=10)
    parts = find_inputs([str(tmp_path / "t.parquet")], part_bytes=1)
    assert [(p.start, p.stop) for p in parts] == [(k, k + 1) for k in range(5)]
    documents = [d.tolist() for p in parts for d in read_documents(p, field="tokens")]
    assert documents == table.column("tokens").to_pylist()


# ---------------------------------------------------------------- bad inputs


def test_a_missing_or_mistyped_column_is_named(tmp_path):
    pq.write_table(pa.table({"body": ["a"], "n": [1]}), tmp_path / "a.parquet")
    with pytest.raises(DataConfigError, match=r"--field='text' is not a column .*\['body', 'n'\]"):
        all_documents(str(tmp_path / "a.parquet"))
    with pytest.raises(DataConfigError, match=r"--field='n' .* has type int64; .*string column"):
        all_documents(str(tmp_path / "a.parquet"), field="n")


@pytest.mark.parametrize("compression", ["gzip", "zstd"])
def test_a_truncated_stream_is_an_error_naming_the_file(tmp_path, compression):
    data = jsonl_bytes(DOCUMENTS * 2000)
    packed = gzip.compress(data) if compression == "gzip" else zstandard.compress(data)
    path = tmp_path / f"cut.jsonl.{'gz' if compression == 'gzip' else 'zst'}"
    path.write_bytes(packed[: len(packed) // 2])
    with pytest.raises(DataReadError, match=rf"cut\.jsonl.* truncated {compression}|truncated"):
        all_documents(str(path))
    with pytest.raises(DataReadError, match=r"cut\.jsonl"):
        prepare_corpus([str(path)], str(tmp_path / "out"), skip_bad_lines=True)


def test_unsupported_files_are_named_with_what_is_read(tmp_path):
    (tmp_path / "img.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(100))
    (tmp_path / "a.jsonl.bz2").write_bytes(b"BZh91AY&SY" + bytes(50))
    (tmp_path / "blob.txt").write_bytes(b"abc\x00\x01\x02" * 10)
    for name, expected in [
        ("img.png", "a PNG image"),
        ("a.jsonl.bz2", "bzip2-compressed"),
        ("blob.txt", "NUL bytes"),
    ]:
        with pytest.raises(DataConfigError, match=rf"{expected}.*supported: text and JSON lines"):
            find_inputs([str(tmp_path / name)])


def test_a_dataset_dict_or_a_plain_directory_is_refused(tmp_path):
    (tmp_path / "dd").mkdir()
    (tmp_path / "dd" / "dataset_dict.json").write_text('{"splits": ["train", "test"]}')
    with pytest.raises(DataConfigError, match=r"DatasetDict with splits \['train', 'test'\]"):
        find_inputs([str(tmp_path / "dd")])
    (tmp_path / "plain").mkdir()
    with pytest.raises(DataConfigError, match=r"no state.json\); pass its files"):
        find_inputs([str(tmp_path / "plain")])


def test_bad_lines_are_skipped_and_counted_only_when_asked(tmp_path):
    (tmp_path / "a.jsonl").write_bytes(b'{"text": "ok"}\n{"text": 3}\n\xff\xfe\n{"t": "x"}\n')
    (part,) = find_inputs([str(tmp_path / "a.jsonl")])
    with pytest.raises(DataReadError, match=r"line 2 of .*a\.jsonl.*not a string"):
        list(read_documents(part))
    skipped = SkippedLines()
    assert list(read_documents(part, skip_bad_lines=True, skipped=skipped)) == ["ok"]
    assert skipped.count == 3 and "line 3" in skipped.examples[1]


def test_a_compressed_file_in_a_text_source_points_to_prepare(tmp_path):
    (tmp_path / "a.jsonl.gz").write_bytes(gzip.compress(jsonl_bytes()))
    with pytest.raises(DataConfigError, match=r"gzip-compressed.*xlstm-data prepare"):
        TextFileSource(str(tmp_path / "a.jsonl.gz"))
