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
measured), which keeps the suite inside its CI budget. Test subprocesses also
get `tests/subprocess_site` on PYTHONPATH (`tests/multiprocess.subprocess_env`):
without it only process 0 of a multi-process run read that cache. XLA's
CPU compiler runs its fastest passes everywhere (`TEST_XLA_FLAGS`).
`make test` runs the suite on 2 pytest-xdist workers, each module whole on
one worker (`--dist loadfile`), so module fixtures are built once. The
longest modules are handed out first (`LONGEST_FIRST`, with xdist's own
reordering by test count off): xdist's default order put the 1-test modules
of 67-82 s (`make demo`, the bench) last, and the two workers ended ~55 s
apart. Fresh-clone runs on the 2-core VM: 788 and 723 s of pytest in this order,
against 849-904 s in xdist's (one earlier A/B had read 875 against 849).
"""

import os
import tempfile

from tests.multiprocess import TEST_XLA_FLAGS

os.environ.setdefault("XLSTM_DATA_CACHE_DIR", tempfile.mkdtemp(prefix="xlstm-data-test-cache-"))
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", tempfile.mkdtemp(prefix="xlstm-data-test-jit-"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "-1")
os.environ["XLA_FLAGS"] = TEST_XLA_FLAGS

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_num_cpu_devices", 4)
assert len(jax.devices()) == 4

# The hang watchdog's hooks (see its docstring).
from tests.hang_watchdog import (  # noqa: E402, F401
    pytest_configure,
    pytest_exception_interact,
    pytest_runtest_protocol,
    pytest_runtest_setup,
    pytest_terminal_summary,
    pytest_unconfigure,
)

#: Modules by their time on one worker, longest first (seconds in a fresh-clone
#: `make test`, 2026-11-27: 321, 138, 110, 87, 82, 76, 74, 73, 72, 70, 68, 67,
#: 65, 49, 49, 42, 38); every other module took under 27 s and follows in
#: collection order.
LONGEST_FIRST = (
    "test_train_resume.py",
    "test_documented_commands.py",
    "test_shipped_configs.py",
    "test_multihost.py",
    "test_make_demo.py",
    "test_adaptive_mixture.py",
    "test_online_mixing.py",
    "test_read_errors.py",
    "test_planned_iterator.py",
    "test_workers_lifecycle.py",
    "test_plan_properties.py",
    "test_bench.py",
    "test_plan.py",
    "test_cli.py",
    "test_factories.py",
    "test_readme.py",
    "test_checkpoint.py",
)


def pytest_collection_modifyitems(items):
    """Longest modules first, each module's tests in their own order (a stable sort)."""
    rank = {name: place for place, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


@pytest.fixture(params=["memory", "gcsfs-like"])
def memory_gs(request):
    """gs:// served from memory (no network); "gcsfs-like" globs answer without the scheme."""
    import fsspec
    from etils.epath import backend
    from fsspec.implementations.memory import MemoryFileSystem
    from fsspec.registry import _registry

    class BucketFileSystem(MemoryFileSystem):
        def glob(self, path, **kwargs):
            return [p.split("://", 1)[-1].lstrip("/") for p in super().glob(path, **kwargs)]

    implementation = MemoryFileSystem if request.param == "memory" else BucketFileSystem
    saved = {protocol: _registry.get(protocol) for protocol in ("gs", "gcs")}
    # epath asks fsspec for "gcs" when it opens gs://: "gs" alone is not enough.
    for protocol in saved:
        fsspec.register_implementation(protocol, implementation, clobber=True)
    backend.fsspec_backend._get_filesystem.cache_clear()
    filesystem = fsspec.filesystem("gs")
    try:
        yield filesystem
    finally:
        filesystem.rm("gs://bucket", recursive=True)
        for protocol, previous in saved.items():
            if previous is None:
                _registry.pop(protocol, None)
            else:
                _registry[protocol] = previous
        backend.fsspec_backend._get_filesystem.cache_clear()


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks of at most 64 host rows (8 steps of 8 rows), as these tests' step counts assume.

    The default (`planned_batches.CHUNK_ROWS_MAX`, 256) would put most of a
    small test epoch in the chunks this process computes before its workers
    take over, and its chunk boundaries out of the tests' reach. Only the
    main process reads it: workers are handed their chunks' steps.
    """
    from xlstm_data.reading import planned_batches

    monkeypatch.setattr(planned_batches, "CHUNK_ROWS_MAX", 64)
