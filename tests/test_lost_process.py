"""Reading JAX's report of lost processes (the end-to-end test is in test_train_resume)."""

from __future__ import annotations

from trainer_hooks.lost_process import UNHEALTHY, lost_processes


def test_the_lost_processes_are_read_from_jaxs_report():
    report = f"E1126 coordination_service.cc:1549] UNAVAILABLE: {UNHEALTHY}\n"
    assert lost_processes([report, "1\n", "The tasks have crashed. Check the task logs\n"]) == [1]
    tasks = "/job:jax_worker/replica:0/task:2\n/job:jax_worker/replica:0/task:3\n"
    assert lost_processes([f"{UNHEALTHY}\n{tasks}The tasks have crashed.\n"]) == [2, 3]
    assert lost_processes(["Fatal Python error: Aborted\n"]) == []
