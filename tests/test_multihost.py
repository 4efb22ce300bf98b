"""Real multi-process tests: several JAX processes on 127.0.0.1, 2 CPU devices each."""

from __future__ import annotations

import collections
import subprocess
import sys

import pytest

from tests.multiprocess import run_processes, subprocess_env


def _tokens_by_data_host(results) -> dict[int, list[int]]:
    """Real (segmentation != 0) input tokens of each data-loading host, over all steps.

    Processes of the same data-loading host must hold identical rows; that is
    asserted here too.
    """
    by_host: dict[int, dict] = {}
    for result in results:
        rows = [(step["inputs"], step["segmentation"]) for step in result["steps"]]
        if result["host_index"] in by_host:
            assert by_host[result["host_index"]] == rows, "replica processes loaded different rows"
        by_host[result["host_index"]] = rows
    tokens = {}
    for host, rows in by_host.items():
        tokens[host] = [
            tok
            for inputs, segmentation in rows
            for r in inputs
            for tok, seg in zip(inputs[r], segmentation[r], strict=True)
            if seg != 0
        ]
    return tokens


@pytest.mark.parametrize("num_processes", [2, 4])
@pytest.mark.parametrize("packing", [False, True])
def test_one_epoch_covers_every_document_once(tmp_path, num_processes, packing):
    # 37 documents do not divide over 2 or 4 hosts: hosts end at different steps.
    params = {"num_docs": 37, "global_batch_size": 4 * num_processes, "packing": packing}
    results = run_processes("epoch", num_processes, tmp_path, params)
    assert {r["host_count"] for r in results} == {num_processes}
    num_steps = {len(r["steps"]) for r in results}
    assert len(num_steps) == 1, f"hosts yielded different step counts: {num_steps}"
    for result in results:
        for step in result["steps"]:
            assert step["shape"] == [4 * num_processes, 16]
            assert step["spec"] == "P(('dp', 'fsdp'),)"
    tokens = _tokens_by_data_host(results)
    seen = collections.Counter(t for host_tokens in tokens.values() for t in host_tokens)
    expected = collections.Counter(results[0]["all_tokens"])
    assert seen == expected


def test_tp_spanning_two_processes_loads_identical_rows(tmp_path):
    # Chunks of 2 steps through the compiled pick: from local rows on two processes.
    params = {
        "num_docs": 20,
        "global_batch_size": 4,
        "device_order": "tp_across_processes",
        "pytree_steps": 0,
        "chunk_tokens": 8 * 16,  # 8 rows of 16
    }
    results = run_processes("epoch", 2, tmp_path, params)
    assert [r["host_count"] for r in results] == [1, 1]
    assert all(r["picked"] for r in results)
    assert results[0]["steps"] == results[1]["steps"]
    tokens = _tokens_by_data_host(results)
    assert collections.Counter(tokens[0]) == collections.Counter(results[0]["all_tokens"])


def test_tp_over_two_of_four_processes(tmp_path):
    # 8 devices, tp=4 spans processes {0,1} and {2,3}: two data-loading hosts.
    params = {
        "num_docs": 30,
        "global_batch_size": 4,
        "mesh": "dp:1,fsdp:2,tp:4,sp:1",
        "pytree_steps": 0,  # chunks of 4 steps of 2 rows through the compiled pick
        "chunk_tokens": 8 * 16,  # 8 rows of 16
    }
    results = run_processes("epoch", 4, tmp_path, params)
    assert [r["host_index"] for r in results] == [0, 0, 1, 1]
    assert all(r["picked"] for r in results)
    tokens = _tokens_by_data_host(results)
    seen = collections.Counter(t for host_tokens in tokens.values() for t in host_tokens)
    assert seen == collections.Counter(results[0]["all_tokens"])


def test_drop_remainder_stops_all_hosts_at_the_first_end(tmp_path):
    params = {"num_docs": 37, "global_batch_size": 8, "drop_remainder": True}
    results = run_processes("epoch", 2, tmp_path, params)
    assert len({len(r["steps"]) for r in results}) == 1
    for result in results:
        for step in result["steps"]:
            for row in step["segmentation"].values():
                assert any(row), "drop_remainder must not yield padding rows"


def test_rampup_restore_inside_and_across_stages_on_two_processes(tmp_path):
    # Both transfers: chunks of 2 steps, picked when whole, pytrees when a stage splits one.
    params = {"restore_steps": [1, 3, 4, 6, 7], "pytree_steps": 1, "chunk_tokens": 16 * 32}
    results = run_processes("rampup_resume", 2, tmp_path, params)
    expected = [[8, 32]] * 3 + [[12, 32]] * 3 + [[16, 32]] * 3
    for result in results:
        assert result["picked"]
        assert result["shapes"] == expected
        assert result["mismatches"] == []
        assert result["states_past_first_block"] >= 3  # the restores start mid-plan


def test_every_test_subprocess_keys_jaxs_compilation_cache_alike():
    """`tests/subprocess_site` is in force: its key is the same in every process of a run."""
    script = "import jax._src.cache_key as k; print(k._hash_accelerator_config.__qualname__)"
    result = subprocess.run(
        [sys.executable, "-c", script],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.stdout.split() == [
        "_hash_devices_everywhere_alike.<locals>._hash_accelerator_config"
    ], result.stderr[-2000:]
