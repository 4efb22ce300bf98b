"""Every source kind reports every document's token length without the pipeline reading it.

`lengths()[i] == len(source[i]["tokens"])` for every kind the config builds;
text and JSONL counts are cached on disk, keyed so that a changed file or
another tokenizer never gets a stale answer; ArrayRecord files without a
prepare index refuse, naming the command that writes one.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import pickle
from pathlib import Path

import numpy as np
import pytest

from tests.test_tokenizers import write_byte_bpe
from xlstm_data.cli.inspect_config import _source_counts
from xlstm_data.errors import DataConfigError
from xlstm_data.prepare.corpus import prepare_corpus as prepare_any_layout
from xlstm_data.sources import (
    ArrayRecordSource,
    InMemorySource,
    SyntheticSource,
    TextFileSource,
    lengths_cache,
    write_array_record,
)
from xlstm_data.sources.stdlib_corpus import stdlib_source
from xlstm_data.sources.tokenizers import ByteTokenizer

# These tests read the ArrayRecord layout; tests/test_flat_layout.py covers the flat default.
prepare_corpus = functools.partial(prepare_any_layout, layout="array_record")

LINES = ["first document", "zweites Dokument ü", "", "   ", "third\twith a tab", "x", "東京 🚀"]
ROWS = [{"text": "json one", "id": 1}, {"text": "json two ✓"}, {"text": ""}, {"text": "three"}]


@pytest.fixture(autouse=True)
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "cache"
    monkeypatch.setenv(lengths_cache.CACHE_DIR_ENV, str(directory))
    return directory


@pytest.fixture
def scans(monkeypatch: pytest.MonkeyPatch) -> list[TextFileSource]:
    """The text sources whose files were tokenized to count lengths, in order."""
    calls: list[TextFileSource] = []
    scan = TextFileSource._scan_lengths

    def counted(self: TextFileSource) -> np.ndarray:
        calls.append(self)
        return scan(self)

    monkeypatch.setattr(TextFileSource, "_scan_lengths", counted)
    return calls


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    directory = tmp_path / "raw"
    directory.mkdir()
    (directory / "a.txt").write_text("\n".join(LINES) + "\n")
    (directory / "b.txt").write_text("last line without newline\r\nsecond, CRLF")
    (directory / "c.jsonl").write_text("\n".join(json.dumps(r) for r in ROWS) + "\n")
    return directory


def _read_lengths(source) -> list[int]:
    return [len(source[i]["tokens"]) for i in range(len(source))]


def _check(source) -> np.ndarray:
    assert source.has_lengths()
    lengths = source.lengths()
    assert isinstance(lengths, np.ndarray)
    assert lengths.dtype in (np.int64, np.int32) and lengths.shape == (len(source),)
    assert lengths.tolist() == _read_lengths(source)
    return lengths


def _entries(cache_dir: Path) -> list[Path]:
    directory = cache_dir / "lengths"
    return sorted(directory.glob("*.npy")) if directory.is_dir() else []


# ----------------------------------------------------------------------------
# lengths() equals the documents read, for every kind.
# ----------------------------------------------------------------------------


def test_prepared_array_record(tmp_path, corpus):
    out = tmp_path / "prepared"
    prepare_corpus([str(corpus / "*")], str(out))
    source = ArrayRecordSource(str(out / "*.array_record"))
    lengths = _check(source)
    assert lengths.sum() > 0 and len(lengths) == 5 + 2 + 4
    # A whole prepared directory: its lengths.npy itself, memory-mapped, not an int64 copy.
    assert isinstance(lengths, np.memmap) and lengths.dtype == np.int32
    # Some of its shards: their slices joined.
    some = ArrayRecordSource(sorted(str(p) for p in out.glob("*.array_record"))[1:])
    part = _check(some)
    assert not isinstance(part, np.memmap) and part.tolist() == lengths[-len(part) :].tolist()


@pytest.mark.parametrize("unit", ["line", "file"])
def test_text(corpus, unit, scans):
    source = TextFileSource(str(corpus / "*.txt"), unit=unit)
    assert not scans  # Lazily, on the first lengths() call.
    _check(source)
    assert len(scans) == 1
    source.lengths()
    assert len(scans) == 1  # Cached on the instance.


def test_jsonl(corpus, tmp_path):
    _check(TextFileSource(str(corpus / "c.jsonl")))
    other_key = tmp_path / "rows.txt"
    other_key.write_text("\n".join(json.dumps({"body": r["text"]}) for r in ROWS) + "\n")
    _check(TextFileSource(str(other_key), jsonl_field="body"))
    json_text = TextFileSource(str(corpus / "c.jsonl"), json_as_text=True)
    assert _check(json_text).tolist() != TextFileSource(str(corpus / "c.jsonl")).lengths().tolist()


def test_hf_tokenizer(corpus, tmp_path):
    bpe = write_byte_bpe(tmp_path / "bpe.json")
    lengths = _check(TextFileSource(str(corpus / "*"), tokenizer=str(bpe)))
    assert lengths.tolist() != TextFileSource(str(corpus / "*")).lengths().tolist()


def test_synthetic():
    _check(SyntheticSource(300, mean_length=20, seed=4))


@pytest.mark.parametrize("part", ["code", "docstrings"])
def test_python_stdlib(part):
    _check(stdlib_source(part, max_files=3))


@pytest.mark.parametrize(
    "data",
    [
        [[1, 2, 3], np.arange(5), (), {"tokens": [7]}, "text ü"],
        np.arange(12).reshape(3, 4),
        np.array([np.arange(3), np.arange(0)], dtype=object),
    ],
    ids=["mixed", "2d", "object"],
)
def test_in_memory(data):
    source = InMemorySource(data)
    lengths = _check(source)
    assert source.lengths() is lengths  # Computed once.
    assert not lengths.flags.writeable


# ----------------------------------------------------------------------------
# The on-disk cache of text and JSONL counts.
# ----------------------------------------------------------------------------


def test_a_second_source_reads_the_cache(corpus, cache_dir, scans, monkeypatch):
    first = TextFileSource(str(corpus / "*"))
    expected = first.lengths().tolist()
    (entry,) = _entries(cache_dir)
    assert np.load(entry).tolist() == expected

    def no_scan(self):
        raise AssertionError("the files were tokenized again")

    monkeypatch.setattr(TextFileSource, "_scan_lengths", no_scan)
    second = TextFileSource([str(corpus / "c.jsonl"), str(corpus / "*.txt")])
    assert second.lengths().tolist() == expected
    assert _read_lengths(second) == expected
    assert _entries(cache_dir) == [entry]


def test_a_changed_file_is_scanned_again(corpus, cache_dir, scans):
    path = corpus / "a.txt"
    expected = [len(line.encode()) for line in LINES if line.strip()]
    assert TextFileSource(str(path)).lengths().tolist() == expected
    path.write_text(path.read_text() + "one more\n")
    assert _check(TextFileSource(str(path))).tolist() == [*expected, 8]
    assert len(scans) == 2 and len(_entries(cache_dir)) == 2
    # The same size with other bytes: only the mtime tells.
    stat = path.stat()
    path.write_text(path.read_text().replace("first", "FIRST"))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    _check(TextFileSource(str(path)))
    assert len(scans) == 3 and len(_entries(cache_dir)) == 3


def test_unit_and_tokenizer_have_their_own_entries(corpus, cache_dir, scans, tmp_path):
    pattern = str(corpus / "*.txt")
    bpe = write_byte_bpe(tmp_path / "bpe.json")
    by_line = TextFileSource(pattern).lengths()
    by_file = TextFileSource(pattern, unit="file").lengths()
    by_bpe = TextFileSource(pattern, tokenizer=str(bpe)).lengths()
    assert len(scans) == 3 and len(_entries(cache_dir)) == 3
    assert len(by_line) == 7 and len(by_file) == 2 and by_bpe.sum() < by_line.sum()
    assert TextFileSource(pattern, tokenizer=str(bpe)).lengths().tolist() == by_bpe.tolist()
    assert len(scans) == 3
    # Another tokenizer file (even at the same path) is another tokenizer.
    write_byte_bpe(bpe, vocab_size=300)
    smaller = TextFileSource(pattern, tokenizer=str(bpe))
    assert _check(smaller).sum() > by_bpe.sum()
    assert len(scans) == 4 and len(_entries(cache_dir)) == 4


def test_an_unwritable_cache_dir_keeps_the_lengths_in_memory(
    corpus, tmp_path, monkeypatch, scans, caplog
):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv(lengths_cache.CACHE_DIR_ENV, str(blocker / "cache"))
    source = TextFileSource(str(corpus / "*"))
    with caplog.at_level(logging.WARNING):
        _check(source)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    (kept,) = [r.getMessage() for r in warnings if "in memory" in r.getMessage()]
    assert str(blocker) in kept
    source.lengths()
    TextFileSource(str(corpus / "*")).lengths()
    assert len(scans) == 2  # Once per instance, since nothing was stored.


def test_a_bad_cache_entry_is_recomputed(corpus, cache_dir, scans):
    expected = TextFileSource(str(corpus / "*")).lengths().tolist()
    (entry,) = _entries(cache_dir)
    np.save(entry, np.zeros(3, np.int64))
    assert TextFileSource(str(corpus / "*")).lengths().tolist() == expected
    entry.write_bytes(b"garbage")
    assert TextFileSource(str(corpus / "*")).lengths().tolist() == expected
    entry.write_bytes(b"")  # what a crash between the write and the rename could leave
    assert TextFileSource(str(corpus / "*")).lengths().tolist() == expected
    assert len(scans) == 4
    assert np.load(entry).tolist() == expected


def test_an_entry_is_checked_and_a_narrow_dtype_never_wraps(cache_dir):
    from xlstm_data.sources.lengths_cache import cached_lengths

    parts = {"test": "narrow"}
    computed = []

    def compute():
        computed.append(True)
        return np.array([3, 1, 4], np.int64)

    first = cached_lengths(parts, 3, compute, "t", dtype=np.int32)
    assert first.dtype == np.int32 and first.tolist() == [3, 1, 4]
    assert cached_lengths(parts, 3, compute, "t", dtype=np.int32, check=lambda v: True).tolist()
    assert len(computed) == 1  # read back, found right
    assert cached_lengths(parts, 3, compute, "t", dtype=np.int32, check=lambda v: False).tolist()
    assert len(computed) == 2  # refused by its check: counted again and stored again
    with pytest.raises(ValueError, match="does not fit int32"):
        cached_lengths({"test": "wide"}, 1, lambda: np.array([1 << 33]), "t", dtype=np.int32)


def test_a_custom_tokenizer_is_not_cached_on_disk(corpus, cache_dir, scans):
    class Shouting(ByteTokenizer):
        def encode(self, text):
            return super().encode(text.upper() + "!")

    lengths = _check(TextFileSource(str(corpus / "*"), tokenizer=Shouting()))
    plain = TextFileSource(str(corpus / "*")).lengths()
    assert lengths.tolist() == (plain + 1).tolist()
    assert len(scans) == 2 and len(_entries(cache_dir)) == 1  # Only the byte tokenizer's.


def test_a_file_changed_after_the_source_was_built(corpus, scans):
    from xlstm_data.errors import DataReadError

    source = TextFileSource(str(corpus / "a.txt"))
    (corpus / "a.txt").write_text("other\n")
    with pytest.raises(DataReadError, match=r"a.txt' changed after the source was built"):
        source.lengths()


def test_pickled_sources_carry_no_lengths_and_read_the_cache(corpus, scans):
    source = TextFileSource(str(corpus / "*"))
    expected = source.lengths().tolist()
    state = pickle.dumps(source)
    assert len(state) < 4096
    copy = pickle.loads(state)
    assert copy._token_lengths is None
    assert copy.lengths().tolist() == expected
    assert _read_lengths(copy) == expected
    assert len(scans) == 1


# ----------------------------------------------------------------------------
# ArrayRecord files without a prepare index.
# ----------------------------------------------------------------------------


def test_unprepared_array_record_names_the_prepare_command(tmp_path):
    path = tmp_path / "plain" / "shard.array_record"
    write_array_record(path, [np.arange(3), np.arange(5)])
    source = ArrayRecordSource(str(path))
    assert not source.has_lengths()
    with pytest.raises(DataConfigError) as error:
        source.lengths()
    message = str(error.value)
    assert "xlstm-data prepare INPUT... --output=DIR" in message
    assert str(path) in message and "index.json" in message
    # Callers that only use lengths when there are some do not fail.
    assert _source_counts(source) == (2, 8, True)


def test_text_records_name_the_prepare_command(tmp_path):
    path = tmp_path / "text.array_record"
    write_array_record(path, ["one", "two"])
    source = ArrayRecordSource(str(path), record_format="text")
    assert not source.has_lengths()
    with pytest.raises(DataConfigError, match=r"record_format='text'.*xlstm-data prepare"):
        source.lengths()


def test_a_shard_outside_the_prepared_directory(tmp_path, corpus):
    out = tmp_path / "prepared"
    prepare_corpus([str(corpus / "a.txt")], str(out))
    extra = tmp_path / "extra" / "more.array_record"
    write_array_record(extra, [np.arange(4)])
    source = ArrayRecordSource([str(out / "*.array_record"), str(extra)])
    assert not source.has_lengths()
    with pytest.raises(DataConfigError, match=r"no index.json .* in '[^']*extra'"):
        source.lengths()
