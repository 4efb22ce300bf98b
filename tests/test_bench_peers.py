"""The peers benchmark's harness, without the peers (their venv is never needed here).

The ratios, the alternation and the summary are checked on made-up results;
one real run of the harness points it at a peers venv that does not exist,
so every peer must be reported missing while our own runner measures a tiny
prepared corpus in a subprocess, as in a real run.
"""

from __future__ import annotations

import itertools
import json
import statistics

import numpy as np
import pytest

from bench import common
from bench.peers import __main__ as cli
from bench.peers import corpus, harness, run_ours, runner_util
from tests.helpers import MEGATRON_FIXTURES, MEGATRON_WEB
from xlstm_data.multihost.shared_slots import RELEASE


def test_rotation_pairs_and_summary():
    assert harness.rotated(["a", "b", "c"], 0) == ["a", "b", "c"]
    assert harness.rotated(["a", "b", "c"], 4) == ["b", "c", "a"]
    assert harness.rotated([], 3) == []
    # Rounds where either side failed (None) or the peer measured 0 are skipped.
    ratios = harness.paired_ratios([2.0, None, 3.0, 4.0], [1.0, 1.0, 0.0, 8.0])
    assert ratios == [2.0, 0.5]
    stats = harness.summarize([3.0, 1.0, 2.0])
    assert (stats["median"], stats["min"], stats["max"]) == (2.0, 1.0, 3.0)
    assert harness.summarize([]) is None
    assert harness.spread(stats) == "2.00 (1.00-3.00)"
    assert harness.spread(None) == "-"


def test_rounds_alternate_and_record_failures_and_missing_peers():
    subjects = [
        harness.Subject("ours", "ours", {"n": 1}),
        harness.Subject("megatron", "megatron", {"n": 2}),
        harness.Subject("olmo", "olmo", {"n": 3}),
        harness.Subject("streaming", "streaming", {"n": 4}),
    ]
    order = []

    def fake_run(runner, task, **kwargs):
        order.append(runner)
        if runner == "olmo" and len(order) > 3:
            raise harness.RunnerFailed("boom")
        return {"tokens_per_sec": 10.0 * task["n"]}

    failures = []
    results = harness.run_rounds(
        subjects, 3, {"streaming": "not installed"}, failures, fake_run, "w0"
    )
    # The missing peer never runs; the others alternate, each round starting one later.
    assert order == [
        "ours",
        "megatron",
        "olmo",
        "megatron",
        "olmo",
        "ours",
        "olmo",
        "ours",
        "megatron",
    ]
    assert set(results) == {"ours", "megatron", "olmo"}
    assert results["olmo"][0] == {"tokens_per_sec": 30.0}
    assert results["olmo"][1:] == [None, None]
    assert [(f["subject"], f["round"]) for f in failures] == [("olmo", 1), ("olmo", 2)]
    ratio = harness._ratio(results, "ours", "olmo")  # noqa: SLF001
    assert ratio["values"] == [pytest.approx(1 / 3)]
    assert harness._ratio(results, "ours", "streaming") is None  # noqa: SLF001


def test_targets_and_summary_rows():
    ratios = {
        "w0 ours_best_fit/megatron": harness.summarize([1.2, 0.9, 1.1]),
        "w0 cpu ours_best_fit/megatron": harness.summarize([1.5]),
        "prepare ours/megatron": harness.summarize([0.5]),
        "prepare ours_arrow/megatron": harness.summarize([2.5]),
        "prepare ours_index/megatron": harness.summarize([1.1]),
        "w0 ours_best_fit/ours_best_fit_host": harness.summarize([0.8]),
        "w2 ours_concat/olmo_fsl": None,
        "w0 ours_megatron_files/megatron": harness.summarize([1.3]),
        "cold_start 2000 ours_megatron_files/megatron": harness.summarize([1.2]),
    }
    settings = harness.Settings.create(tiny=True)
    found = {t["metric"]: t for t in harness.targets(ratios, settings)}
    assert found["w0 ours_best_fit/megatron"]["met"] is True
    assert found["w0 cpu ours_best_fit/megatron"]["met"] is False
    assert found["prepare ours/megatron"]["met"] is False
    assert found["prepare ours_arrow/megatron"]["met"] is True
    assert found["prepare ours_index/megatron"]["met"] is True
    assert found["w0 ours_best_fit/ours_best_fit_host"]["met"] is False  # target 6: >= 0.9
    assert "w2 ours_concat/olmo_fsl" not in found  # not measured: no target
    assert found["w0 ours_megatron_files/megatron"]["met"] is True
    assert found["cold_start 2000 ours_megatron_files/megatron"]["met"] is False
    rows = harness.summary_rows(
        {"ratios": ratios, "targets": list(found.values()), "missing": {"olmo": "no venv"}}
    )
    assert ("w0 ours_best_fit/megatron", "1.10 (0.90-1.20)", ">= 1", "yes") in rows
    assert ("w0 ours_best_fit/ours_best_fit_host", "0.80 (0.80-0.80)", ">= 0.9", "NO") in rows
    assert rows[-1][0] == "olmo: missing"


def test_the_10e8_cold_start_runs_ours_alone_against_absolute_bounds(tmp_path, monkeypatch):
    settings = harness.Settings.create(cold_100m=True)
    assert settings.cold_sizes[-1] == harness.OURS_ONLY_COLD == 10**8
    assert settings.cold_spec(10**8).mean_length == harness.SHORT_MEAN_LENGTH
    assert settings.cold_spec(10**6).mean_length == settings.cold_mean_length
    written = tmp_path / "ours"
    monkeypatch.setattr(corpus, "write_ours", lambda spec: written)

    def no_peer_corpus(*args):
        raise AssertionError("no peer corpus is written at 10^8 documents")

    monkeypatch.setattr(harness, "megatron_prefix", no_peer_corpus)
    layout = str(tmp_path / "megatron_layout" / "corpus")
    monkeypatch.setattr(harness, "megatron_layout_prefix", lambda spec: layout)
    ours, megatron_files = harness.cold_start_subjects(settings, 10**8, {}, tmp_path / "scratch")
    assert ours.task["evict"] == [str(written)]  # out of the page cache before each run
    # Megatron's own layout (written with numpy there), read in place by kind "megatron".
    assert (megatron_files.label, megatron_files.runner) == ("ours_megatron_files", "ours")
    assert megatron_files.task["sources"]["cold"] == harness.megatron_files_source(layout)
    assert megatron_files.task["evict"] == [layout + ".bin", layout + ".idx"]
    ratios = {
        f"cold_start {10**8} ours first_batch_secs": harness.summarize([1.2, 1.4]),
        f"cold_start {10**8} ours peak_rss_mb": harness.summarize([1500.0]),
        f"cold_start {10**8} ours_megatron_files first_batch_secs": harness.summarize([6.0]),
        f"cold_start {10**8} ours_megatron_files peak_rss_mb": harness.summarize([700.0]),
    }
    found = {t["metric"]: t for t in harness.targets(ratios, settings)}
    assert found[f"cold_start {10**8} ours first_batch_secs"]["met"] is True
    assert found[f"cold_start {10**8} ours peak_rss_mb"]["met"] is False
    assert found[f"cold_start {10**8} ours_megatron_files first_batch_secs"]["met"] is False
    assert found[f"cold_start {10**8} ours_megatron_files peak_rss_mb"]["met"] is True
    assert f"cold_start {10**8} ours/megatron" not in found


def test_megatron_layout_written_with_numpy_is_the_builders_bytes(tmp_path):
    """`write_megatron_layout` against files megatron-core's `IndexedDatasetBuilder` wrote.

    The fixture's documents (some empty: no end-of-document id is stored
    after those) written again with numpy give the same `.bin` and `.idx`,
    byte for byte, as the builder's (two halves merged with `add_index`).
    """
    documents = np.load(MEGATRON_FIXTURES / "documents.npz")
    lengths = documents["web_lengths"]
    assert (lengths == 0).any() and (lengths > 0).any()
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    prefix = str(tmp_path / "web")
    written = corpus.write_megatron_layout(
        documents["web"].astype(np.uint16), offsets, prefix, eod=50256
    )
    assert written == {"documents": len(lengths), "ids": int(lengths.sum() + (lengths > 0).sum())}
    for suffix in (".bin", ".idx"):
        ours = (tmp_path / ("web" + suffix)).read_bytes()
        assert ours == (MEGATRON_FIXTURES / ("web_text_document" + suffix)).read_bytes(), suffix


def test_megatron_layout_spans_several_write_chunks(tmp_path, monkeypatch):
    """Documents written a chunk at a time read back whole through kind "megatron"."""
    from xlstm_data.sources.megatron_indexed import MegatronIndexedSource

    monkeypatch.setattr(corpus, "CHUNK_DOCUMENTS", 3)
    rng = np.random.default_rng(5)
    lengths = rng.integers(0, 6, size=11)
    tokens = rng.integers(corpus.EOD_ID + 1, corpus.VOCAB_SIZE, int(lengths.sum()), np.uint16)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    prefix = str(tmp_path / "corpus")
    corpus.write_megatron_layout(tokens, offsets, prefix)
    source = MegatronIndexedSource(prefix, end_of_document=corpus.EOD_ID)
    assert source.lengths().tolist() == lengths.tolist()
    read = source.read_many(np.arange(len(lengths)))
    for k, document in enumerate(read):
        assert document.tolist() == tokens[offsets[k] : offsets[k + 1]].tolist()


def test_a_cold_start_drops_its_corpus_from_the_page_cache_first(tmp_path, monkeypatch):
    evicted = []
    monkeypatch.setattr(corpus, "evict_from_page_cache", lambda paths: evicted.append(list(paths)))
    ran = harness._Scratch(tmp_path, lambda runner, task: {"evicted_before": list(evicted)})
    result = ran("ours", {"task": "cold_start", "evict": ["/corpus"]})
    assert result == {"evicted_before": [["/corpus"]]}
    # The real call: files and directories, and a path that is not there, all pass.
    monkeypatch.undo()
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "tokens.npy").write_bytes(b"x" * 8192)
    (tmp_path / "offsets.npy").write_bytes(b"y" * 8192)
    corpus.evict_from_page_cache([tmp_path / "dir", tmp_path / "offsets.npy", tmp_path / "gone"])
    assert (tmp_path / "dir" / "tokens.npy").read_bytes() == b"x" * 8192


def test_result_line_protocol(capsys):
    runner_util.emit({"tokens": 5})
    printed = capsys.readouterr().out
    assert runner_util.parse_result("log line\n" + printed + "more log\n") == {"tokens": 5}
    assert runner_util.parse_result("nothing here\n") is None


def test_missing_peers_are_reported_and_ours_still_runs(tmp_path, monkeypatch):
    """A full harness run with no peers venv: three peers missing, our rows measured."""
    monkeypatch.setenv(harness.PEERS_VENV_ENV, str(tmp_path / "no-such-venv"))
    monkeypatch.setenv(common.CACHE_ENV, str(tmp_path / "cache"))
    out = tmp_path / "out"
    argv = ["--tiny", "--docs=300", "--rounds=1", "--groups=w0,cold_start", f"--out={out}"]
    code = cli.main(argv)
    assert code == 0
    result = json.loads((out / "peers.json").read_text())
    assert set(result["missing"]) == {"megatron", "olmo", "streaming"}
    assert "make bench-peers" in result["missing"]["megatron"]
    rates = result["groups"]["w0"]["figures"]["tokens_per_sec"]
    assert set(rates) == {
        "ours_best_fit",
        "ours_concat",
        "ours_best_fit_w1",
        "ours_best_fit_one_thread",
        "ours_best_fit_host",
    }
    assert all(stats["median"] > 0 for stats in rates.values())
    # Cold start: JAX's backend start is timed apart from build -> first batch.
    (cold,) = result["groups"]["cold_start"]["figures"].values()
    assert cold["runtime_secs"]["ours"]["median"] > 0
    assert cold["first_batch_secs"]["ours"]["median"] >= cold["build_secs"]["ours"]["median"] > 0
    # Memory at the first batch: the peak, and the loader's own pages apart from the files'.
    assert cold["peak_rss_mb"]["ours"]["median"] >= cold["anon_mb"]["ours"]["median"] > 0
    assert cold["file_mb"]["ours"]["median"] > 0
    assert result["failures"] == []
    # The one-thread bound on target 6 is a ratio without a target of its own.
    assert result["ratios"]["w0 ours_best_fit_one_thread/ours_best_fit_host"]["median"] > 0
    # Only target 6 (ours against ours) has no peer to miss.
    assert {t["metric"] for t in result["targets"]} == {
        "w0 ours_best_fit/ours_best_fit_host",
        "w0 ours_best_fit_w1/ours_best_fit_host",
    }
    # Ours was read from the directory our prepare wrote.
    web = harness.Settings.create(tiny=True, docs=300).specs()["web"]
    assert corpus.is_done(corpus.corpus_dir(web) / "ours")


def test_prepare_from_parquet_and_from_arrow_writes_the_same_corpus(tmp_path, monkeypatch):
    """Both inputs of the prepare group hold the same token arrays, and prepare makes one corpus."""
    monkeypatch.setenv(common.CACHE_ENV, str(tmp_path / "cache"))
    docs = corpus.write_documents(harness.Settings.create(tiny=True, docs=300).specs()["web"])
    outputs = {}
    for input_format in corpus.PREPARE_INPUTS:
        output = tmp_path / input_format
        result = corpus.prepare_ours(docs, output, input_format)
        assert result["secs"] > 0
        assert not (tmp_path / f".{input_format}-input").exists()  # the input is removed
        outputs[input_format] = {
            path.relative_to(output): path.read_bytes()
            for path in sorted(output.rglob("*"))
            if path.is_file() and path.suffix == ".npy" and ".prepare" not in path.parts
        }
    tokens, offsets = corpus.load_documents(docs)
    assert result["index"]["tokens"] == int(offsets[-1])
    assert outputs["arrow"] == outputs["parquet"] and outputs["arrow"]


def test_index_counts_the_documents_of_shards_made_elsewhere_again_each_round(
    tmp_path, monkeypatch
):
    monkeypatch.setenv(common.CACHE_ENV, str(tmp_path / "cache"))
    docs = corpus.write_documents(harness.Settings.create(tiny=True, docs=300).specs()["web"])
    tokens, offsets = corpus.load_documents(docs)
    for _ in range(2):  # the second round indexes the same shards again
        result = corpus.index_ours(docs)
        assert result["secs"] > 0
        assert result["index"]["documents"] == len(offsets) - 1
        assert result["index"]["tokens"] == int(offsets[-1])
        assert len(result["index"]["shards"]) == corpus.ELSEWHERE_SHARDS
    lengths = np.load(docs.parent / "array_record" / "lengths.npy")
    np.testing.assert_array_equal(lengths, np.diff(offsets))


def test_target6_pairs_windows_of_both_paths_in_one_process(tmp_path, monkeypatch):
    """The `target6` group: one process a round per worker count, its windows' median ratio."""
    monkeypatch.setenv(common.CACHE_ENV, str(tmp_path / "cache"))
    settings = harness.Settings.create(tiny=True, docs=300)
    ran = []

    def fake_run(runner, task, **kwargs):
        ran.append((runner, task["task"], task["workers"]))
        result = {
            "ratio": 0.8 + task["workers"] / 10,
            "tokens_per_sec": 1.0,
            "host_tokens_per_sec": 1.1,
        }
        if task["workers"]:
            result.update(same_pipeline_ratio=0.85, workers_ratio=1.05)
        return result

    result = harness.measure(settings, run=fake_run, groups=["target6"], peers=())
    assert sorted(ran) == [("ours", "paired", 0)] * 2 + [("ours", "paired", 1)] * 2
    assert result["ratios"]["target6 whole_w0/host"]["median"] == pytest.approx(0.8)
    assert result["ratios"]["target6 host_w1/host"]["median"] == pytest.approx(1.05)
    found = {t["metric"]: t["met"] for t in result["targets"]}
    assert found == {
        "target6 whole_w0/host": False,
        "target6 whole_w1/host": True,
        "target6 whole_w1/host_w1": False,
    }

    # The runner's own task, in this process: each window of the whole iterator
    # is paired with one of the host pipeline, and both count real tokens.
    (task, _) = (s.task for s in harness.paired_subjects(settings))
    result = run_ours.paired(dict(task, warmup=2))
    assert len(result["ratios"]) == task["windows"] == 2
    assert result["tokens_per_sec"] > 0 and result["host_tokens_per_sec"] > 0
    assert result["ratio"] == pytest.approx(statistics.median(result["ratios"]))

    # The third subject with workers reads the iterator's own pipeline: the
    # host pipeline's steps, token for token, and a lent chunk's slot is given back.
    train = run_ours.build(dict(task, workers=0))
    try:
        pipeline = train._pipeline(0, None)
        steps = list(itertools.islice(run_ours._pipeline_batches(pipeline), 40))
        pipeline.close()
        assert steps == list(itertools.islice(run_ours._host_batches(train), 40))
    finally:
        train.close()
    released = []
    lent = {
        "source_tokens": np.array([[3, 4], [5, 0]]),
        RELEASE: lambda: released.append(True),
    }
    assert list(run_ours._pipeline_batches(iter([lent]))) == [7, 5]
    assert released == [True]


def test_ours_on_megatrons_own_files_counts_the_documents_tokens():
    """The runner's source for Megatron's `.bin/.idx` (the subject `ours_megatron_files`).

    The corpus is one megatron-core wrote (`tests/fixtures/megatron`): what
    the subject reads is what Megatron's `GPTDataset` reads, not a copy.
    """
    prefix = str(MEGATRON_WEB)
    source = dict(harness.megatron_files_source(prefix), end_of_document=50256)
    assert run_ours.data_config({"sources": {"web": source}})["train"]["web"] == {
        "kind": "megatron",
        "path": prefix,
        "end_of_document": 50256,
    }
    task = {"sources": {"web": source}, "batch_size": 4, "seq_len": 64, "warmup": 1, "timed": 3}
    result = run_ours.throughput(task)
    assert result["tokens"] > 0 and result["tokens_per_sec"] > 0
