"""`bench/on_accelerator.sh`, the accelerator checks: every stage runs a real benchmark command.

The script runs on a lent GPU machine only (bench/README.md). Here its
interpreter is replaced by one that records its arguments, and each recorded
command is checked against the benchmarks' own command lines; the stages
themselves run in `test_bench.py` (device_overlap, loop_wait) and
`test_bench_peers.py` (ours with the peers missing).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from bench import BENCHMARKS
from bench.peers import __main__ as peers_cli

REPO = Path(__file__).resolve().parents[1]


def test_every_stage_runs_a_benchmark_command(tmp_path):
    calls_dir = tmp_path / "calls"
    calls_dir.mkdir()
    recorder = tmp_path / "python"  # one file per call, its arguments NUL-separated
    recorder.write_text(
        f"#!/usr/bin/env bash\nprintf '%s\\0' \"$@\" > {calls_dir}/$(ls {calls_dir} | wc -l)\n"
    )
    recorder.chmod(0o755)
    out = tmp_path / "out"
    env = dict(os.environ, XD_PYTHON=str(recorder), TINY="1")
    done = subprocess.run(
        ["bash", "bench/on_accelerator.sh", str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    files = sorted(calls_dir.iterdir(), key=lambda path: int(path.name))
    calls = [path.read_text().split("\0")[:-1] for path in files]
    modules = [call[1:] for call in calls if call[0] == "-m" and call[1] != "pip"]
    assert [m[0] for m in modules] == ["bench.run", "bench.peers", "bench.run"]
    run_names = [m[1] for m in modules if m[0] == "bench.run"]
    assert run_names == ["device_overlap", "loop_wait"] and set(run_names) <= set(BENCHMARKS)
    for module in modules:
        assert "--tiny" in module and module[module.index("--out") + 1] == str(out)
    peers = peers_cli.parse_args(modules[1][1:])
    assert peers.groups == "target6" and peers.tiny
    for stage in ("versions", "device_overlap", "peers_target6", "loop_wait"):
        assert f"== {stage}: exit 0" in done.stdout
