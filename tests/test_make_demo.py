"""`make demo`, the README's command that continues it on 2 processes, and its loss spike.

The longest test of the suite (about 2 minutes of CPU on 2 cores), in a module of
its own so that pytest-xdist (`--dist loadfile`) can run it beside the other
documented commands instead of after them.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

from tests.multiprocess import REPO, free_port, run_train_processes, subprocess_env
from tests.test_documented_commands import (
    ELASTIC,
    SPIKE_BATCHES,
    SPIKE_MOVE,
    SPIKE_RESUME,
    SPIKE_STEP,
    shell,
)


def test_make_demo(tmp_path):
    """`make demo`, the README's command that continues it on 2 processes, then its loss spike."""
    demo = tmp_path / "demo"
    result = subprocess.run(
        ["make", "demo", f"DEMO_DIR={demo}"],
        cwd=REPO,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=480,
    )
    assert result.returncode == 0, _failure(result)
    assert "30 replayed steps compared with the pre-emption run: all identical" in result.stdout

    command = ELASTIC.replace("demo_workdir", str(demo)).replace(
        "127.0.0.1:1234", f"127.0.0.1:{free_port()}"
    )
    outputs = run_train_processes(2, *shlex.split(command)[3:])
    assert "resumed_from_step: 300" in outputs[0] and "final_step: 320" in outputs[0]
    lines = (demo / "batches.jsonl").read_text().splitlines()
    log = [json.loads(line) for line in lines if line.endswith("}")]
    assert [r["step"] for r in log if r["step"] > 300] == list(range(301, 321))
    data = demo / "checkpoints" / "320" / "data"
    assert sorted(p.name for p in data.glob("*.json")) == [
        "process_0-of-2.json",
        "process_1-of-2.json",
    ]
    _after_a_loss_spike(demo, log)


def _failure(result: subprocess.CompletedProcess) -> str:
    """The output's tail, and where a crash began (JAX's fatal line, above its thread dump)."""
    err = result.stderr
    begun = min(
        (i for i in (err.find("Fatal Python error"), err.find("Check failed")) if i >= 0),
        default=-1,
    )
    start = (
        "" if begun < 0 else f"--- crash began ---\n{err[max(0, begun - 3000) : begun + 1500]}\n"
    )
    return f"{result.stdout[-3000:]}\n{start}--- stderr tail ---\n{err[-3000:]}"


def _after_a_loss_spike(demo: Path, log: list[dict]) -> None:
    """The README's loss-spike section, run as written on the continued demo run."""
    listed, _, resumed, step = [
        shell(command.replace("demo_workdir", str(demo)), REPO)
        for command in (SPIKE_BATCHES, SPIKE_MOVE, SPIKE_RESUME, SPIKE_STEP)
    ]
    rows = re.findall(r"^  row +\d+ host +(\d+) ", listed.stdout, re.M)
    assert len(rows) == 8 * 32 and set(rows) == {"0", "1"}  # 8 steps of 32 rows, 2 hosts
    assert "step 317 (trained by update 318): 32 rows" in listed.stdout
    assert re.search(r'^      \w+#\d+: ".+"$', listed.stdout, re.M)  # decoded text
    assert "resumed_from_step: 300" in resumed.stdout and "final_step: 340" in resumed.stdout
    assert "step 330 (trained by update 331, data step 350): 32 rows" in step.stdout
    before = {r["step"]: r for r in log}
    lines = (demo / "batches.jsonl").read_text().splitlines()
    after = [json.loads(line) for line in lines if line.endswith("}")][-40:]
    assert [(r["step"], r["data_step"]) for r in after] == [(s, s + 19) for s in range(301, 341)]
    # The skipped data is not trained on: update 301 differs from the first run's.
    assert after[0]["fingerprint"] != before[301]["fingerprint"]
