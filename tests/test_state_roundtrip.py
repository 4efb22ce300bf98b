"""Restoring the iterator state at every step continues with identical batches."""

from __future__ import annotations

import numpy as np
import pytest

import xlstm_data as xd
from tests.helpers import assert_batches_equal, to_numpy, unique_token_docs


def _iterator(mesh, packing: bool, worker_count: int, num_epochs=None, thread=False):
    lengths = np.random.default_rng(1).integers(0, 40, size=60)
    return xd.make_grain_llm_iterator(
        None,
        None,
        mesh,
        unique_token_docs(lengths),
        global_batch_size=4,
        max_target_length=16,
        shuffle=True,
        data_shuffle_seed=5,
        num_epochs=num_epochs,
        grain_packing=packing,
        worker_count=worker_count,
        drop_remainder=False,
        use_thread_prefetch=thread,
    )


# Workers once, packed: how a restore restarts them does not depend on the
# packing, and each case with workers took ~28 s of CPU (worker starts).
@pytest.mark.parametrize(
    "packing,worker_count",
    [(False, 0), (True, 0), (True, 2), (True, -1)],
    ids=["padded", "packed", "packed-workers", "packed-thread-prefetch"],
)
def test_restore_at_every_step(packing, worker_count):
    mesh = xd.create_mesh()
    num_steps = 6 if worker_count > 0 else 12
    thread = worker_count < 0
    worker_count = max(worker_count, 0)
    reference = _iterator(mesh, packing, worker_count, thread=thread)
    states, batches = [reference.get_state()], []
    for _ in range(num_steps):
        batches.append(to_numpy(next(reference)))
        states.append(reference.get_state())
    reference.close()
    restored = _iterator(mesh, packing, worker_count, thread=thread)
    # Every step without workers; with them each restore starts 2 worker
    # processes (about 3 s of CPU each here), so the first, a middle and the last.
    restore_at = range(num_steps) if worker_count == 0 else (0, num_steps // 2, num_steps - 1)
    for step in restore_at:
        restored.set_state(states[step])
        assert restored.get_state()["step"] == step
        for later in range(step, min(step + 2, num_steps)):
            assert_batches_equal(next(restored), batches[later])
    restored.close()


def test_restore_after_the_end_of_a_finite_epoch_stays_at_the_end():
    mesh = xd.create_mesh()
    iterator = _iterator(mesh, packing=True, worker_count=0, num_epochs=1)
    batches = [to_numpy(b) for b in iterator]
    state = iterator.get_state()
    assert state["step"] == len(batches)
    fresh = _iterator(mesh, packing=True, worker_count=0, num_epochs=1)
    fresh.set_state(state)
    assert list(fresh) == []


def test_state_is_json_and_records_the_step():
    import json

    mesh = xd.create_mesh()
    iterator = _iterator(mesh, packing=True, worker_count=0)
    next(iterator)
    next(iterator)
    state = json.loads(json.dumps(iterator.get_state()))
    assert state["step"] == 2 and state["format_version"] == 5 and state["kind"] == "plan"
    assert state["process_count"] == 1 and state["data_host_count"] == 1


def _as_format_4(state: dict) -> dict:
    """A format-5 state written as format 4 did: no per-source `offset` in the cursor."""
    sources = len(state["sources"])
    return {**state, "format_version": 4, "cursor": state["cursor"][: 2 + 3 * sources]}


def test_a_format_4_position_resumes_where_its_cursor_had_no_offset():
    """Format 5 added the concat offset; without concat it is always 0, so format 4 reads on."""
    mesh = xd.create_mesh()
    reference = _iterator(mesh, packing=True, worker_count=0)
    for _ in range(3):
        next(reference)
    state = reference.get_state()
    expected = [to_numpy(next(reference)) for _ in range(3)]
    reference.close()
    restored = _iterator(mesh, packing=True, worker_count=0)
    restored.set_state(_as_format_4(state))
    for batch in expected:
        assert_batches_equal(next(restored), batch)
    restored.close()


def test_a_format_4_concat_position_is_refused_by_name():
    cfg = {
        "train": {"t": {"kind": "synthetic", "num_documents": 50, "mean_length": 40}},
        "global_batch_size": 4,
        "max_target_length": 16,
        "packing": "concat",
    }
    mesh = xd.create_mesh()
    train, _ = xd.iterators_from_config(cfg, mesh)
    next(train)
    state = train.get_state()
    with pytest.raises(xd.DataCheckpointError, match="format 4 without data.packing='concat'"):
        train.set_state(_as_format_4(state))
    train.close()
