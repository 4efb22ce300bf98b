"""A checkpoint resumes on another number of processes with identical global batches.

Real processes (`python -m trainer_hooks.train`, `jax.distributed` on
127.0.0.1, 2 CPU devices each): a 2-process run with a 2-component mixture, a
mixture stage change at step 5, a ramp-up and packing trains 7 steps and
checkpoints; the checkpoint is resumed on 3 processes and, separately, on 1.
Steps 8..15 of both must equal an uninterrupted 2-process run, compared by the
fingerprint of the gathered global batch. Losses are not compared: another
device count reduces in another order.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.multiprocess import REPO, run_train, run_train_processes

CONFIG = REPO / "tests" / "train_config.py"
STEPS = 15
SAVED_AT = 7
SETTINGS = (
    f"--config={CONFIG}",
    "--cpu_devices=2",
    "--config.data.global_batch_size=24",
    "--config.data.eval_global_batch_size=12",
    "--config.data.mixture_schedule=[[0, {'long': 0.7, 'short': 0.3}], [5, {'long': 0.2, "
    "'short': 0.8}]]",
    f"--config.checkpoint.every_steps={SAVED_AT}",
    "--config.eval_every_steps=0",
)


def batches(workdir: Path) -> dict[int, tuple[str, int]]:
    lines = (workdir / "batches.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines if line.endswith("}")]
    return {r["step"]: (r["fingerprint"], r["batch_size"]) for r in records}


def train(workdir: Path, processes: int, steps: int) -> None:
    args = (*SETTINGS, f"--workdir={workdir}", f"--config.num_train_steps={steps}")
    if processes == 1:
        run_train(*args)
    else:
        run_train_processes(processes, *args, "--process_id=$RANK")


def test_a_checkpoint_resumes_on_3_and_on_1_process_with_identical_global_batches(tmp_path):
    reference = tmp_path / "reference"
    train(reference, 2, STEPS)
    expected = batches(reference)
    assert sorted(expected) == list(range(1, STEPS + 1))
    assert {expected[1][1], expected[STEPS][1]} == {12, 24}  # the ramp-up

    saved = tmp_path / "saved"
    train(saved, 2, SAVED_AT)
    assert (saved / "checkpoints" / str(SAVED_AT)).is_dir()
    for processes in (3, 1):
        resumed = tmp_path / f"resumed_on_{processes}"
        shutil.copytree(saved, resumed)
        train(resumed, processes, STEPS)
        got = batches(resumed)
        for step in range(SAVED_AT + 1, STEPS + 1):
            assert got[step] == expected[step], f"step {step} differs on {processes} processes"


def test_readme_elastic_commands_as_written(tmp_path):
    """The README's demo trained on 1 process, then continued on 2."""
    from tests.test_documented_commands import ELASTIC_FIRST, ELASTIC_SECOND

    workdir = tmp_path / "elastic"
    first = ELASTIC_FIRST.replace("/tmp/elastic", str(workdir)).split()[3:]
    run_train(*first)
    second = ELASTIC_SECOND.replace("/tmp/elastic", str(workdir)).split()[3:]
    second = [a for a in second if not a.startswith(("--coordinator=", "--num_processes="))]
    run_train_processes(2, *second)
    steps = [r for r in batches(workdir)]
    assert steps == list(range(1, 31))
    log = (workdir / "batches.jsonl").read_text().splitlines()
    numbered = [json.loads(line)["step"] for line in log if line.endswith("}")]
    assert numbered == list(range(1, 31)), "the second run resumed at step 21, not over"
