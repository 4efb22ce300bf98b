"""A loop written as Flax's lm1b is, on a ('data', 'fsdp', 'tensor') mesh, killed and resumed.

The loop (`tests/lm1b_style_loop.py`) is not ours: its own config keys, dict
access to the batch, its own `in_shardings`, 0-based steps and orbax calls.
A run killed with SIGKILL after step 6 (checkpoint at step 4) and rerun
must log the same batches and losses as an uninterrupted run for every step.
"""

from __future__ import annotations

import json
import subprocess
import sys

from tests.multiprocess import REPO, subprocess_env

LOOP = REPO / "tests" / "lm1b_style_loop.py"


def _run(workdir, *args, expect=0):
    result = subprocess.run(
        [sys.executable, str(LOOP), str(workdir), *args],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert result.returncode == expect, result.stderr[-4000:]


def _steps(workdir):
    lines = (workdir / "steps.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def test_an_lm1b_style_loop_resumes_on_exactly_the_next_batch_after_sigkill(tmp_path):
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    straight.mkdir()
    killed.mkdir()
    _run(straight)
    _run(killed, "6", expect=-9)
    _run(killed)
    expected = {r["step"]: r for r in _steps(straight)}
    got = _steps(killed)
    assert [r["step"] for r in got] == [*range(7), *range(5, 12)]  # resumed after step 4
    for record in got:
        assert record["rows"] == expected[record["step"]]["rows"], record["step"]
        assert record["loss"] == expected[record["step"]]["loss"], record["step"]
