"""Every README code block runs as written, with several devices where it matters.

Users copy the examples into a plain Python script on hosts with several
devices, and run the hooks example again after a pre-emption. So each block
runs in a fresh interpreter (not under pytest's 4-device setup), the hooks
example twice with 2 devices and twice on 2 real processes, and the resumed
runs are compared batch by batch with an uninterrupted one.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.multiprocess import REPO, free_port, subprocess_env

README = REPO / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
HOOKS_EXAMPLE = next(block for block in BLOCKS if "CheckpointHook" in block)
EXAMPLE_WORKDIR = '"/tmp/xlstm-data-hooks-example"'
RUN_LENGTH = "start_step + 10"

PRELUDE = """
import json, os, sys
import jax
jax.config.update("jax_num_cpu_devices", {devices})
if {num_processes} > 1:
    jax.distributed.initialize(
        coordinator_address="127.0.0.1:{port}", num_processes={num_processes},
        process_id={process_id}, initialization_timeout=60,
    )
import numpy as np
import xlstm_data
from trainer_hooks.batch_log import batch_fingerprint

FINGERPRINTS = []
_next = xlstm_data.MultiHostDataLoadIterator.__next__

def _recording_next(self):
    batch = _next(self)
    if self.reset_after_epoch is False:
        FINGERPRINTS.append(batch_fingerprint(batch))
    return batch

xlstm_data.MultiHostDataLoadIterator.__next__ = _recording_next
"""

EPILOGUE = """
from jax.experimental import multihost_utils
params = multihost_utils.process_allgather(state["params"], tiled=True)
with open({out!r}, "w") as f:
    json.dump({{"start_step": start_step, "last_step": last_step,
               "fingerprints": FINGERPRINTS, "params": np.asarray(params).tolist(),
               "steps": manager.all_steps()}}, f)
train_iter.close()
manager.close()
"""


def run_block(
    block: str, tmp_path: Path, *, devices: int, num_processes: int = 1, tag: str = "run"
) -> list[dict]:
    """Runs `block` in `num_processes` fresh interpreters; returns their JSON results."""
    port = free_port()
    # XLA's CPU client needs 2 threads per device for collectives across processes
    # (see trainer_hooks.train._size_the_cpu_thread_pool), as the README says.
    env = dict(subprocess_env(), PJRT_NPROC=str(2 * devices))
    procs = []
    for pid in range(num_processes):
        out = tmp_path / f"{tag}_{pid}.json"
        script = (
            PRELUDE.format(devices=devices, num_processes=num_processes, port=port, process_id=pid)
            + block
            + EPILOGUE.format(out=str(out))
        )
        path = tmp_path / f"{tag}_{pid}.py"
        path.write_text(script)
        procs.append(
            (
                subprocess.Popen(
                    [sys.executable, str(path)],
                    env=env,
                    cwd=tmp_path,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                ),
                out,
            )
        )
    results = []
    try:
        for proc, out in procs:
            log = proc.communicate(timeout=240)[0]
            assert proc.returncode == 0, log[-5000:]
            results.append({**json.loads(out.read_text()), "log": log})
    finally:
        for proc, _ in procs:
            proc.kill()
    return results


def test_readme_example_runs(capsys):
    namespace: dict = {}
    exec(compile(BLOCKS[0], str(README), "exec"), namespace)  # noqa: S102
    assert namespace["batch"].inputs.shape == (48, 512)
    assert namespace["state"]["step"] == 1
    assert "(48, 512)" in capsys.readouterr().out
    namespace["iterator"].close()


def run_plain_script(block: str, tmp_path: Path, devices: int) -> str:
    """Runs a README block as a user's plain script on `devices` CPU devices; its stdout."""
    script = f"import jax\njax.config.update('jax_num_cpu_devices', {devices})\n" + block
    (tmp_path / "example.py").write_text(script)
    result = subprocess.run(
        [sys.executable, "example.py"],
        cwd=tmp_path,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return result.stdout


def test_readme_first_example_runs_in_a_plain_script_on_8_devices(tmp_path):
    assert "(48, 512)" in run_plain_script(BLOCKS[0], tmp_path, devices=8)


def hooks_example(workdir: Path, steps_per_run: int = 10) -> str:
    assert EXAMPLE_WORKDIR in HOOKS_EXAMPLE and RUN_LENGTH in HOOKS_EXAMPLE
    return HOOKS_EXAMPLE.replace(EXAMPLE_WORKDIR, repr(str(workdir))).replace(
        RUN_LENGTH, f"start_step + {steps_per_run}"
    )


@pytest.mark.parametrize("num_processes", [1, 2], ids=["2_devices", "2_processes"])
def test_readme_hooks_example_resumes_when_run_twice(tmp_path, num_processes):
    devices = 2
    resumed = hooks_example(tmp_path / "resumed")
    first = run_block(resumed, tmp_path, devices=devices, num_processes=num_processes, tag="a")
    second = run_block(resumed, tmp_path, devices=devices, num_processes=num_processes, tag="b")
    straight = run_block(
        hooks_example(tmp_path / "straight", steps_per_run=20),
        tmp_path,
        devices=devices,
        num_processes=num_processes,
        tag="c",
    )
    for pid in range(num_processes):
        assert (first[pid]["start_step"], first[pid]["last_step"]) == (0, 10)
        assert (second[pid]["start_step"], second[pid]["last_step"]) == (10, 20)
        assert second[pid]["steps"] == [15, 20]
        assert "trained steps 11-20, checkpoints [15, 20]" in second[pid]["log"]
        # The resumed run saw exactly the batches of steps 11-20 of an uninterrupted run.
        assert (
            first[pid]["fingerprints"] + second[pid]["fingerprints"]
            == (straight[pid]["fingerprints"])
        )
        assert second[pid]["params"] == straight[pid]["params"]
    share = float(re.search(r"web token share: ([0-9.]+)", second[0]["log"]).group(1))
    assert 0.6 < share < 1.0


def test_readme_online_mixing_example_runs_in_a_plain_script_on_2_devices(tmp_path):
    block = next(block for block in BLOCKS if "set_mixture" in block)
    out = run_plain_script(block, tmp_path, devices=2)
    assert "('code', 'web') 1.0" in out
    losses = re.search(r"loss per dataset: (\{.*\})", out).group(1)
    assert "data/loss/web" in losses and "data/loss/code" in losses


def test_readme_python_blocks_are_all_tested():
    # A new block must get a test here: the first example, the hooks example and
    # the online mixing example.
    assert len(BLOCKS) == 3, [block.splitlines()[0] for block in BLOCKS]


def test_readme_documents_both_setup_commands():
    text = README.read_text()
    assert "make demo" in text and "make test" in text


def test_readme_prelude_is_valid_python():
    compile(textwrap.dedent(PRELUDE), "prelude", "exec")
