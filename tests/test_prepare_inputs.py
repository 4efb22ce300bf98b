"""`prepare`'s inputs: every kind yields the documents plain JSON lines (and `TextFileSource`)
yield, parts of a file yield its documents once each with true line numbers, cut-off data is an
error, and every input that is not read is refused by name."""

from __future__ import annotations

import bz2
import functools
import gzip
import io
import json
import lzma
import re
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from xlstm_data.errors import DataConfigError, DataReadError
from xlstm_data.prepare.corpus import prepare_corpus as prepare_any_layout
from xlstm_data.prepare.inputs import (
    INPUT_FORMATS,
    InputPart,
    SkippedLines,
    find_inputs,
    read_documents,
)
from xlstm_data.sources import ArrayRecordSource, TextFileSource
from xlstm_data.sources.tokenizers import ByteTokenizer

# These tests read the ArrayRecord layout; tests/test_flat_layout.py covers the flat default.
prepare_corpus = functools.partial(prepare_any_layout, layout="array_record")

BYTES = ByteTokenizer()
DOCUMENTS = [
    "first",
    "zweites Dokument ü",
    "",  # an empty text is a document (its line is not blank)
    "  spaced  ",
    "tab\there",
    "東京 🚀",
    "line\nbreak inside",
    "x" * 300,
    "last",
]
# Plain JSON lines as found in the wild: CRLF, blank lines, a last line without a newline.
JSONL = (
    "\r\n".join(
        json.dumps({"text": d}, ensure_ascii=i % 2 == 0) for i, d in enumerate(DOCUMENTS[:4])
    )
    + "\r\n\n   \r\n\t\n"
    + "\n".join(json.dumps({"text": d, "id": i}) for i, d in enumerate(DOCUMENTS[4:]))
).encode()
TEXT = b"one\r\n\n  \nzwei \xc3\xbc\r\r\n\r\n\t\nthree\rstill three\n\x0c\nlast without newline"


def documents(pattern, input_format="auto", field="text", unit="line", part_bytes=256 << 20):
    """Every document of the inputs, token arrays as lists."""
    out = []
    for part in find_inputs([str(pattern)], input_format, unit=unit, part_bytes=part_bytes):
        for document in read_documents(part, field=field, unit=unit):
            out.append(document.tolist() if isinstance(document, np.ndarray) else document)
    return out


def source_texts(path, **options) -> list[str]:
    source = TextFileSource(str(path), **options)
    return [BYTES.decode(source[i]["tokens"]) for i in range(len(source))]


def zstd_frames(data: bytes, pieces: int = 3) -> bytes:
    step = -(-len(data) // pieces)
    compressor = zstandard.ZstdCompressor(write_checksum=True)
    return b"".join(compressor.compress(data[i : i + step]) for i in range(0, len(data), step))


def write_stream(path: Path, table: pa.Table, max_chunksize: int | None = None) -> None:
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=max_chunksize)


def write_hf_dataset(directory: Path, table: pa.Table) -> Path:
    """What `datasets.save_to_disk` writes: Arrow stream files, listed in state.json."""
    directory.mkdir(parents=True)
    half = table.num_rows // 2
    names = []
    for k, piece in enumerate((table.slice(0, half), table.slice(half))):
        names.append(f"data-{k:05d}-of-00002.arrow")
        write_stream(directory / names[-1], piece, max_chunksize=2)
    # Listed out of name order: state.json's order is the order read.
    state = {"_data_files": [{"filename": n} for n in names], "_fingerprint": "f"}
    (directory / "state.json").write_text(json.dumps(state))
    (directory / "dataset_info.json").write_text(json.dumps({"features": {}}))
    return directory


def token_lists(texts) -> list[list[int]]:
    return [BYTES.encode(t).tolist() for t in texts]


@pytest.fixture(scope="module")
def kinds(tmp_path_factory) -> dict[str, tuple[Path, dict]]:
    """The corpus DOCUMENTS in every kind read: name -> (path, find/read options)."""
    root = tmp_path_factory.mktemp("kinds")
    table = pa.table(
        {
            "id": list(range(len(DOCUMENTS))),
            "text": DOCUMENTS,
            "tokens": pa.array(token_lists(DOCUMENTS), pa.list_(pa.int32())),
        }
    )
    files = {
        "plain.jsonl": JSONL,
        "a.jsonl.gz": gzip.compress(JSONL),
        "a.jsonl.zst": zstandard.ZstdCompressor().compress(JSONL),
        "frames.jsonl.zst": zstd_frames(JSONL),
        "lines.json": JSONL,
        "lines.json.gz": gzip.compress(JSONL),
        "gzip-named.jsonl": gzip.compress(JSONL),  # the suffix does not say gzip
        "mystery.data": gzip.compress(JSONL),  # nor does anything say JSON lines
        "not-gzip.jsonl.gz": JSONL,  # the suffix says gzip, the bytes do not
    }
    for name, data in files.items():
        (root / name).write_bytes(data)
    pq.write_table(table, root / "a.parquet", row_group_size=2)
    large = pa.table(
        {
            "text": pa.array(DOCUMENTS, pa.large_string()),
            "tokens": pa.array(token_lists(DOCUMENTS), pa.large_list(pa.int64())),
        }
    )
    pq.write_table(large, root / "large.parquet", row_group_size=4)
    write_hf_dataset(root / "hf", table)
    with (
        pa.OSFile(str(root / "file-format.arrow"), "wb") as sink,
        pa.ipc.new_file(sink, table.schema) as writer,
    ):
        writer.write_table(table, max_chunksize=3)
    kinds = {name: (root / name, {}) for name in files}
    kinds["mystery.data"] = (root / "mystery.data", {"input_format": "jsonl"})
    for name in ("a.parquet", "large.parquet", "hf", "file-format.arrow"):
        kinds[name] = (root / name, {})
        kinds[f"{name} tokens"] = (root / name, {"field": "tokens"})
    return kinds


def test_plain_json_lines_are_the_documents_a_text_source_reads(kinds):
    path, _ = kinds["plain.jsonl"]
    assert documents(path) == DOCUMENTS
    assert source_texts(path) == DOCUMENTS


def test_plain_text_is_read_as_a_text_source_reads_it(tmp_path):
    (tmp_path / "a.txt").write_bytes(TEXT)
    expected = source_texts(tmp_path / "a.txt")
    assert documents(tmp_path / "a.txt") == expected
    assert expected == ["one", "zwei ü", "three\rstill three", "last without newline"]
    # unit="file": each non-empty file is one document, compressed or not.
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "blank.txt").write_bytes(b"\n \n")
    pattern = str(tmp_path / "*.txt")
    expected = source_texts(pattern, unit="file")
    assert documents(pattern, unit="file") == expected == [TEXT.decode(), "\n \n"]
    (tmp_path / "z" / "a.txt.gz").parent.mkdir()
    (tmp_path / "z" / "a.txt.gz").write_bytes(gzip.compress(TEXT))
    assert documents(tmp_path / "z" / "a.txt.gz", unit="file") == [TEXT.decode()]


@pytest.mark.parametrize(
    "kind",
    [
        "a.jsonl.gz",
        "a.jsonl.zst",
        "frames.jsonl.zst",
        "lines.json",
        "lines.json.gz",
        "gzip-named.jsonl",
        "mystery.data",
        "not-gzip.jsonl.gz",
        "a.parquet",
        "large.parquet",
        "hf",
        "file-format.arrow",
    ],
)
def test_every_kind_yields_the_documents_of_plain_json_lines(kinds, kind):
    path, options = kinds[kind]
    assert documents(path, **options) == documents(kinds["plain.jsonl"][0]) == DOCUMENTS
    (part, *_) = find_inputs([str(path)], options.get("input_format", "auto"))
    expected_compression = {".gz": "gzip", ".zst": "zstd"}.get(Path(kind).suffix)
    if kind in ("gzip-named.jsonl", "mystery.data", "lines.json.gz"):
        expected_compression = "gzip"
    if kind == "not-gzip.jsonl.gz":
        expected_compression = None
    assert part.compression == expected_compression


def test_prepared_shards_hold_the_tokens_a_text_source_reads(tmp_path, kinds):
    """Through the whole of `prepare` (tokenize, shard, index), every kind gives the shards
    plain JSON lines give, and those hold what `TextFileSource` reads from the JSON lines."""
    plain, _ = kinds["plain.jsonl"]
    source = TextFileSource(str(plain), jsonl_field="text")
    expected = [source[i]["tokens"].tolist() for i in range(len(source))]
    reference = tmp_path / "reference"
    prepare_corpus([str(plain)], str(reference))
    prepared = ArrayRecordSource(str(reference / "*.array_record"))
    assert [prepared[i]["tokens"].tolist() for i in range(len(prepared))] == expected
    for kind in ("frames.jsonl.zst", "mystery.data", "large.parquet tokens", "hf"):
        path, options = kinds[kind]
        out = tmp_path / kind.replace(" ", "-")
        prepare_corpus([str(path)], str(out), num_shards=1, **options)
        for name in ("lengths.npy", "shard-00000-of-00001.array_record"):
            assert (out / name).read_bytes() == (reference / name).read_bytes(), (kind, name)


@pytest.mark.parametrize("kind", ["a.parquet", "large.parquet", "hf", "file-format.arrow"])
def test_token_columns_yield_the_ids_of_the_text(kinds, kind):
    path, _ = kinds[f"{kind} tokens"]
    assert documents(path, field="tokens") == token_lists(DOCUMENTS)
    found = [d for p in find_inputs([str(path)]) for d in read_documents(p, field="tokens")]
    assert all(isinstance(d, np.ndarray) and d.ndim == 1 and d.dtype.kind == "i" for d in found)


def test_kinds_and_parts_as_found(kinds):
    hf = find_inputs([str(kinds["hf"][0])])
    assert [Path(p.path).name for p in hf] == [
        "data-00000-of-00002.arrow",
        "data-00001-of-00002.arrow",
    ]
    assert {(p.kind, p.compression, p.part, p.parts, p.start, p.stop) for p in hf} == {
        ("arrow", None, 0, 1, 0, -1)
    }
    (zst,) = find_inputs([str(kinds["frames.jsonl.zst"][0])], part_bytes=1)
    assert (zst.kind, zst.compression, zst.parts, zst.start, zst.stop) == (
        "jsonl",
        "zstd",
        1,
        0,
        -1,
    )
    parquet = find_inputs([str(kinds["a.parquet"][0])], part_bytes=1)
    assert [(p.start, p.stop) for p in parquet] == [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)]
    assert [(p.part, p.parts) for p in parquet] == [(k, 5) for k in range(5)]
    assert [(p.start, p.stop) for p in find_inputs([str(kinds["a.parquet"][0])])] == [(0, 5)]
    # Patterns in the order given, each one's matches sorted, a file found twice read once.
    root = kinds["plain.jsonl"][0].parent
    found = find_inputs([str(root / "*.zst"), str(root / "plain.jsonl"), str(root / "a.*")])
    assert [Path(p.path).name for p in found] == [
        "a.jsonl.zst",
        "frames.jsonl.zst",
        "plain.jsonl",
        "a.jsonl.gz",
        *["a.parquet"],
    ]


def test_token_arrays(tmp_path):
    np.save(tmp_path / "one.npy", np.arange(5, dtype=np.uint16))
    np.save(tmp_path / "rows.npy", np.arange(12, dtype=np.int64).reshape(3, 4))
    np.savez(tmp_path / "many.npz", b=np.array([7, 8]), a=np.array([[1, 2], [3, 4]]))
    assert documents(tmp_path / "one.npy") == [[0, 1, 2, 3, 4]]
    assert documents(tmp_path / "rows.npy") == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert documents(tmp_path / "many.npz") == [[7, 8], [1, 2], [3, 4]]  # in stored order
    assert {p.kind for p in find_inputs([str(tmp_path / "*")])} == {"tokens"}
    np.save(tmp_path / "floats.npy", np.ones(3))
    with pytest.raises(DataReadError, match=r"floats\.npy.* dtype float64 .*integer arrays"):
        documents(tmp_path / "floats.npy")


# ---------------------------------------------------------------- parts


LINES = [f"line {i} " + "y" * (i * 7 % 23) for i in range(60)]
for _i in (3, 17, 40):
    LINES[_i] = ""  # blank lines are skipped, and still counted as lines


@pytest.mark.parametrize("part_bytes", [1, 2, 7, 15, 16, 17, 100, 593, 1000, 10**9])
def test_the_parts_of_a_file_yield_its_documents_once_each_in_order(tmp_path, part_bytes):
    text = ("\r\n".join(LINES[:30]) + "\n" + "\n".join(LINES[30:])).encode()
    (tmp_path / "a.txt").write_bytes(text)
    jsonl = "\n".join(json.dumps({"text": t}) if t else "" for t in LINES).encode()
    (tmp_path / "b.jsonl").write_bytes(jsonl)
    for name, size in (("a.txt", len(text)), ("b.jsonl", len(jsonl))):
        parts = find_inputs([str(tmp_path / name)], part_bytes=part_bytes)
        assert len(parts) == -(-size // part_bytes)
        assert [(p.start, p.stop) for p in parts] == [
            (k * part_bytes, min(size, (k + 1) * part_bytes)) for k in range(len(parts))
        ]
        whole = [d for p in parts for d in read_documents(p)]
        assert whole == [line for line in LINES if line]
    # A bad line in a later part is named by its line number in the file.
    bad = jsonl.replace(json.dumps({"text": LINES[52]}).encode(), b'{"text": broken}')
    (tmp_path / "b.jsonl").write_bytes(bad)
    parts = find_inputs([str(tmp_path / "b.jsonl")], part_bytes=part_bytes)
    with pytest.raises(DataReadError, match=r"^line 53 of .*b\.jsonl'?: is not valid JSON"):
        for part in parts:
            list(read_documents(part))
    skipped = SkippedLines()
    kept = [d for p in parts for d in read_documents(p, skip_bad_lines=True, skipped=skipped)]
    assert kept == [line for k, line in enumerate(LINES) if line and k != 52]
    assert skipped.count == 1 and skipped.examples[0].startswith("line 53 of ")


def test_a_line_belongs_to_the_part_its_first_byte_is_in(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"aaaa\nbbbb\ncccc\n")
    parts = find_inputs([str(tmp_path / "a.txt")], part_bytes=5)
    assert [list(read_documents(p)) for p in parts] == [["aaaa"], ["bbbb"], ["cccc"]]
    parts = find_inputs([str(tmp_path / "a.txt")], part_bytes=6)
    assert [list(read_documents(p)) for p in parts] == [["aaaa", "bbbb"], ["cccc"], []]
    # A part in the middle of a line takes none of it.
    part = InputPart(str(tmp_path / "a.txt"), "text", None, 1, 3, 6, 9)
    assert list(read_documents(part)) == []


def test_parquet_parts_are_runs_of_row_groups_with_true_row_numbers(tmp_path):
    rows = [list(range(i, i + i % 5)) for i in range(50)]
    rows[37] = None
    table = pa.table({"tokens": pa.array(rows, pa.list_(pa.int32())), "pad": ["x" * 50] * 50})
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=10)
    metadata = pq.ParquetFile(tmp_path / "t.parquet").metadata
    group = metadata.row_group(0).total_byte_size
    expected = [r for r in rows if r is not None]
    for part_bytes, runs in [
        (1, [(k, k + 1) for k in range(5)]),
        (2 * group, [(0, 2), (2, 4), (4, 5)]),
        (10**9, [(0, 5)]),
    ]:
        parts = find_inputs([str(tmp_path / "t.parquet")], part_bytes=part_bytes)
        assert [(p.start, p.stop) for p in parts] == runs
        with pytest.raises(DataReadError, match=r"row 37 \(counting from 0\) of .*t\.parquet"):
            for part in parts:
                list(read_documents(part, field="tokens"))
        skipped = SkippedLines()
        found = [
            d.tolist()
            for p in parts
            for d in read_documents(p, field="tokens", skip_bad_lines=True, skipped=skipped)
        ]
        assert found == expected
        assert (
            skipped.count == 1 and "row 37" in skipped.examples[0] and "null" in skipped.examples[0]
        )


# ---------------------------------------------------------------- cut-off and damaged data


@pytest.mark.parametrize("compression", ["gzip", "zstd", "zstd frames"])
def test_a_truncated_stream_is_an_error_naming_the_file_and_line(tmp_path, compression):
    lines = [json.dumps({"text": f"document {i} " + "z" * (i % 50)}) for i in range(20000)]
    data = "\n".join(lines).encode() + b"\n"
    packed = {
        "gzip": gzip.compress,
        "zstd": zstandard.ZstdCompressor().compress,
        "zstd frames": zstd_frames,
    }[compression](data)
    name = "cut.jsonl.gz" if compression == "gzip" else "cut.jsonl.zst"
    for cut in (len(packed) // 3, len(packed) - 1):
        (tmp_path / name).write_bytes(packed[:cut])
        (part,) = find_inputs([str(tmp_path / name)])
        read: list[str] = []
        with pytest.raises(DataReadError) as error:
            for document in read_documents(part, skip_bad_lines=True):  # never skipped
                read.append(document)
        message = str(error.value)
        kind = compression.split()[0]
        assert re.search(rf"cut\.jsonl\.\w+' is a truncated {kind} stream", message), message
        line = int(re.search(r"in line (\d+)", message).group(1))
        assert line == len(read) + 1 and 0 < len(read) <= len(lines)
        assert re.search(r"ends after (\d+) decompressed bytes", message)


def test_a_zstd_file_cut_anywhere_is_an_error(tmp_path):
    data = "".join(json.dumps({"text": f"d{i}"}) + "\n" for i in range(300)).encode()
    packed = zstd_frames(data, pieces=3)
    path = tmp_path / "a.jsonl.zst"
    for cut in list(range(5, 40)) + list(range(40, len(packed), 37)):
        path.write_bytes(packed[:cut])
        with pytest.raises(DataReadError, match=r"a\.jsonl\.zst' is a (truncated|damaged) zstd"):
            documents(path)
    path.write_bytes(packed + packed)  # two copies, six frames: complete
    assert len(documents(path)) == 600


def test_a_damaged_gzip_stream_is_an_error(tmp_path):
    packed = bytearray(gzip.compress(JSONL * 50))
    packed[len(packed) // 2] ^= 0xFF
    (tmp_path / "a.jsonl.gz").write_bytes(bytes(packed))
    with pytest.raises(DataReadError, match=r"a\.jsonl\.gz' is a (damaged|truncated) gzip stream"):
        documents(tmp_path / "a.jsonl.gz")


def test_a_truncated_arrow_stream_is_an_error(tmp_path):
    table = pa.table({"text": [f"row {i}" for i in range(100)]})
    write_stream(tmp_path / "full.arrow", table, max_chunksize=10)
    data = (tmp_path / "full.arrow").read_bytes()
    assert documents(tmp_path / "full.arrow") == table.column("text").to_pylist()
    (tmp_path / "no-end.arrow").write_bytes(data[:-8])  # cut at a batch boundary
    with pytest.raises(DataReadError, match=r"no-end\.arrow' is a truncated Arrow stream"):
        documents(tmp_path / "no-end.arrow")
    (tmp_path / "cut.arrow").write_bytes(data[: len(data) // 2])
    with pytest.raises(DataReadError, match=r"cut\.arrow' cannot be read after row \d+"):
        documents(tmp_path / "cut.arrow")


# ---------------------------------------------------------------- bad lines


def test_bad_lines_stop_the_read_or_are_skipped_and_counted(tmp_path):
    lines = [
        b'{"text": "ok"}',
        b'{"text": broken',
        b"[1, 2]",
        b'{"body": "x"}',
        b'{"text": 3}',
        b'{"text": null}',
        b'{"text": "caf\xe9"}',
        b'{"text": "lone \\ud800 surrogate"}',
        b'{"text": "paired \\ud83d\\ude80 fine"}',
    ]
    (tmp_path / "a.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    (part,) = find_inputs([str(tmp_path / "a.jsonl")])
    with pytest.raises(DataReadError, match=r"^line 2 of .*a\.jsonl'?: is not valid JSON"):
        list(read_documents(part))
    skipped = SkippedLines()
    kept = list(read_documents(part, skip_bad_lines=True, skipped=skipped))
    assert kept == ["ok", "paired 🚀 fine"]
    assert skipped.count == 7 and len(skipped.examples) == 3
    assert [e.split(":")[0] for e in skipped.examples] == [
        f"line {n} of {str(tmp_path / 'a.jsonl')!r}" for n in (2, 3, 4)
    ]
    assert "JSON list" in skipped.examples[1] and "no 'text' key" in skipped.examples[2]
    # Each kind of bad line, alone, is named with its line.
    for number, expected in [
        (5, r"JSON field 'text' is a int, not a string"),
        (6, r"is a NoneType, not a string"),
        (7, r"is not valid UTF-8 text \(byte 13"),
        (8, r"unpaired surrogate"),
    ]:
        (tmp_path / "b.jsonl").write_bytes(lines[0] + b"\n" + lines[number - 1] + b"\n")
        with pytest.raises(DataReadError, match=rf"^line 2 of .*b\.jsonl'?: .*{expected}"):
            documents(tmp_path / "b.jsonl")


def test_a_line_of_text_that_is_not_utf8_is_named(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"fine\n\nlatin \xe9\n")
    with pytest.raises(DataReadError, match=r"^line 3 of .*a\.txt'?: is not valid UTF-8 text"):
        documents(tmp_path / "a.txt")
    skipped = SkippedLines()
    (part,) = find_inputs([str(tmp_path / "a.txt")])
    assert list(read_documents(part, skip_bad_lines=True, skipped=skipped)) == ["fine"]
    assert skipped.count == 1


def test_parquet_nulls_and_null_token_ids_are_bad_rows(tmp_path):
    pq.write_table(
        pa.table(
            {
                "text": ["a", None, "", "c"],
                "tokens": pa.array([[1], [2, None], None, []], pa.list_(pa.int64())),
            }
        ),
        tmp_path / "a.parquet",
    )
    with pytest.raises(DataReadError, match=r"row 1 \(counting from 0\) of .*'text' is null"):
        documents(tmp_path / "a.parquet")
    (part,) = find_inputs([str(tmp_path / "a.parquet")])
    skipped = SkippedLines()
    assert list(read_documents(part, skip_bad_lines=True, skipped=skipped)) == ["a", "", "c"]
    tokens = list(read_documents(part, field="tokens", skip_bad_lines=True, skipped=skipped))
    assert [t.tolist() for t in tokens] == [[1], []]
    assert skipped.count == 3 and "holds a null token id" in skipped.examples[1]


# ---------------------------------------------------------------- inputs that are not read


def test_a_missing_or_mistyped_column_is_named(tmp_path):
    pq.write_table(
        pa.table({"body": ["a"], "n": [1], "raw": [b"x"], "floats": [[1.5]]}),
        tmp_path / "a.parquet",
    )
    path = tmp_path / "a.parquet"
    with pytest.raises(
        DataConfigError, match=r"--field='text' is not a column .*\['body', 'n', 'raw', 'floats'\]"
    ):
        documents(path)
    for field, type_name in (
        ("n", "int64"),
        ("raw", "binary"),
        ("floats", "list<element: double>"),
    ):
        with pytest.raises(DataConfigError) as error:
            documents(path, field=field)
        message = str(error.value)
        assert f"--field={field!r} of {str(path)!r} has type {type_name};" in message
        assert "string or large_string" in message and "list or large_list of int" in message


def test_unreadable_files_are_refused_saying_what_they_look_like(tmp_path):
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        info = tarfile.TarInfo("doc.txt")
        info.size = 5
        tar.addfile(info, io.BytesIO(b"hello"))
    with zipfile.ZipFile(tmp_path / "docs.zip", "w") as z:
        z.writestr("doc.txt", "hello")
    files = {
        "img.png": (b"\x89PNG\r\n\x1a\n" + bytes(100), "a PNG image"),
        "corpus.tar": (archive.getvalue(), "a tar archive"),
        "corpus.tar.gz": (gzip.compress(archive.getvalue()), "gzip-compressed a tar archive"),
        "a.jsonl.bz2": (bz2.compress(JSONL), "bzip2-compressed data"),
        "a.jsonl.xz": (lzma.compress(JSONL), "xz-compressed data"),
        "wide.txt": ("hello".encode("utf-16"), "UTF-16 text"),
        "blob.txt": (b"abc\x00\x01\x02" * 10, "holds NUL bytes"),
        "ids.npy.gz": (b"", "gzip-compressed a numpy token array; decompress it first"),
        "docs.zip": ((tmp_path / "docs.zip").read_bytes(), r"a zip archive \(members such as"),
        "a.jsonl.lz4": (b"plain text, but named lz4", "named like lz4-compressed"),
        "x.parquet": (b"not parquet at all", "named like a parquet file, but its bytes are not"),
    }
    npy = io.BytesIO()
    np.save(npy, np.arange(3))
    files["ids.npy.gz"] = (gzip.compress(npy.getvalue()), files["ids.npy.gz"][1])
    for name, (data, expected) in files.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(DataConfigError) as error:
            find_inputs([str(tmp_path / name)])
        message = str(error.value)
        assert repr(str(tmp_path / name)) in message, name
        assert re.search(expected, message), (name, message)
        assert "supported: text and JSON lines" in message, name


def test_a_json_document_is_refused_and_a_blank_json_file_has_no_documents(tmp_path):
    (tmp_path / "doc.json").write_text(json.dumps([{"text": "a"}, {"text": "b"}], indent=2))
    with pytest.raises(DataConfigError, match=r"doc\.json.*not a JSON object.*--format=text"):
        find_inputs([str(tmp_path / "doc.json")])
    assert documents(tmp_path / "doc.json", input_format="text")[0] == "["
    (tmp_path / "pretty.json").write_text(json.dumps({"text": "a"}, indent=2))
    with pytest.raises(DataConfigError, match=r"pretty\.json.*--format=text"):
        find_inputs([str(tmp_path / "pretty.json")])
    (tmp_path / "blank.json").write_text("\n\n")
    assert [p.kind for p in find_inputs([str(tmp_path / "blank.json")])] == ["jsonl"]
    assert documents(tmp_path / "blank.json") == []


def test_a_forced_format_is_checked_against_the_bytes(tmp_path, kinds):
    parquet = str(kinds["a.parquet"][0])
    with pytest.raises(
        DataConfigError, match=r"--format=text, but INPUT .*a\.parquet' is a Parquet"
    ):
        find_inputs([parquet], "text")
    with pytest.raises(
        DataConfigError, match=r"--format=parquet, but INPUT .*plain\.jsonl' is not"
    ):
        find_inputs([str(kinds["plain.jsonl"][0])], "parquet")
    with pytest.raises(DataConfigError, match=r"HuggingFace dataset directory .*--format=jsonl"):
        find_inputs([str(kinds["hf"][0])], "jsonl")
    with pytest.raises(
        DataConfigError, match=r"--unit=file cannot read .*plain\.jsonl', JSON lines"
    ):
        find_inputs([str(kinds["plain.jsonl"][0])], unit="file")
    # Forced text: a .json file's characters, braces and all; compression still from the bytes.
    (text,) = find_inputs([str(kinds["lines.json.gz"][0])], "text")
    assert (text.kind, text.compression) == ("text", "gzip")
    assert next(iter(read_documents(text))) == json.dumps({"text": DOCUMENTS[0]})


def test_directories(tmp_path):
    (tmp_path / "dd" / "train").mkdir(parents=True)
    (tmp_path / "dd" / "dataset_dict.json").write_text('{"splits": ["train", "test"]}')
    with pytest.raises(DataConfigError) as error:
        find_inputs([str(tmp_path / "dd")])
    message = str(error.value)
    assert "DatasetDict with splits ['train', 'test']" in message
    assert repr(str(tmp_path / "dd" / "train")) in message
    (tmp_path / "plain").mkdir()
    with pytest.raises(
        DataConfigError, match=r"no state\.json\); pass its files, e\.g\. .*plain/\*"
    ):
        find_inputs([str(tmp_path / "plain")])
    table = pa.table({"text": ["a", "b", "c"]})
    write_hf_dataset(tmp_path / "hf", table)
    (tmp_path / "hf" / "data-00001-of-00002.arrow").unlink()
    with pytest.raises(
        DataConfigError, match=r"lists 'data-00001-of-00002\.arrow', which does not"
    ):
        find_inputs([str(tmp_path / "hf")])


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ({"input_format": "csv"}, r"--format='csv' is not an input format; valid formats: auto, "),
        ({"unit": "paragraph"}, r"--unit='paragraph' is not a unit; valid units: line, file"),
        ({"part_bytes": 0}, r"part_bytes=0 is invalid; pass an integer number of bytes >= 1"),
        ({"patterns": []}, r"no input given"),
        ({"patterns": ["nowhere/*.jsonl"]}, r"INPUT='nowhere/\*\.jsonl' matches no file"),
    ],
)
def test_bad_arguments_are_named_before_reading(arguments, expected):
    arguments = {"patterns": ["unused"], **arguments}
    with pytest.raises(DataConfigError, match=expected):
        find_inputs(arguments.pop("patterns"), **arguments)
    assert INPUT_FORMATS == ("auto", "text", "jsonl", "parquet", "arrow", "tokens")


@pytest.mark.parametrize("compression", ["gzip", "zstd"])
def test_a_compressed_file_in_a_text_source_points_to_prepare(tmp_path, compression):
    path = tmp_path / "a.jsonl"
    path.write_bytes(gzip.compress(JSONL) if compression == "gzip" else zstandard.compress(JSONL))
    for unit in ("line", "file"):
        with pytest.raises(DataConfigError) as error:
            TextFileSource(str(path), unit=unit, jsonl_field="text" if unit == "line" else None)
        message = str(error.value)
        assert f"file {str(path)!r} is {compression}-compressed" in message
        assert "xlstm-data prepare" in message and "kind='array_record'" in message


# ---------------------------------------------------------------- remote inputs


def test_inputs_on_a_remote_filesystem(memory_gs, kinds):
    from etils import epath

    memory_gs.pipe("gs://bucket/x", b"hello")
    assert epath.Path("gs://bucket/x").read_bytes() == b"hello"
    memory_gs.pipe("gs://bucket/in/b.jsonl.gz", gzip.compress(JSONL))
    memory_gs.pipe("gs://bucket/in/a.jsonl.gz", zstd_frames(JSONL))  # zstd, named .gz
    memory_gs.pipe("gs://bucket/in/skip.txt", b"not matched")
    memory_gs.pipe("gs://bucket/in/sub/c.jsonl.gz", b"in a directory: not matched")
    parts = find_inputs(["gs://bucket/in/*.jsonl.gz"])
    assert [(p.path, p.compression) for p in parts] == [
        ("gs://bucket/in/a.jsonl.gz", "zstd"),
        ("gs://bucket/in/b.jsonl.gz", "gzip"),
    ]
    assert [d for p in parts for d in read_documents(p)] == DOCUMENTS * 2
    # Uncompressed text in byte-range parts, Parquet by row groups, an HF dataset directory.
    memory_gs.pipe("gs://bucket/in/plain.jsonl", JSONL)
    memory_gs.pipe("gs://bucket/in/t.parquet", kinds["a.parquet"][0].read_bytes())
    hf = kinds["hf"][0]
    for file in hf.iterdir():
        memory_gs.pipe(f"gs://bucket/hf/{file.name}", file.read_bytes())
    patterns = ["gs://bucket/in/plain.jsonl", "gs://bucket/in/t.parquet", "gs://bucket/hf"]
    parts = find_inputs(patterns, part_bytes=50)
    assert len(parts) == -(-len(JSONL) // 50) + 5 + 2
    assert [d for p in parts for d in read_documents(p)] == DOCUMENTS * 3
    with pytest.raises(DataConfigError, match=r"INPUT='gs://bucket/none/\*\.jsonl' matches no"):
        find_inputs(["gs://bucket/none/*.jsonl"])
    with pytest.raises(DataConfigError, match=r"INPUT='gs://bucket/i\*' matches no file, only dir"):
        find_inputs(["gs://bucket/i*"])
