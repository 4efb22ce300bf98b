"""Runs a scenario in several real JAX processes on 127.0.0.1.

Each process is a fresh interpreter running `tests/mp_worker.py`, which calls
`jax.distributed.initialize` with short timeouts, runs the named scenario and
writes its result as JSON. Every subprocess has a timeout, and a failure in
any process fails the test with that process's output.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import portpicker

WORKER = Path(__file__).with_name("mp_worker.py")
REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    return portpicker.pick_unused_port()


def run_processes(
    scenario: str,
    num_processes: int,
    tmp_path: Path,
    params: dict[str, Any] | None = None,
    timeout: float = 120,
) -> list[Any]:
    """Runs `scenario` in `num_processes` processes and returns their results."""
    port = free_port()
    env = subprocess_env()
    procs = []
    for pid in range(num_processes):
        out = tmp_path / f"result_{scenario}_{pid}.json"
        cmd = [
            sys.executable,
            str(WORKER),
            f"--port={port}",
            f"--process_id={pid}",
            f"--num_processes={num_processes}",
            f"--scenario={scenario}",
            f"--params={json.dumps(params or {})}",
            f"--out={out}",
        ]
        log = open(tmp_path / f"log_{scenario}_{pid}.txt", "w")  # noqa: SIM115
        procs.append((subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT), out))
    failures = []
    for pid, (proc, _) in enumerate(procs):
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            for other, _ in procs:
                other.kill()
            code = "timeout"
        if code != 0:
            log = (tmp_path / f"log_{scenario}_{pid}.txt").read_text()[-4000:]
            failures.append(f"process {pid} exited with {code}:\n{log}")
    if failures:
        raise AssertionError("\n\n".join(failures))
    return [json.loads(out.read_text()) for _, out in procs]


#: On the subprocesses' PYTHONPATH: lets every process of a run read JAX's
#: compilation cache, not only the first (see its sitecustomize).
SUBPROCESS_SITE = REPO / "tests" / "subprocess_site"


#: XLA's CPU compiler at its fastest for every JAX process of the suite (conftest
#: sets them for the pytest processes too). The suite checks data, not model
#: speed, and most of its training runs compile steps no other run compiled:
#: a cold 3-step run of configs/demo.py on 8 CPU devices took 15.0-18.4 s of
#: CPU with the default passes and 10.8-10.9 s with these. Runs compared with
#: each other always share them, so their results stay bit-identical.
TEST_XLA_FLAGS = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"


def subprocess_env() -> dict[str, str]:
    """The environment of a fresh interpreter on this checkout, CPU only.

    JAX's persistent compilation cache settings come from conftest.
    """
    path = os.pathsep.join((str(REPO), str(SUBPROCESS_SITE)))
    return dict(os.environ, PYTHONPATH=path, XLA_FLAGS=TEST_XLA_FLAGS, JAX_PLATFORMS="cpu")


def run_train(*args: str, expect: int = 0, timeout: float = 240) -> subprocess.CompletedProcess:
    """Runs `python -m trainer_hooks.train ARGS` and checks its exit status."""
    result = subprocess.run(
        [sys.executable, "-m", "trainer_hooks.train", *args],
        env=subprocess_env(),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == expect, result.stdout[-3000:] + result.stderr[-5000:]
    return result


def run_train_processes(
    num_processes: int, *args: str, timeout: float = 300, **popen: Any
) -> list[str]:
    """`python -m trainer_hooks.train ARGS` as ranks 0..n-1 of one run; their outputs.

    `$RANK` in an argument is replaced by the process's rank, and a
    coordinator on a free loopback port is added unless one is given.
    """
    if not any(arg.startswith("--coordinator=") for arg in args):
        args = (*args, f"--coordinator=127.0.0.1:{free_port()}")
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "trainer_hooks.train",
                *[arg.replace("$RANK", str(rank)) for arg in args],
                f"--num_processes={num_processes}",
                "--initialization_timeout=60",
            ],
            env=subprocess_env(),
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            **popen,
        )
        for rank in range(num_processes)
    ]
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=timeout)[0])
    finally:
        for proc in procs:
            proc.kill()
    for rank, (proc, out) in enumerate(zip(procs, outputs, strict=True)):
        assert proc.returncode == 0, f"rank {rank} exited with {proc.returncode}:\n{out[-4000:]}"
    return outputs
