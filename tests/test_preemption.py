"""A SIGTERM (a scheduler's pre-emption notice) saves the current step, and a rerun resumes.

`trainer_hooks.train` runs JAX's preemption service (on one process too), and
`CheckpointHook` follows orbax's pre-emption policy: at the sync point every
process agrees on after the signal, it saves model and data position and the
run exits with status 143. The rerun must continue on exactly the next batch
(compared with an uninterrupted run without workers): on one process with 2 grain workers,
the signal sent to the whole process group as SLURM does (the workers must
survive it), and on two processes where only one process got the signal.
"""

from __future__ import annotations

import os
import re
import signal
import time

import pytest

from tests.test_train_resume import committed_steps, launch, records, wait_all


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
