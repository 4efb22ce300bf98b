"""Shared pytest setup.

The in-process tests run on 4 CPU devices. The backend starts here, so a
command line run in-process (`xlstm-data inspect` sets the CPU device count
when JAX has not started yet) cannot change the devices of later tests.
absl flags are left unparsed, as in a user's plain script: the library must
not need them (grain's worker processes read one).
The lengths cache (`xlstm_data.sources.lengths_cache`) goes to a fresh temporary
directory unless one is set, so tests never write to ~/.cache.
JAX's persistent compilation cache is on for the session (a fresh temporary
directory, inherited by every subprocess): the training runs of the suite
compile the same few steps, and a warm cache halves a run (19.5 s -> 8.8 s
measured), which keeps the suite inside its CI budget.
"""

import os
import tempfile

os.environ.setdefault("XLSTM_DATA_CACHE_DIR", tempfile.mkdtemp(prefix="xlstm-data-test-cache-"))
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", tempfile.mkdtemp(prefix="xlstm-data-test-jit-"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "-1")

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_num_cpu_devices", 4)
assert len(jax.devices()) == 4

#: Modules whose tests train in several processes at once (each run busies both
#: cores). `make test` runs the suite on 2 pytest-xdist workers with
#: `--dist loadgroup`: these run one after another on one worker; every other
#: module runs whole on one worker (its module-scoped fixtures are built once).
TRAINING_PROCESS_MODULES = {
    "test_documented_commands",
    "test_preemption",
    "test_readme",
    "test_shipped_configs",
    "test_train_resume",
}


def pytest_collection_modifyitems(items):
    for item in items:
        module = item.module.__name__.rsplit(".", 1)[-1]
        group = "training_processes" if module in TRAINING_PROCESS_MODULES else module
        item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture(scope="session")
def uninterrupted_run(tmp_path_factory):
    """`uninterrupted_run(n)`: the workdir of a 30-step `tests/train_config.py` run, n processes.

    It checkpoints every 7 steps and keeps every checkpoint.

    Run once per process count for the whole session: the kill/resume and the
    pre-emption tests compare their resumed runs with the same reference.
    """
    from tests.test_train_resume import launch, wait_all

    done = {}

    def run(num_processes: int):
        if num_processes not in done:
            workdir = tmp_path_factory.mktemp(f"uninterrupted_{num_processes}") / "reference"
            workdir.mkdir()
            # Every checkpoint is kept (saves change neither data nor model): the
            # elastic test resumes its step 7 on other process counts.
            keep = ("--config.checkpoint.every_steps=7", "--config.checkpoint.max_to_keep=None")
            wait_all(launch(workdir, num_processes, *keep))
            done[num_processes] = workdir
        return done[num_processes]

    return run
