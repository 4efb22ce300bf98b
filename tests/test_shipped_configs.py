"""Every file in configs/ trains through `python -m trainer_hooks.train`, as users run it.

Users run the shipped configs on hosts with 8 devices, override keys the
config file does not set, and launch the multi-host config on several real
processes; each of those is a subprocess here, so a new config or a broken
override cannot ship.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.multiprocess import REPO, free_port

CONFIGS = sorted((REPO / "configs").glob("*.py"))


def train(workdir: Path, config: Path, *flags: str, timeout: float = 240) -> str:
    env = dict(os.environ, PYTHONPATH=str(REPO), XLA_FLAGS="", JAX_PLATFORMS="cpu")
    cmd = [
        sys.executable,
        "-m",
        "trainer_hooks.train",
        f"--config={config}",
        f"--workdir={workdir}",
        *flags,
    ]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return result.stdout


def batch_log(workdir: Path) -> list[dict]:
    return [json.loads(line) for line in (workdir / "batches.jsonl").read_text().splitlines()]


def test_configs_are_found():
    assert {c.name for c in CONFIGS} >= {"demo.py", "mixture_rampup.py", "multihost.py"}


@pytest.mark.parametrize("config", CONFIGS, ids=lambda path: path.stem)
def test_every_config_trains_on_an_8_device_host(tmp_path, config):
    out = train(tmp_path / "run", config, "--config.num_train_steps=3", "--cpu_devices=8")
    assert "final_step: 3" in out
    assert [row["step"] for row in batch_log(tmp_path / "run")] == [1, 2, 3]


def test_multihost_config_trains_on_one_process_with_4_devices(tmp_path):
    out = train(
        tmp_path / "run",
        REPO / "configs" / "multihost.py",
        "--config.num_train_steps=3",
        "--cpu_devices=4",
    )
    assert "final_step: 3" in out


def test_multihost_config_trains_on_2_processes_as_the_readme_shows(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO), XLA_FLAGS="", JAX_PLATFORMS="cpu")
    port = free_port()
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "trainer_hooks.train",
                f"--config={REPO / 'configs' / 'multihost.py'}",
                f"--workdir={tmp_path / 'run'}",
                f"--coordinator=127.0.0.1:{port}",
                "--num_processes=2",
                f"--process_id={pid}",
                "--cpu_devices=2",
                "--initialization_timeout=60",
                "--config.num_train_steps=3",
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for pid in range(2)
    ]
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=240)[0])
    finally:
        for proc in procs:
            proc.kill()
    for proc, out in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, out[-5000:]
    assert "final_step: 3" in outputs[0]
    assert (tmp_path / "run" / "checkpoints" / "3" / "data" / "process_1-of-2.json").exists()


def test_keys_the_config_does_not_set_can_be_overridden(tmp_path):
    # configs/multihost.py sets none of these keys; the rampup is a list (and a dict).
    out = train(
        tmp_path / "run",
        REPO / "configs" / "multihost.py",
        "--cpu_devices=4",
        "--config.num_train_steps=4",
        "--config.data.worker_count=2",
        "--config.data.read_threads=0",
        "--config.data.eod_token_id=1",
        "--config.data.rampup=[[0, 0.25], [2, 1.0]]",
        "--config.checkpoint.every_secs=600",
        "--config.model.vocab_size=300",
    )
    assert "final_step: 4" in out
    assert [row["batch_size"] for row in batch_log(tmp_path / "run")] == [4, 4, 16, 16]
    train(
        tmp_path / "dict",
        REPO / "configs" / "multihost.py",
        "--cpu_devices=4",
        "--config.num_train_steps=3",
        "--config.data.rampup={0: 0.5, 2: 1.0}",
    )
    assert [row["batch_size"] for row in batch_log(tmp_path / "dict")] == [8, 16, 16]


def test_an_unknown_override_is_refused_by_name(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO), XLA_FLAGS="", JAX_PLATFORMS="cpu")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainer_hooks.train",
            f"--config={REPO / 'configs' / 'demo.py'}",
            f"--workdir={tmp_path}",
            "--config.data.wroker_count=2",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "'wroker_count' is not in config.data; keys there:" in result.stderr
    assert "worker_count" in result.stderr and "Traceback" not in result.stderr


def test_train_writes_tensorboard_events_with_the_component_shares(tmp_path):
    from tests.test_writers import scalars

    train(
        tmp_path / "run",
        REPO / "tests" / "train_config.py",
        "--cpu_devices=2",
        "--config.num_train_steps=5",
        "--writer=tensorboard",
    )
    written = scalars(tmp_path / "run" / "tensorboard")
    assert {"data/share/long", "data/share/short", "train/loss"} <= set(written)
    assert 0.0 < written["data/share/long"][5] < 1.0
    assert (tmp_path / "run" / "metrics.jsonl").exists()


def test_a_mesh_without_dp_or_fsdp_trains_with_its_batch_axis_named(tmp_path):
    run = tmp_path / "run"
    out = train(
        run,
        REPO / "tests" / "train_config.py",
        "--cpu_devices=4",
        "--config.num_train_steps=2",
        "--config.mesh.axis_dims=data:-1",
        "--config.mesh.batch_axis_names=data",
    )
    assert "final_step: 2" in out
    env = dict(os.environ, PYTHONPATH=str(REPO), XLA_FLAGS="", JAX_PLATFORMS="cpu")
    refused = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainer_hooks.train",
            f"--config={REPO / 'tests' / 'train_config.py'}",
            f"--workdir={tmp_path / 'refused'}",
            "--cpu_devices=4",
            "--config.mesh.axis_dims=data:-1",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode != 0
    assert "batch_axis_names" in refused.stderr
