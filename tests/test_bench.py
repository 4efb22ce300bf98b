"""Smoke runs of every benchmark in --tiny mode (not timings: figures are not checked).

Each benchmark must run end to end through `bench.run.main`, write its JSON
with the expected keys, finite and positive numbers where they are rates,
sizes or times, a `met` flag per target, and its PNG where one is promised.
"""

from __future__ import annotations

import json
import math
import os

import pytest

from bench import BENCHMARKS, run

PNG = {"throughput", "resume", "memory"}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Runs all benchmarks once (tiny) with a private corpus cache."""
    out = tmp_path_factory.mktemp("bench_results")
    cache = tmp_path_factory.mktemp("bench_cache")
    previous = os.environ.get("XLSTM_DATA_BENCH_CACHE")
    os.environ["XLSTM_DATA_BENCH_CACHE"] = str(cache)
    try:
        code = run.main([*BENCHMARKS, "--tiny", "--out", str(out), "--verbose"])
    finally:
        if previous is None:
            os.environ.pop("XLSTM_DATA_BENCH_CACHE", None)
        else:
            os.environ["XLSTM_DATA_BENCH_CACHE"] = previous
    assert code == 0
    return out


def _load(out, name):
    result = json.loads((out / f"{name}.json").read_text())
    assert result["benchmark"] == name
    assert result["mode"] == "tiny"
    assert "--tiny" in result["command"]
    assert isinstance(result["met"], bool)
    assert result["targets"], "every benchmark states its targets"
    for target in result["targets"]:
        assert {"metric", "value", "threshold", "comparison", "description", "met"} <= set(target)
        assert isinstance(target["met"], bool)
        assert math.isfinite(target["value"])
    assert result["met"] == all(t["met"] for t in result["targets"])
    if name in PNG:
        png = out / f"{name}.png"
        assert png.exists() and png.stat().st_size > 1000
        assert result["png"] == png.name
    return result


def _positive_stats(stats):
    assert {"median", "min", "max", "values"} <= set(stats)
    assert stats["min"] <= stats["median"] <= stats["max"]
    assert all(math.isfinite(v) and v > 0 for v in stats["values"])


def test_throughput(results):
    result = _load(results, "throughput")
    assert set(result["variants"]) >= {"packed-w0-1src", "padded-w0-3src", "packed-w2-3src"}
    for variant in result["variants"].values():
        assert set(variant["tokens_per_sec"]) == {"ceiling", "grain", "ours_host", "ours_global"}
        for stats in variant["tokens_per_sec"].values():
            _positive_stats(stats)
        for ratio in ("ours_over_grain", "ours_over_ceiling", "ours_global_over_grain"):
            _positive_stats(variant[ratio])
    assert len(result["targets"]) == len(result["variants"])


def test_resume(results):
    result = _load(results, "resume")
    assert set(result["resume_secs"]) == {"10", "100", "1000"}
    for stats in result["resume_secs"].values():
        _positive_stats(stats)
    _positive_stats(result["fresh_first_batch_secs"])
    assert result["largest_over_smallest"] > 0
    assert result["first_batch_matches"] is True


def test_loop_wait(results):
    result = _load(results, "loop_wait")
    _positive_stats(result["train_secs"])
    assert 0 <= result["wait_share"]["median"] < 1
    assert all(r["steps"] == 12 and r["data_wait_secs"] >= 0 for r in result["runs"])


def test_memory(results):
    result = _load(results, "memory")
    (run_,) = result["runs"]
    assert run_["steps"][0] == 1 and run_["steps"][-1] == 400
    assert run_["rss_after_process_warmup_mb"] > 0  # a throwaway iterator ran first
    assert all(math.isfinite(v) and v > 0 for v in run_["rss_mb"])
    assert math.isfinite(result["growth_mb"]["median"])
    soak = result["worker_soak"]
    assert soak["steps"][-1] == 400 and soak["warm_step"] == 40
    assert len(soak["workers"]) == 2
    for worker in soak["workers"]:
        assert len(worker["rss_mb"]) == len(soak["steps"])
        assert all(math.isfinite(v) and v > 0 for v in worker["rss_mb"])
        assert math.isfinite(worker["growth_after_warmup_mb"])


def test_plan_throughput(results):
    result = _load(results, "plan_throughput")
    assert set(result["variants"]) == {"w0-1src", "w0-3src"}
    for variant in result["variants"].values():
        assert set(variant["tokens_per_sec"]) == {
            "ceiling",
            "ceiling_batched",
            "grain",
            "planned",
            "planned_global",
        }
        for stats in variant["tokens_per_sec"].values():
            _positive_stats(stats)
        for ratio in (
            "planned_over_grain",
            "planned_over_ceiling",
            "planned_over_ceiling_batched",
            "planned_global_over_grain",
        ):
            _positive_stats(variant[ratio])
        assert all(0 < share <= 1 for share in variant["non_padding_share"].values())
    assert len(result["targets"]) == 2 * len(result["variants"])


def test_cold_start(results):
    result = _load(results, "cold_start")
    (size,) = result["documents"].values()
    _positive_stats(size["secs"])
    _positive_stats(size["peak_rss_mb"])


def test_plan_packing(results):
    result = _load(results, "plan_packing")
    assert set(result["modes"]) == {"best_fit", "first_fit", "concat", "none"}
    for figures in result["modes"].values():
        assert 0 < figures["non_padding_share"] <= 1
        assert 0 <= figures["split_beyond_necessity_share"] <= 1
        assert figures["planning_ms_per_step"] > 0
    # Only concat cuts documents that fit a row; best_fit and none never do.
    assert result["modes"]["best_fit"]["split_beyond_necessity"] == 0
    assert result["modes"]["none"]["split_beyond_necessity"] == 0


def test_plan(results):
    result = _load(results, "plan")
    for stats in result["resume_secs"].values():
        _positive_stats(stats)
    assert all(ms > 0 for ms in result["planning_ms_per_step_by_hosts"].values())
    assert set(result["planning_share_by_stride"]) == {"1", "2"}
    for figures in result["planning_share_by_stride"].values():
        _positive_stats(figures["cpu_ms_per_step"])
        assert 0 < figures["share"]["median"] < 1
    assert "planning_share_stride_1" in {t["metric"] for t in result["targets"]}


def test_device_overlap(results):
    result = _load(results, "device_overlap")
    assert result["platform"] == "cpu"  # the suite has no accelerator: a smoke run
    assert result["settings"]["iterations"] >= 1
    assert result["step_secs"] > 0 and result["loop_secs"] > 0 and result["batch_bytes"] > 0
    _positive_stats(result["transfer_secs"])
    assert 0 <= result["wait_share"] < 1
    assert result["warmup_longest_wait_secs"] >= 0 and result["warmup_longest_wait_step"] >= 1
    assert [t["metric"] for t in result["targets"]] == ["wait_share"]


def test_unknown_benchmark_is_refused(capsys):
    assert run.main(["no_such_benchmark", "--tiny"]) == 2
    assert "unknown benchmark(s) ['no_such_benchmark']; choose from" in capsys.readouterr().err


def test_plan_mixture(results):
    result = _load(results, "plan_mixture")
    assert set(result["scenarios"]) == {
        "two_stages",
        "rampup_short_stages",
        "one_stage",
        "small_source_many_hosts",
        "short_and_long_1_to_1",
    }
    for figures in result["scenarios"].values():
        for stage in figures["stages"]:
            assert abs(sum(stage["served"]) - 1) < 1e-9


def test_plan_mixture_measures_online_updates(results):
    result = _load(results, "plan_mixture")
    for arm in ("in_process", "two_workers"):
        figures = result["online_updates"][arm]
        assert figures["updates_per_run"] == 2
        assert figures["updates"]["update_secs"]["median"] > 0
        assert figures["plain"]["update_secs"]["median"] == 0


def test_our_host_steps_are_the_iterators_own_steps_read_from_its_workers_slots():
    """`bench.run throughput`'s `ours_host`: the iterator's own chunk pipeline, step by step.

    With a worker, past the steps computed in this process, each step comes
    from a worker's slot; every `iter()` starts at step 0 again, and each
    chunk's slot is given back (else the worker would wait for it forever).
    """
    import itertools

    import numpy as np

    from bench import common
    from xlstm_data import create_mesh, iterators_from_config

    data = {
        "train": {"a": {"kind": "synthetic", "num_documents": 2000, "mean_length": 80}},
        "global_batch_size": 8,
        "max_target_length": 64,
        "worker_buffer_size": 1,
    }
    mesh = create_mesh()
    inline, _ = iterators_from_config(data, mesh)
    steps = 80
    try:
        expected = [
            {k: np.asarray(v) for k, v in next(inline).to_dict().items()} for _ in range(steps)
        ]
    finally:
        inline.close()
    with_workers, _ = iterators_from_config({**data, "worker_count": 1}, mesh)
    try:
        host = common.OurHostSteps(with_workers)
        for take in (steps, 10):  # a second pass starts again at step 0
            got = [
                {k: np.array(v) for k, v in fields.items()}
                for fields in itertools.islice(iter(host), take)
            ]
            for step, (fields, want) in enumerate(zip(got, expected, strict=False)):
                for key, value in fields.items():
                    np.testing.assert_array_equal(value, want[key], err_msg=f"{step} {key}")
    finally:
        with_workers.close()
