"""Megatron-LM `.bin`/`.idx` corpora train in place (`kind: "megatron"`).

The corpora under `tests/fixtures/megatron/` were written by megatron-core's
own `IndexedDatasetBuilder` (`make_fixture.py`, run in the peers' venv), not
by this package: one uint16 corpus with the end-of-document id appended to
every document and merged from two with `add_index`, one int32 corpus of
documents of several sentences. `documents.npz` holds the documents as they
were given to the builder.
"""

from __future__ import annotations

import json
import mmap
import multiprocessing
import os
import pickle
import re
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import xlstm_data as xd
from tests.helpers import MEGATRON_FIXTURES
from tests.multiprocess import REPO
from xlstm_data.errors import DataConfigError, DataReadError
from xlstm_data.prepare.corpus import prepare_corpus
from xlstm_data.sources.megatron_indexed import MegatronIndexedSource

FIXTURES = MEGATRON_FIXTURES
WEB = str(FIXTURES / "web_text_document")
CODE = str(FIXTURES / "code_text_sentence")
BOOKS = str(FIXTURES / "books_text_document")
EOD = 50256


def _documents(name: str) -> list[np.ndarray]:
    stored = np.load(FIXTURES / "documents.npz")
    return np.split(stored[name], np.cumsum(stored[f"{name}_lengths"])[:-1])


def _copy(tmp_path: Path, prefix: str) -> str:
    for suffix in (".bin", ".idx"):
        shutil.copy(prefix + suffix, tmp_path / (Path(prefix).name + suffix))
    return str(tmp_path / Path(prefix).name)


def _batches(data: dict, steps: int) -> list[dict[str, np.ndarray]]:
    train, evals = xd.iterators_from_config(data, xd.create_mesh())
    for iterator in evals.values():
        iterator.close()
    try:
        return [{k: np.asarray(v) for k, v in next(train).to_dict().items()} for _ in range(steps)]
    finally:
        train.close()


@settings(max_examples=25, deadline=None)
@given(picks=st.lists(st.integers(0, 10**6), min_size=1, max_size=40))
def test_every_document_megatron_core_wrote_reads_back_in_any_order(picks):
    """Both corpora, each document as given to the builder; repeats and negative indices."""
    for source, documents in (
        (MegatronIndexedSource(WEB, end_of_document=EOD), _documents("web")),
        (MegatronIndexedSource(CODE, vocab_size=100_000), _documents("code")),
    ):
        n = len(documents)
        assert source.lengths().tolist() == [len(d) for d in documents]
        index = [p % (2 * n) - n for p in picks]  # in [-n, n)
        for got, i in zip(source.read_many(index), index, strict=True):
            np.testing.assert_array_equal(got, documents[i % n])
            assert not got.flags.writeable
    assert source.token_dtype == np.int32


def test_the_stored_end_of_document_is_part_of_a_document_read_without_end_of_document():
    plain = MegatronIndexedSource(WEB)
    np.testing.assert_array_equal(plain.read_many([3])[0], [*_documents("web")[3], EOD])
    assert plain.token_dtype == np.uint16 and plain.vocab_size == 65536
    with pytest.raises(DataReadError, match="different dtypes"):
        MegatronIndexedSource([WEB, CODE], vocab_size=100_000)


def test_documents_of_several_sentences_read_as_one():
    stored = np.load(FIXTURES / "documents.npz")
    assert (stored["code_sentences"] > 1).any()  # the fixture has such documents
    source = MegatronIndexedSource(CODE, vocab_size=100_000)
    assert len(source) == 25 and source.tokenizer is None
    np.testing.assert_array_equal(source[24]["tokens"], _documents("code")[24])


@pytest.mark.parametrize("block", [1, 2, 3, 7, 1 << 22])
def test_documents_of_several_sentences_are_summed_and_checked_a_block_at_a_time(
    tmp_path, monkeypatch, block
):
    """Lengths summed, sequences checked back to back, whichever block a document's seam is in.

    The sums and the check used to take whole-corpus temporaries (1.6 GB at
    10^8 sentences); each is now a block of the `.idx` at a time.
    """
    from xlstm_data.sources import megatron_indexed

    monkeypatch.setattr(megatron_indexed, "_BLOCK", block)
    documents = _documents("code")
    source = MegatronIndexedSource(CODE, vocab_size=100_000)
    assert source.lengths().dtype == np.int32
    assert source.lengths().tolist() == [len(d) for d in documents]
    for read, document in zip(source.read_many(range(len(source))), documents, strict=True):
        np.testing.assert_array_equal(read, document)
    # The next-to-last sequence moved away from the one before it (the last block).
    prefix = _copy(tmp_path, CODE)
    idx = bytearray(Path(prefix + ".idx").read_bytes())
    sequences = int(np.frombuffer(bytes(idx[18:26]), "<u8")[0])
    at = megatron_indexed._HEADER + 4 * sequences + 8 * (sequences - 2)
    pointer = int(np.frombuffer(bytes(idx[at : at + 8]), "<i8")[0])
    idx[at : at + 8] = struct.pack("<q", pointer + 4)
    Path(prefix + ".idx").write_bytes(bytes(idx))
    moved = MegatronIndexedSource(prefix, vocab_size=100_000)
    with pytest.raises(
        DataReadError, match=rf"sequence {sequences - 2} does not follow sequence {sequences - 3}"
    ):
        moved.check_files()


def test_a_megatron_corpus_trains_to_the_batches_of_the_same_documents_prepared_here(tmp_path):
    """Same lengths, same plan: the batches equal those of `prepare`'s flat shards.

    The stored end-of-document id is read as the end of each document, so it
    appears once per document, where packing puts it, never twice in a row.
    """
    documents = _documents("web")
    np.savez(tmp_path / "ids.npz", *documents)
    prepared = tmp_path / "prepared"
    prepare_corpus([str(tmp_path / "ids.npz")], str(prepared), num_shards=2, vocab_size=65536)
    common = {"global_batch_size": 4, "max_target_length": 64, "eod_token_id": EOD}
    ours = _batches(
        {"train": {"web": {"kind": "array_record", "path": str(prepared)}}, **common}, 12
    )
    megatron = {"kind": "megatron", "path": WEB, "end_of_document": EOD}
    theirs = _batches({"train": {"web": megatron}, **common}, 12)
    for x, y in zip(ours, theirs, strict=True):
        for key in x:
            np.testing.assert_array_equal(x[key], y[key], err_msg=key)
    for batch in theirs:  # an end-of-document id only ends a document's piece
        for targets, segments in zip(batch["targets"], batch["targets_segmentation"], strict=True):
            for segment in set(segments.tolist()) - {0}:
                assert EOD not in targets[segments == segment][:-1].tolist()
    # Unset, the run's end-of-document id is the one the corpus stores.
    unset = _batches(
        {"train": {"web": megatron}, "global_batch_size": 4, "max_target_length": 64}, 2
    )
    np.testing.assert_array_equal(unset[1]["targets"], theirs[1]["targets"])


def _read_in_this_process(source: MegatronIndexedSource, results) -> None:
    results.put([d.tolist() for d in source.read_many(range(len(source)))])


def test_a_source_sent_to_another_process_maps_the_corpus_there():
    """What grain's workers get: the source pickled as paths, its maps made in the worker."""
    source = MegatronIndexedSource(CODE, vocab_size=100_000)
    source.check_files()  # mapped here; the maps do not travel
    # A process of its own, killed at the end: a Pool waits forever for a child
    # that died unpickling its task, and an executor's exit for one that hangs.
    spawn = multiprocessing.get_context("spawn")
    results = spawn.Queue()
    child = spawn.Process(target=_read_in_this_process, args=(source, results), daemon=True)
    child.start()
    try:
        there = results.get(timeout=120)
        child.join(30)
        assert child.exitcode == 0, f"the reading process ended with {child.exitcode}"
    finally:
        child.kill()
        child.join(10)
    assert there == [d.tolist() for d in _documents("code")]
    sent = pickle.loads(pickle.dumps(source))
    assert sent._lengths is None and sent._indexes == [None]  # no per-document array travels
    np.testing.assert_array_equal(sent.lengths(), source.lengths())


def test_a_corpus_of_only_empty_documents_is_refused_by_name(tmp_path):
    """No sequence at all: the `.idx` holds only the boundaries, the `.bin` is empty."""
    prefix = tmp_path / "empty_text_document"
    header = b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, 0, 3)
    prefix.with_suffix(".idx").write_bytes(header + np.zeros(3, "<i8").tobytes())
    prefix.with_suffix(".bin").write_bytes(b"")
    source = MegatronIndexedSource(str(prefix))
    source.check_files()
    assert source.lengths().tolist() == [0, 0] and source.read_many([1])[0].size == 0
    data = {
        "train": {"empty": {"kind": "megatron", "path": str(prefix)}},
        "global_batch_size": 4,
        "max_target_length": 32,
        "eod_token_id": 1,
    }
    with pytest.raises(DataConfigError, match=r"data\.train\.empty has only empty documents"):
        _batches(data, 1)


def test_the_readme_megatron_config_trains_as_written(tmp_path):
    """The README's block, its paths pointed at the fixtures."""
    readme = (REPO / "README.md").read_text()
    (block,) = re.findall(
        r"```text\n(data\.train = \{\"web\": \{\"kind\": \"megatron\".*?)```", readme, re.S
    )
    data = {}
    exec(
        block.replace("/data/megatron/web_text_document", WEB).replace(
            "/data/megatron/books_text_document", BOOKS
        ),
        {},
        {"data": _Data(data)},
    )
    assert set(data) == {"train", "eval"}  # its held-out part is built too
    batches = _batches({**data, "global_batch_size": 4, "max_target_length": 64}, 3)
    assert batches[0]["inputs"].shape == (4, 64)


class _Data:
    """Records `data.key = value` as the config lines of the README do."""

    def __init__(self, into: dict):
        object.__setattr__(self, "_into", into)

    def __setattr__(self, key, value):
        self._into[key] = value


# Bad input ---------------------------------------------------------------------


def test_a_corpus_with_stored_end_of_document_ids_read_without_end_of_document_is_refused():
    data = {
        "train": {"web": {"kind": "megatron", "path": WEB}},
        "global_batch_size": 4,
        "max_target_length": 64,
        "eod_token_id": EOD,
    }
    with pytest.raises(DataConfigError) as error:
        xd.iterators_from_config(data, xd.create_mesh())
    message = str(error.value)
    assert "data.train.web" in message and f"data.train.web.end_of_document={EOD}" in message
    assert "two in a row" in message


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ({"path": "/nonexistent/corpus"}, r"data\.train\.x\.path=.*corpus\.bin does not exist"),
        ({"path": str(FIXTURES / "*.nothing")}, r"matches no \.bin or \.idx"),
        ({"path": CODE}, r"x\.vocab_size is unset and .*code_text_sentence\.idx stores int32 ids"),
        ({"path": 5}, r"x\.path=5 is not a corpus prefix"),
        ({"path": WEB, "end_of_document": "eod"}, r"x\.end_of_document='eod' is not a token id"),
        ({"path": WEB, "end_of_document": -1}, r"x\.end_of_document=-1 is not a token id"),
        ({"path": BOOKS}, r"data\.eod_token_id is unset and data\.train\.x records no tokenizer"),
        (
            {"path": [WEB, BOOKS], "end_of_document": EOD},
            r"books_text_document\.bin: document 0 ends with id \d+, not end_of_document=50256",
        ),
        (
            {"path": WEB, "end_of_document": 70_000},
            r"end_of_document=70000 is not an id in \[0, 65536\)",
        ),
        ({"path": WEB, "vocab_size": 0}, r"vocab_size=0 is invalid"),
        ({"path": WEB, "colour": 1}, r"unknown keys \['colour'\]"),
        (
            {"path": CODE, "vocab_size": 100_000, "end_of_document": 7},
            r"document 0 ends with id .*, not end_of_document=7",
        ),
        (
            {"path": WEB, "vocab_size": 30_000, "end_of_document": EOD},
            r"end_of_document=50256 is not an id in \[0, 30000\)",
        ),
    ],
)
def test_a_bad_megatron_source_is_one_error_naming_its_key(spec, match):
    data = {
        "train": {"x": {"kind": "megatron", **spec}},
        "global_batch_size": 4,
        "max_target_length": 32,
    }
    with pytest.raises((DataConfigError, DataReadError), match=match) as error:
        _batches(data, 1)
    assert "data.train.x" in str(error.value)


def test_ids_outside_the_vocabulary_name_the_file_and_document():
    source = MegatronIndexedSource(CODE, vocab_size=50_000)
    code = _documents("code")
    bad = next(i for i, d in enumerate(code) if d.max() >= 50_000)
    with pytest.raises(
        DataReadError, match=rf"document {bad} of .*code_text_sentence\.bin.*outside \[0, 50000\)"
    ):
        source.read_many([bad])


def test_damaged_files_are_one_error_naming_the_file(tmp_path):
    prefix = _copy(tmp_path, WEB)
    idx = Path(prefix + ".idx").read_bytes()
    bin_bytes = Path(prefix + ".bin").read_bytes()

    Path(prefix + ".bin").write_bytes(bin_bytes[:-2])  # one id short
    with pytest.raises(
        DataReadError, match=r"web_text_document\.bin: .* bytes, but .*\.idx places"
    ):
        MegatronIndexedSource(prefix, end_of_document=EOD).check_files()
    Path(prefix + ".bin").write_bytes(bin_bytes)

    Path(prefix + ".idx").write_bytes(b"NOTANIDX" + idx[8:])
    with pytest.raises(DataReadError, match=r"web_text_document\.idx: not a Megatron index"):
        MegatronIndexedSource(prefix)
    Path(prefix + ".idx").write_bytes(idx[:-8])
    with pytest.raises(DataReadError, match=r"\.idx: \d+ bytes, but its header .* truncated"):
        MegatronIndexedSource(prefix)
    Path(prefix + ".idx").write_bytes(idx[:17] + struct.pack("<B", 6) + idx[18:])
    with pytest.raises(DataReadError, match=r"dtype code 6 is not an integer id dtype"):
        MegatronIndexedSource(prefix)
    Path(prefix + ".idx").write_bytes(idx[:9] + struct.pack("<Q", 2) + idx[17:])
    with pytest.raises(DataReadError, match=r"index version 2"):
        MegatronIndexedSource(prefix)
    sequences = struct.unpack("<Q", idx[18:26])[0]
    pointers = 34 + 4 * sequences
    moved = bytearray(idx)
    moved[pointers + 8 : pointers + 16] = struct.pack("<q", 10**9)  # document 1 far outside
    Path(prefix + ".idx").write_bytes(bytes(moved))
    with pytest.raises(DataReadError, match=r"\.idx: document 1 .*spans ids .*damaged"):
        MegatronIndexedSource(prefix).read_many([1])


def test_documents_that_all_end_with_another_id_than_the_runs_are_warned_about(caplog):
    data = {
        "train": {"web": {"kind": "megatron", "path": WEB}},
        "global_batch_size": 4,
        "max_target_length": 64,
        "eod_token_id": 5,
    }
    with caplog.at_level("WARNING"):
        _batches(data, 1)
    (warning,) = [r.getMessage() for r in caplog.records if "all end with id" in r.getMessage()]
    assert (
        f"all end with id {EOD}" in warning and f"data.train.web.end_of_document={EOD}" in warning
    )


def test_a_tokenizer_and_an_end_of_document_that_disagree_are_refused():
    data = {
        "train": {
            "web": {
                "kind": "megatron",
                "path": WEB,
                "tokenizer": "byte",
                "vocab_size": 65536,
                "end_of_document": EOD,
            }
        },
        "global_batch_size": 4,
        "max_target_length": 64,
    }
    with pytest.raises(DataConfigError, match=r"data\.train\.web\.end_of_document=50256 disagrees"):
        _batches(data, 1)


def test_a_megatron_users_blend_trains_as_their_data_path_says():
    """As a Megatron-LM user ports `--data-path 0.7 web 0.3 code` and their GPT batch.

    Their habits: a blend of weight-prefix pairs, batches keyed `tokens`,
    `labels`, `loss_mask`, `position_ids`, and a jitted step whose
    `in_shardings` they write themselves over their own mesh axis names.
    """
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    train = xd.megatron_datasets(f"0.7 {WEB} 0.3 {CODE}")  # their --data-path, pasted
    train["web_text_document"]["end_of_document"] = EOD  # written with --append-eod
    train["code_text_sentence"]["vocab_size"] = 100_000  # int32 ids
    data = {"train": train, "global_batch_size": 8, "max_target_length": 32}
    mesh = xd.create_mesh("data:-1", devices=jax.devices()[:2])
    train, _ = xd.iterators_from_config(data, mesh)
    batch_sharding = NamedSharding(mesh, PartitionSpec("data"))

    def step(tokens, labels, loss_mask, position_ids):
        return (labels * loss_mask).sum(), (loss_mask * (position_ids >= 0)).sum()

    step = jax.jit(step, in_shardings=(batch_sharding,) * 4)
    counted = 0
    try:
        for _ in range(40):
            batch = next(train).to_dict()
            megatron_batch = {
                "tokens": batch["inputs"],
                "labels": batch["targets"],
                "loss_mask": (batch["targets_segmentation"] > 0).astype("int32"),
                "position_ids": batch["inputs_position"],
            }
            assert megatron_batch["tokens"].sharding.spec == PartitionSpec("data")
            _, tokens = step(*megatron_batch.values())
            counted += int(tokens)
        shares = train.data_counters.component_tokens / train.data_counters.tokens
        assert counted == train.data_counters.tokens
    finally:
        train.close()
    names = list(train.source_names)
    assert abs(shares[names.index("web_text_document")] - 0.7) < 0.02
    assert abs(shares[names.index("code_text_sentence")] - 0.3) < 0.02


def test_an_empty_document_of_an_append_eod_corpus_stores_no_end_and_reads_empty():
    """`preprocess_data.py` appends the id only to documents with ids (the fixture too)."""
    documents = _documents("web")
    empty = [i for i, d in enumerate(documents) if not len(d)]
    assert empty  # the fixture has such documents
    source = MegatronIndexedSource(WEB, end_of_document=EOD)
    assert [source.read_many([i])[0].size for i in empty] == [0] * len(empty)
    np.testing.assert_array_equal(source.read_many([empty[0] + 1])[0], documents[empty[0] + 1])


def test_a_later_corpus_that_already_ends_its_documents_with_the_runs_id_is_refused():
    data = {
        "train": {"x": {"kind": "megatron", "path": [BOOKS, WEB]}},
        "global_batch_size": 4,
        "max_target_length": 32,
        "eod_token_id": EOD,
    }
    with pytest.raises(
        DataConfigError, match=r"web_text_document\.bin all end with data\.eod_token_id"
    ):
        _batches(data, 1)


def test_a_document_deep_in_the_corpus_without_its_stored_end_fails_when_read(
    tmp_path, monkeypatch
):
    """The build looks at the first documents only (8 here); every read checks its own."""
    from xlstm_data.sources import megatron_indexed

    monkeypatch.setattr(megatron_indexed, "SAMPLED_ENDS", 8)
    prefix = _copy(tmp_path, WEB)
    documents = _documents("web")
    lengths = [len(d) + (len(d) > 0) for d in documents]  # with their stored ends
    late = next(i for i in range(40, 60) if len(documents[i]))
    ids = np.fromfile(prefix + ".bin", dtype="<u2")
    ids[sum(lengths[: late + 1]) - 1] = 7  # its end
    ids.tofile(prefix + ".bin")
    source = MegatronIndexedSource(prefix, end_of_document=EOD)
    source.check_files()
    source.read_many(range(late))
    non_empty = int(len(documents[late - 1]) > 0) + 1
    read = f"{non_empty} non-empty document{'s' * (non_empty > 1)}"
    read_ending = non_empty - 1
    with pytest.raises(
        DataReadError,
        match=rf"web_text_document\.bin: document {late} ends with id 7, not "
        rf"end_of_document={EOD} \(of the {read} read together, {read_ending} end with it\)",
    ):
        source.read_many([late - 1, late])


def _index_with_boundaries(tmp_path, boundaries: list[int]) -> str:
    """An `.idx` of one-id sequences with these document boundaries (in sequences)."""
    sequences = max(boundaries)
    header = b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, sequences, len(boundaries))
    path = tmp_path / f"bounds_{len(list(tmp_path.glob('bounds_*')))}.idx"
    path.write_bytes(
        header
        + np.ones(sequences, "<i4").tobytes()
        + (2 * np.arange(sequences, dtype="<i8")).tobytes()
        + np.array(boundaries, "<i8").tobytes()
    )
    return str(path)


@pytest.mark.parametrize("block", [1, 2, 3, 1 << 22])
def test_document_boundaries_are_checked_in_blocks_across_their_seams(tmp_path, monkeypatch, block):
    """A fall or a document of several sequences is found whichever block holds it."""
    from xlstm_data.sources import megatron_indexed

    monkeypatch.setattr(megatron_indexed, "_BLOCK", block)
    one_each = megatron_indexed._Index(_index_with_boundaries(tmp_path, [0, 1, 2, 3, 4]))
    assert one_each._bounds is None and one_each.lengths.tolist() == [1, 1, 1, 1]
    several = megatron_indexed._Index(_index_with_boundaries(tmp_path, [0, 1, 1, 3]))
    assert several.stored_lengths(np.array([2, 1, 0, 1])).tolist() == [2, 0, 1, 0]
    assert several._summed is None  # looked up one by one, nothing summed
    assert several.lengths.tolist() == [1, 0, 2]  # an empty document, then one of two
    with pytest.raises(DataReadError, match="boundaries must rise from 0 to 4.*and fall"):
        megatron_indexed._Index(_index_with_boundaries(tmp_path, [0, 1, 2, 1, 4]))
    assert megatron_indexed._step_range(iter([np.array([0])])) == (1, 1)


def _resident_kb(path: str) -> int:
    """This process's resident KB of its maps of `path` (`/proc/self/smaps`)."""
    resident, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
            inside = line.split()[-1] == path
        elif inside and line.startswith("Rss:"):
            resident += int(line.split()[1])
    return resident


@pytest.mark.parametrize("one_each", [True, False])
def test_the_checks_at_start_leave_no_idx_array_resident(tmp_path, monkeypatch, one_each):
    """Each block the checks read is let go once checked (`MADV_DONTNEED`), also the lengths.

    At 10^8 documents the `.idx` is 2 GB; its boundaries and lengths, read
    whole at start, left 1.2 GB of it in the resident set. Measured here
    (`/proc/self/smaps`) on an `.idx` of 2^22 documents against the same
    start with nothing let go; the kernel maps a whole page-cache folio
    around a fault, so a block at a time is the bound, not a page.
    """
    from xlstm_data.sources import megatron_indexed

    monkeypatch.setattr(megatron_indexed, "_BLOCK", 1 << 19)
    documents = 1 << 22
    step = 1 if one_each else 2
    path = _index_with_boundaries(tmp_path, list(range(0, step * documents + 1, step)))

    def resident_after_start() -> tuple[int, int]:
        index = megatron_indexed._Index(path)
        index.check_back_to_back()
        after_checks = _resident_kb(path)
        less = index.lengths_less_stored_ends(10, documents)
        assert less[:3].tolist() == [step - 1] * 3 and len(less) == documents - 10
        return after_checks, _resident_kb(path)

    released = resident_after_start()
    monkeypatch.setattr(megatron_indexed._Index, "_release", lambda self, begin, size: None)
    kept = resident_after_start()
    assert kept[0] > 20_000  # what the checks read: 16 MB of lengths and 32 MB of boundaries
    assert released[0] < kept[0] / 3 and released[1] < kept[1] / 3, (released, kept)


def _write_uint16_corpus(prefix: Path, stored: list[list[int]]) -> str:
    """A Megatron corpus of these stored documents (ids and any stored end), one sequence each."""
    sizes = np.array([len(d) for d in stored], "<i4")
    pointers = np.concatenate([[0], np.cumsum(sizes[:-1]) * 2]).astype("<i8")
    header = b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, len(sizes), len(sizes) + 1)
    Path(f"{prefix}.idx").write_bytes(
        header
        + sizes.tobytes()
        + pointers.tobytes()
        + np.arange(len(sizes) + 1, dtype="<i8").tobytes()
    )
    np.array([i for d in stored for i in d], "<u2").tofile(f"{prefix}.bin")
    return str(prefix)


def test_the_first_ends_looked_at_are_found_past_many_empty_documents(tmp_path):
    """A corpus starting with empty documents is looked at further on, and refused at once."""
    stored = [[]] * 1000 + [[5, 7]] * 10  # stored without --append-eod
    prefix = _write_uint16_corpus(tmp_path / "late", stored)
    with pytest.raises(DataReadError, match=r"document 1000 ends with id 7, not end_of_document"):
        MegatronIndexedSource(prefix, end_of_document=EOD)
    assert MegatronIndexedSource(prefix).last_ids()[prefix + ".bin"].tolist() == [7] * 10


def test_a_lone_stored_end_reads_as_an_empty_document_and_another_id_there_is_refused(
    tmp_path, monkeypatch
):
    """A document of `.idx` length 1 holds only its stored end: it reads as empty.

    The check of stored ends takes a document's length from the source; one
    read as empty is looked up in the `.idx`, where a length of 1 is a
    stored end that must be `end_of_document` like any other.
    """
    from xlstm_data.sources import megatron_indexed

    documents = [[5, 6], [], [EOD], [8], [9, 10], [EOD], [EOD]]
    stored = [d + [EOD] if d and d != [EOD] else d for d in documents]
    stored[6] = [7]  # a lone id that is not the end of document, after the 4 looked at first
    prefix = _write_uint16_corpus(tmp_path / "lone", stored)
    monkeypatch.setattr(megatron_indexed, "SAMPLED_ENDS", 4)
    source = MegatronIndexedSource(prefix, end_of_document=EOD)
    assert source.lengths().tolist() == [2, 0, 0, 1, 2, 0, 0]
    read = source.read_many(range(6))
    assert [d.tolist() for d in read] == [[5, 6], [], [], [8], [9, 10], []]
    with pytest.raises(
        DataReadError,
        match=r"document 6 ends with id 7, not end_of_document=50256 \(of the 2 non-empty "
        r"documents read together, 1 end with it\)",
    ):
        source.read_many([5, 6, 1])


def test_two_processes_read_the_rows_one_process_reads(tmp_path):
    """Each of 2 JAX processes (2 CPU devices each) holds its rows of the one global batch."""
    from tests.multiprocess import run_processes

    config = tmp_path / "megatron_config.py"
    config.write_text(
        "import ml_collections\n\n\ndef get_config():\n"
        "    return ml_collections.ConfigDict({'data': {"
        f"'train': {{'web': {{'kind': 'megatron', 'path': {WEB!r}, 'end_of_document': {EOD}}},"
        f" 'books': {{'kind': 'megatron', 'path': {BOOKS!r}, 'weight': 0.3}}}},"
        " 'global_batch_size': 8, 'max_target_length': 32}})\n"
    )
    steps = [0, 3, 7]
    from xlstm_data.cli.inspect_config import load_config

    data = load_config(str(config)).data
    batches = _batches(data.to_dict(), max(steps) + 1)
    results = run_processes("planned_rows", 2, tmp_path, {"config": str(config), "steps": steps})
    for step in steps:
        held = {}
        for result in results:
            held.update({int(row): values for row, values in result[str(step)].items()})
        assert sorted(held) == list(range(8))
        np.testing.assert_array_equal([held[row] for row in range(8)], batches[step]["inputs"])


def test_split_parts_are_the_documents_megatrons_split_gives():
    """Against megatron-core's own parsing and bookends (`splits.json`, written with it)."""
    from xlstm_data.sources.megatron_indexed import SPLIT_PARTS, split_bookends, split_range

    expected = json.loads((FIXTURES / "splits.json").read_text())
    checked = 0
    for split, sizes in expected.items():
        for n, parts in sizes.items():
            for part, megatron in zip(SPLIT_PARTS, parts, strict=True):
                if megatron is None:  # Megatron builds no dataset for a part of no width
                    with pytest.raises(DataConfigError, match="gives the .* part no documents"):
                        split_bookends(split, part)
                    continue
                assert list(split_range(split_bookends(split, part), int(n))) == megatron, (
                    split,
                    n,
                    part,
                )
                checked += 1
    assert checked >= 90  # 7 splits x 6 sizes x the parts of non-zero width


def test_a_split_corpus_reads_each_part_apart_and_trains_on_one_evaluates_on_another():
    documents = _documents("web")
    parts = {
        part: MegatronIndexedSource(WEB, end_of_document=EOD, split="50,30,20", split_part=part)
        for part in ("train", "valid", "test")
    }
    assert [len(source) for source in parts.values()] == [30, 18, 12]
    first = 0
    for source in parts.values():
        for i in range(len(source)):
            np.testing.assert_array_equal(source.read_many([i])[0], documents[first + i])
        assert source.lengths().tolist() == [len(d) for d in documents[first : first + len(source)]]
        first += len(source)
    spec = {"kind": "megatron", "path": WEB, "end_of_document": EOD, "split": "50,30,20"}
    data = {
        "train": {"web": spec},
        "eval": {"web_valid": {**spec, "split_part": "valid"}},
        "global_batch_size": 4,
        "max_target_length": 32,
    }
    train, evals = xd.iterators_from_config(data, xd.create_mesh())
    try:
        valid_ids = set(np.concatenate(documents[30:48]).tolist()) | {EOD, 0}
        for batch in evals["web_valid"]:
            assert set(np.asarray(batch.inputs).ravel().tolist()) <= valid_ids
    finally:
        train.close()
        for iterator in evals.values():
            iterator.close()


@pytest.mark.parametrize(
    ("split", "part", "match"),
    [
        ("abc", "train", r"x\.split='abc' is not a Megatron --split"),
        ("1,2,3,4", "train", r"x\.split='1,2,3,4' is not a Megatron --split"),
        ("1.2.3", "train", r"x\.split='1\.2\.3' is not a Megatron --split"),
        ("1e3,1", "train", r"x\.split='1e3,1' is not a Megatron --split"),  # 1:3:1 in Megatron
        ("-1,2", "train", r"x\.split='-1,2' is not a Megatron --split"),
        ("1" + "0" * 400 + ",1", "train", r"is not a Megatron --split"),  # overflows a float
        (None, "valid", r"x\.split_part='valid' needs data\.train\.x\.split"),
        (None, "bogus", r"x\.split_part='bogus' is not a part"),
        ("969,30,1", "validation", r"x\.split_part='validation' is not a part .*'valid'"),
        ("100,0,0", "valid", r"x\.split='100,0,0' gives the 'valid' part no documents"),
        ("999,1,0", "valid", r"holds no documents in the 'valid' part of split='999,1,0'"),
    ],
)
def test_a_bad_split_is_one_error_naming_its_key(split, part, match):
    data = {
        "train": {
            "x": {
                "kind": "megatron",
                "path": WEB,
                "end_of_document": EOD,
                "split": split,
                "split_part": part,
            }
        },
        "global_batch_size": 4,
        "max_target_length": 32,
    }
    with pytest.raises(DataConfigError, match=match) as error:
        _batches(data, 1)
    assert "data.train.x" in str(error.value)


def test_a_split_given_as_numbers_reads_as_the_string_and_errors_name_file_documents():
    """A command-line override `...split=969,30,1` arrives as a tuple of numbers."""
    as_string = MegatronIndexedSource(WEB, end_of_document=EOD, split="50,30,20", split_part="test")
    as_numbers = MegatronIndexedSource(
        WEB, end_of_document=EOD, split=(50, 30, 20), split_part="test"
    )
    assert as_string.lengths().tolist() == as_numbers.lengths().tolist()
    narrow = MegatronIndexedSource(WEB, vocab_size=100, split="50,30,20", split_part="valid")
    # The corpus's own document number (31), not the part's (1).
    with pytest.raises(DataReadError, match=r"document 31 of .*web_text_document\.bin"):
        narrow.read_many([1])


def test_one_number_given_as_the_split_is_megatrons_split_of_that_string():
    """An override `...split=90` arrives as an int; Megatron reads "90" as all train."""
    from xlstm_data.sources.megatron_indexed import split_bookends

    assert split_bookends(90, "train") == split_bookends("90", "train") == (0.0, 1.0)
    with pytest.raises(DataConfigError, match="split=90 gives the 'valid' part no documents"):
        split_bookends(90, "valid")


def test_advice_the_kernel_refuses_changes_nothing(tmp_path, monkeypatch):
    """Locked memory (`mlockall`) makes Linux refuse `MADV_DONTNEED`: the source reads anyway."""
    import errno

    from xlstm_data.sources import megatron_indexed

    class Refusing:
        def madvise(self, *args):
            raise OSError(errno.EINVAL, "Invalid argument")

    megatron_indexed._advise(Refusing(), "MADV_DONTNEED", 0, 4096)  # no error
    megatron_indexed._advise(None, "MADV_RANDOM")
    megatron_indexed._advise(Refusing(), "MADV_NOT_A_FLAG")  # a platform without it
    advised = []
    real = megatron_indexed._advise

    def refuse_all(mapped, advice, *where):
        advised.append(advice)
        real(Refusing(), advice, *where)

    monkeypatch.setattr(megatron_indexed, "_advise", refuse_all)
    source = MegatronIndexedSource(WEB, end_of_document=EOD)
    for read, document in zip(source.read_many(range(len(source))), _documents("web"), strict=True):
        np.testing.assert_array_equal(read, document)
    assert {"MADV_DONTNEED", "MADV_RANDOM"} <= set(advised)


@pytest.mark.parametrize("corpus", ["web with its stored ends", "code of several sentences"])
def test_a_worker_maps_the_lengths_the_main_process_computed(tmp_path, monkeypatch, corpus):
    """Lengths that are not the `.idx`'s own go through the lengths cache, keyed by the `.idx`.

    Each grain worker gets the source as paths and reads its lengths again:
    from the cache they are one file every process maps, not a copy each
    (400 MB a worker at 10^8 documents). A worker of a corpus of several
    sentences a document never sums its documents' sequences either.
    """
    monkeypatch.setenv("XLSTM_DATA_CACHE_DIR", str(tmp_path / "cache"))
    if corpus.startswith("web"):
        source = MegatronIndexedSource(_copy(tmp_path, WEB), end_of_document=EOD)
        documents = _documents("web")
    else:
        source = MegatronIndexedSource(_copy(tmp_path, CODE), vocab_size=100_000)
        documents = _documents("code")
    expected = [len(d) for d in documents]
    assert source.lengths().tolist() == expected
    assert len(list((tmp_path / "cache" / "lengths").glob("*.npy"))) == 1
    worker = pickle.loads(pickle.dumps(source))  # what a grain worker gets

    def not_again():
        raise AssertionError("a worker computed the lengths again")

    monkeypatch.setattr(worker, "_computed_lengths", not_again)
    lengths = worker.lengths()
    assert lengths.tolist() == expected and lengths.dtype == np.int32
    assert not lengths.flags.writeable
    base = lengths
    while getattr(base, "base", None) is not None:
        base = base.base
    assert isinstance(base, mmap.mmap)  # the cache's file, mapped
    for read, document in zip(worker.read_many(range(len(worker))), documents, strict=True):
        np.testing.assert_array_equal(read, document)
    assert worker._index(0)._summed is None  # no sum of every document's sequences


def test_a_rewritten_idx_of_the_same_size_and_mtime_is_not_read_from_the_cache(
    tmp_path, monkeypatch
):
    """An `.idx`'s size follows from its counts: other lengths, same size, old mtime (`cp -p`)."""
    monkeypatch.setenv("XLSTM_DATA_CACHE_DIR", str(tmp_path / "cache"))
    prefix = _write_uint16_corpus(tmp_path / "a", [[1, 2, 3], [4, 5]])
    other = _write_uint16_corpus(tmp_path / "b", [[6], [7, 8]])
    assert MegatronIndexedSource([prefix, other]).lengths().tolist() == [3, 2, 1, 2]
    times = os.stat(prefix + ".idx")
    _write_uint16_corpus(Path(prefix), [[1], [2, 3, 4, 5]])  # in place: same inode, same sizes
    os.utime(prefix + ".idx", ns=(times.st_atime_ns, times.st_mtime_ns))
    os.utime(prefix + ".bin", ns=(times.st_atime_ns, times.st_mtime_ns))
    source = MegatronIndexedSource([prefix, other])
    assert source.lengths().tolist() == [1, 4, 1, 2]
    assert [d.tolist() for d in source.read_many(range(4))] == [[1], [2, 3, 4, 5], [6], [7, 8]]


def test_a_cached_entry_that_disagrees_with_the_idx_is_counted_again(tmp_path, monkeypatch):
    """Were a key to miss a change, the first and last documents' lengths are checked on a hit."""
    from xlstm_data.sources import megatron_indexed

    monkeypatch.setenv("XLSTM_DATA_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(megatron_indexed, "_identity", lambda path: [path])  # a blind key
    prefix = _write_uint16_corpus(tmp_path / "a", [[1, 2, 3], [4, 5]])
    other = _write_uint16_corpus(tmp_path / "b", [[6], [7, 8]])
    assert MegatronIndexedSource([prefix, other]).lengths().tolist() == [3, 2, 1, 2]
    _write_uint16_corpus(Path(prefix), [[1], [2, 3, 4, 5]])
    assert MegatronIndexedSource([prefix, other]).lengths().tolist() == [1, 4, 1, 2]
    (entry,) = (tmp_path / "cache" / "lengths").glob("*.npy")
    assert np.load(entry).tolist() == [1, 4, 1, 2]  # replaced
