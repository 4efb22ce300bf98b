"""End to end: a training run killed, pre-empted or moved resumes on exactly the next batch.

Each run is `python -m trainer_hooks.train` in fresh processes
(`tests/train_config.py`: a 2-component mixture with a stage change at step
5, a ramp-up at step 10, packing). The killed run is started with a much
larger `num_train_steps` so it is surely still running when it is killed at a
random moment after its first checkpoint (possibly during an async save); it
is then rerun to step 30. Nothing in the run depends on `num_train_steps`
(constant learning rate after warm-up), so every logged step must match the
uninterrupted run: the batch fingerprint (data position) and the loss (model
state), bit for bit.

The uninterrupted 2-process run's checkpoint at step 7 is also resumed on 3
processes, and on 1 with data steps skipped (the data plan does not depend on
the process count): the global batches, compared by the fingerprint of their
gathered content, must equal the uninterrupted run's. Losses are not compared there:
another device count reduces in another order.

Pre-emption: a SIGTERM (a scheduler's pre-emption notice) saves the current
step, and a rerun resumes. `trainer_hooks.train` runs JAX's preemption
service (on one process too), and `CheckpointHook` follows orbax's
pre-emption policy: at the sync point every process agrees on after the
signal, it saves model and data position and the run exits with status 143.
The rerun must continue on exactly the next batch (compared with an
uninterrupted run without workers): on one process with 2 grain workers, the
signal sent to the whole process group as SLURM does (the workers must
survive it), and on two processes where only one process got the signal.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.multiprocess import REPO, free_port, subprocess_env

CONFIG = REPO / "tests" / "train_config.py"
STEPS = 30
CHECKPOINT_EVERY = 4
#: Checkpoints every 7 steps, all kept.
EVERY_7 = ("--config.checkpoint.every_steps=7", "--config.checkpoint.max_to_keep=None")


def launch(workdir: Path, num_processes: int, *flags: str) -> list[subprocess.Popen]:
    env = subprocess_env()
    port = free_port()
    procs = []
    for pid in range(num_processes):
        cmd = [
            sys.executable,
            "-m",
            "trainer_hooks.train",
            f"--config={CONFIG}",
            f"--workdir={workdir}",
            "--cpu_devices=2",
            *flags,
        ]
        if num_processes > 1:
            cmd += [
                f"--coordinator=127.0.0.1:{port}",
                f"--num_processes={num_processes}",
                f"--process_id={pid}",
                "--initialization_timeout=60",
            ]
        log = workdir.parent / f"{workdir.name}_{pid}_{time.time_ns()}.log"
        with open(log, "w") as out:
            # Its own session: a signal to its process group reaches its workers, not pytest.
            proc = subprocess.Popen(
                cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        proc.log = log
        procs.append(proc)
    return procs


def wait_all(procs: list[subprocess.Popen], timeout: float = 180, expect: int = 0) -> str:
    """Waits for the processes; returns process 0's output."""
    for proc in procs:
        code = proc.wait(timeout=timeout)
        assert code == expect, f"exit {code}:\n{proc.log.read_text()[-4000:]}"
    return procs[0].log.read_text()


def records(workdir: Path) -> list[dict]:
    path = workdir / "batches.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def committed_steps(workdir: Path) -> list[int]:
    directory = workdir / "checkpoints"
    if not directory.exists():
        return []
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())


def run_killed_then_resumed(tmp_path: Path, num_processes: int, seed: int) -> tuple[Path, int]:
    """Kills a run at a random moment after its first checkpoint, then resumes it."""
    workdir = tmp_path / "interrupted"
    workdir.mkdir()
    procs = launch(workdir, num_processes, "--config.num_train_steps=100000")
    deadline = time.monotonic() + 180
    kill_after = 12 + random.Random(seed).randint(0, 6)
    while time.monotonic() < deadline:
        done = records(workdir)
        if committed_steps(workdir) and done and done[-1]["step"] >= kill_after:
            break
        assert all(p.poll() is None for p in procs), "the run ended before it was killed"
        time.sleep(0.005)
    time.sleep(random.Random(seed + 1).uniform(0, 0.05))
    for proc in procs:
        proc.send_signal(signal.SIGKILL)
    for proc in procs:
        assert proc.wait(timeout=30) == -signal.SIGKILL
    killed_at = records(workdir)[-1]["step"]
    assert killed_at < STEPS
    wait_all(launch(workdir, num_processes))
    return workdir, killed_at


def check_resume_matches(reference: Path, resumed: Path, killed_at: int) -> None:
    expected = {r["step"]: r for r in records(reference)}
    assert sorted(expected) == list(range(1, STEPS + 1))
    got = records(resumed)
    assert {r["step"] for r in got} == set(range(1, STEPS + 1))
    restarts = [i for i in range(1, len(got)) if got[i]["step"] <= got[i - 1]["step"]]
    assert len(restarts) == 1, "exactly one resume"
    resumed_from = got[restarts[0]]["step"] - 1
    assert resumed_from >= CHECKPOINT_EVERY and resumed_from % CHECKPOINT_EVERY == 0
    assert resumed_from <= killed_at
    for record in got:
        want = expected[record["step"]]
        assert (record["fingerprint"], record["batch_size"], record["loss"]) == (
            want["fingerprint"],
            want["batch_size"],
            want["loss"],
        ), f"step {record['step']} differs after resuming from step {resumed_from}"
    # The ramp-up really changed the batch size within the run.
    assert {expected[1]["batch_size"], expected[STEPS]["batch_size"]} == {12, 24}
    assert committed_steps(resumed) == [28, 30]  # max_to_keep=2


@pytest.fixture(scope="module")
def uninterrupted_run(tmp_path_factory):
    """`uninterrupted_run(n)`: the workdir of a 30-step `tests/train_config.py` run, n processes.

    It checkpoints every 7 steps and keeps every checkpoint.

    Run once per process count for the module: the kill, pre-emption and
    elastic tests compare their resumed runs with the same reference.
    """
    done = {}

    def run(num_processes: int):
        if num_processes not in done:
            workdir = tmp_path_factory.mktemp(f"uninterrupted_{num_processes}") / "reference"
            workdir.mkdir()
            # Every checkpoint is kept (saves change neither data nor model): the
            # elastic test resumes its step 7 on other process counts.
            wait_all(launch(workdir, num_processes, *EVERY_7))
            done[num_processes] = workdir
        return done[num_processes]

    return run


def test_sigkilled_run_resumes_on_exactly_the_next_batch(tmp_path, uninterrupted_run):
    reference = uninterrupted_run(1)
    resumed, killed_at = run_killed_then_resumed(tmp_path, 1, seed=0)
    check_resume_matches(reference, resumed, killed_at)
    metrics = [json.loads(line) for line in (resumed / "metrics.jsonl").read_text().splitlines()]
    assert any("data/share/long" in m for m in metrics)
    assert any("eval/held_out/loss" in m for m in metrics)

    # Moving an already-trained stage is refused, naming the key and the step (a new
    # stage from the checkpoint's step on is accepted as it is: stages are causal;
    # test_data_control checks that it equals a run that had it)...
    stages = "[0, {'long': 0.7, 'short': 0.3}], [6, {'long': 0.2, 'short': 0.8}], "
    stages += "[31, {'long': 0.5, 'short': 0.5}]"
    moved = ["--config.num_train_steps=32", f"--config.data.mixture_schedule=[{stages}]"]
    output = wait_all(launch(resumed, 1, *moved), expect=1)
    assert "data.mixture_schedule: [[0, " in output
    assert "the mixture weights change at step 5, before the checkpoint's data step 30" in output
    assert records(resumed)[-1]["step"] == 30
    # ...unless the change is allowed explicitly.
    wait_all(launch(resumed, 1, *moved, "--allow_data_config_change=data.mixture_schedule"))
    assert [r["step"] for r in records(resumed)[-2:]] == [31, 32]


def test_two_process_run_killed_and_restarted_resumes_exactly(tmp_path, uninterrupted_run):
    reference = uninterrupted_run(2)
    resumed, killed_at = run_killed_then_resumed(tmp_path, 2, seed=1)
    check_resume_matches(reference, resumed, killed_at)
    data_files = {p.name for p in (resumed / "checkpoints" / "30" / "data").glob("*.json")}
    assert data_files == {"process_0-of-2.json", "process_1-of-2.json"}


def test_a_2_process_checkpoint_resumes_on_3_and_on_1_process_with_identical_batches(
    tmp_path, uninterrupted_run
):
    """Step 7 of the 2-process run (after the stage change at 5, before the ramp-up at 10).

    On 1 process the resume also skips data steps, so both the elastic resume
    and the skip are checked by one launch (a plain 1-process resume adds
    nothing the 3-process one does not check).
    """
    reference = uninterrupted_run(2)
    expected = {r["step"]: r for r in records(reference)}
    workdir = tmp_path / "resumed_on_3"
    copy_up_to_step_7(reference, workdir)
    output = wait_all(launch(workdir, 3, "--config.num_train_steps=14"))
    assert "resumed_from_step: 7" in output
    got = records(workdir)[-7:]
    assert [r["step"] for r in got] == list(range(8, 15))
    for record in got:
        want = expected[record["step"]]
        assert (record["fingerprint"], record["batch_size"]) == (
            want["fingerprint"],
            want["batch_size"],
        ), f"step {record['step']} differs on 3 processes"
    data = workdir / "checkpoints" / "14" / "data"
    assert {p.name for p in data.glob("*.json")} == {f"process_{i}-of-3.json" for i in range(3)}
    assert {expected[8]["batch_size"], expected[14]["batch_size"]} == {12, 24}

    # Skipping data on resume, on 1 process: step 7 (the batch of update 8) trains
    # on data step 12, which the reference trained at update 13.
    workdir = tmp_path / "skipping_on_1"
    copy_up_to_step_7(reference, workdir)
    skip = "--config.data.skip_steps=[[7, 12]]"
    wait_all(launch(workdir, 1, "--config.num_train_steps=10", skip))
    got = records(workdir)[-3:]
    assert [(r["step"], r["data_step"]) for r in got] == [(8, 12), (9, 13), (10, 14)]
    for record in got:
        want = expected[record["data_step"] + 1]
        assert (record["fingerprint"], record["batch_size"]) == (
            want["fingerprint"],
            want["batch_size"],
        ), f"step {record['step']} is not the reference's data step {record['data_step']}"
    assert "process_0-of-1.json" in {
        p.name for p in (workdir / "checkpoints" / "10" / "data").iterdir()
    }


def copy_up_to_step_7(reference: Path, workdir: Path) -> None:
    """Copies a run's workdir without its logs and checkpoints after step 7."""
    shutil.copytree(reference, workdir, ignore=shutil.ignore_patterns("*.log"))
    for step in committed_steps(workdir):
        if step > 7:
            shutil.rmtree(workdir / "checkpoints" / str(step))


def sigterm_after(workdir, num_processes: int, after_step: int, *flags: str) -> int:
    """Starts a long run, SIGTERMs its last process after `after_step`; returns the saved step.

    With one process the signal goes to its whole process group (workers included).
    """
    procs = launch(workdir, num_processes, "--config.num_train_steps=100000", *flags)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        done = records(workdir)
        if done and done[-1]["step"] >= after_step:
            break
        assert all(p.poll() is None for p in procs), procs[0].log.read_text()[-3000:]
        time.sleep(0.01)
    if num_processes == 1:
        os.killpg(procs[0].pid, signal.SIGTERM)
    else:
        procs[-1].send_signal(signal.SIGTERM)
    try:
        output = wait_all(procs, expect=143)
    finally:  # a run that missed its save must not train on after the test
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    saved = int(re.search(r"pre-empted: step (\d+) is saved", output).group(1))
    assert saved >= after_step
    assert saved in committed_steps(workdir)
    assert records(workdir)[-1]["step"] == saved
    return saved


@pytest.mark.parametrize("num_processes", [1, 2])
def test_sigterm_saves_the_current_step_and_the_rerun_resumes_exactly(
    tmp_path, num_processes, uninterrupted_run
):
    workdir = tmp_path / "preempted"
    workdir.mkdir()
    flags = ("--config.data.worker_count=2",) if num_processes == 1 else ()
    saved = sigterm_after(workdir, num_processes, 6, *flags)
    # Checkpoints are due every 4 steps; the pre-emption save comes on top of them.
    end = saved + 3
    output = wait_all(launch(workdir, num_processes, f"--config.num_train_steps={end}", *flags))
    assert f"resumed_from_step: {saved}" in output

    # The reference has no workers: the worker count changes speed, never data.
    expected = {r["step"]: r for r in records(uninterrupted_run(num_processes))}
    got = {r["step"]: r for r in records(workdir)}
    assert sorted(got) == list(range(1, end + 1))
    for step in range(1, end + 1):
        assert (got[step]["fingerprint"], got[step]["loss"]) == (
            expected[step]["fingerprint"],
            expected[step]["loss"],
        ), f"step {step} differs after resuming from the pre-emption save at {saved}"


def test_orbax_finalize_asking_an_older_step_does_not_move_jaxs_sync_counter(tmp_path, monkeypatch):
    import orbax.checkpoint as ocp

    from trainer_hooks.checkpointing import checkpoint_manager

    reported = []

    def fake_sync_point(self, step):  # JAX's sync point is reached at step 7
        reported.append(step)
        return step == 7

    monkeypatch.setattr(ocp.CheckpointManager, "reached_preemption", fake_sync_point)
    manager = checkpoint_manager(tmp_path / "ckpt")
    answers = [manager.reached_preemption(step) for step in (5, 6, 4, 7, 5, 7, 8)]
    # Steps older than the loop's (orbax's async finalize) are answered, not reported.
    assert reported == [5, 6, 7, 7, 8]
    assert answers == [False, False, False, True, False, True, False]
    manager.close()


@pytest.fixture(scope="module")
def saved_at_7_and_14(tmp_path_factory):
    """A 14-step run saved at 7 and 14 (one launch for every kind of damage)."""
    workdir = tmp_path_factory.mktemp("saved_at_7_and_14") / "run"
    workdir.mkdir()
    wait_all(launch(workdir, 1, "--config.num_train_steps=14", *EVERY_7))
    return workdir


def damage_latest(saved: Path, workdir: Path, damage: str) -> Path | None:
    """Copies a run saved at 7 and 14 to `workdir` and damages its step 14.

    Returns the garbled file when the error should name it.
    """
    shutil.copytree(saved, workdir, ignore=shutil.ignore_patterns("*.log"))
    latest = workdir / "checkpoints" / "14"
    if damage == "metadata":
        (latest / "model" / "_METADATA").unlink()
        return None
    if damage == "model_chunk":  # 64 bytes inside the largest chunk file of the arrays
        assert (latest / "model.sha256.json").exists()
        garbled = max(
            (latest / "model").glob("ocdbt.process_*/d/*"), key=lambda p: p.stat().st_size
        )
        data = bytearray(garbled.read_bytes())
        middle = len(data) // 2
        data[middle : middle + 64] = bytes(255 - b for b in data[middle : middle + 64])
        garbled.write_bytes(bytes(data))
        return garbled
    path = latest / "data" / "process_0-of-1.json"
    path.write_text(path.read_text().replace('"cursor": [14', '"cursor": [15'))
    return None


@pytest.mark.parametrize("damage", ["metadata", "data", "model_chunk"])
def test_a_damaged_latest_step_is_one_error_line_naming_restore_step(
    tmp_path, saved_at_7_and_14, damage
):
    workdir = tmp_path / "run"
    garbled = damage_latest(saved_at_7_and_14, workdir, damage)
    out = wait_all(launch(workdir, 1, *EVERY_7), expect=1)
    last = [line for line in out.splitlines() if line.strip()][-1]
    assert last.startswith("error: ") and ("step 14" in last or "/14/" in last), last
    assert "--restore_step=7" in last and "Traceback" not in out, last
    assert garbled is None or str(garbled) in last, last


def test_restore_step_sets_a_damaged_latest_step_aside_and_resumes_the_earlier_one(
    tmp_path, uninterrupted_run, saved_at_7_and_14
):
    """What the error line suggests; it does not depend on what was damaged."""
    reference = {r["step"]: r for r in records(uninterrupted_run(1))}
    workdir = tmp_path / "run"
    damage_latest(saved_at_7_and_14, workdir, "data")
    # Restoring step 7 sets step 14 aside and trains on exactly the batches of the first run.
    wait_all(launch(workdir, 1, "--restore_step=7", *EVERY_7))
    assert (workdir / "abandoned_checkpoints").exists()
    assert committed_steps(workdir) == [7, 14, 21, 28, 30]
    resumed = [r for r in records(workdir) if r["step"] > 7][-23:]
    assert [r["step"] for r in resumed] == list(range(8, 31))
    for record in resumed:
        assert record["fingerprint"] == reference[record["step"]]["fingerprint"], record["step"]


def test_when_one_of_two_processes_dies_the_other_stops_soon_saying_why(tmp_path):
    workdir = tmp_path / "run"
    workdir.mkdir()
    procs = launch(workdir, 2, "--config.num_train_steps=100000")
    deadline = time.monotonic() + 180
    # After the step-4 checkpoint is committed: a process killed during orbax's
    # async commit also makes the survivor's commit thread log its own
    # traceback (the barrier times out) beside the error line (seen once under
    # a loaded suite); that case is not what this test is about.
    while time.monotonic() < deadline and not (
        records(workdir) and records(workdir)[-1]["step"] >= 5 and 4 in committed_steps(workdir)
    ):
        assert all(p.poll() is None for p in procs), "the run ended before the kill"
        time.sleep(0.05)
    procs[1].send_signal(signal.SIGKILL)
    killed = time.monotonic()
    # --heartbeat_timeout (10 s by default): JAX's 100 s kept the survivor 56-101 s.
    code = procs[0].wait(timeout=45)
    assert code != 0 and time.monotonic() - killed < 30
    log = procs[0].log.read_text()
    errors = [line for line in log.splitlines() if line.startswith("error: ")]
    assert errors and errors[-1].startswith("error: process 1 of 2 stopped"), log[-6000:]
    assert len(errors) == 1 and "Traceback" not in log and "Fatal Python error" not in log, log
