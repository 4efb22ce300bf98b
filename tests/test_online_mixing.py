"""Online mixing: `iterator.set_mixture` takes effect exactly where asked and replays on resume.

An online update must be indistinguishable from a configured mixture stage
at the same step: the batches before it are untouched, the ones from it on
are those of the config with that stage, whatever was prefetched (threads or
worker processes), and a checkpoint carries it to any number of processes
and to `xlstm-data batch --workdir`.
"""

from __future__ import annotations

import io
import json
import math
import time

import numpy as np
import pytest

import xlstm_data as xd
from tests.multiprocess import REPO, run_processes
from tests.test_batch_command import _expected_inputs
from trainer_hooks.checkpointing import checkpoint_manager, save_args
from xlstm_data.cli.batch_contents import run_batch
from xlstm_data.cli.inspect_config import load_config
from xlstm_data.from_config import open_train_plan

CONFIG = str(REPO / "tests" / "train_config.py")
#: At training step 3 (before its batch): new weights from data step 4; the
#: configured stage at 5 ends them. At step 6: weights from step 8 on (pending
#: at a checkpoint before step 7), then replaced at step 9 from step 9 on.
UPDATES = {
    3: ({"long": 0.5, "short": 0.5}, 4),
    6: ({"long": 0.9, "short": 0.1}, 8),
    9: ({"short": 1.0}, 9),
}


def _data(**overrides):
    data = load_config(CONFIG).data
    data.update(overrides)
    return data


def _run(data, steps, *, updates=None, state=None, before_update=None, mesh=None):
    """(inputs, source_ids) of training steps [start, steps), and the state at the end."""
    train, evals = xd.iterators_from_config(data, mesh or xd.create_mesh())
    try:
        if state is not None:
            train.set_state(state)
        batches = []
        while train.step_counter < steps:
            step = train.step_counter
            if updates and step in updates:
                if before_update is not None:
                    before_update(train)
                train.set_mixture(*updates[step])
            batch = next(train)
            batches.append((np.asarray(batch.inputs), np.asarray(batch.source_ids)))
        return batches, train.get_state()
    finally:
        for iterator in (train, *evals.values()):
            iterator.close()


def _same(a, b):
    assert len(a) == len(b)
    for step, (x, y) in enumerate(zip(a, b, strict=True)):
        np.testing.assert_array_equal(x[0], y[0], err_msg=f"inputs of step {step}")
        np.testing.assert_array_equal(x[1], y[1], err_msg=f"source_ids of step {step}")


@pytest.fixture(scope="module")
def as_configured():
    """The same run with the updates written into data.mixture_schedule instead."""
    stages = [
        [0, {"long": 0.7, "short": 0.3}],
        [4, {"long": 0.5, "short": 0.5}],
        [5, {"long": 0.2, "short": 0.8}],
        [8, {"long": 0.9, "short": 0.1}],
        [9, {"long": 0.0, "short": 1.0}],
    ]
    return _run(_data(mixture_schedule=stages), 14)[0]


@pytest.fixture(scope="module")
def online():
    return _run(_data(), 14, updates=UPDATES)


def test_an_online_update_equals_a_configured_stage_at_the_same_step(online, as_configured):
    _same(online[0], as_configured)
    untouched, _ = _run(_data(), 4)
    _same(online[0][:4], untouched)  # nothing before the first update's step changed
    assert not np.array_equal(online[0][4][0], untouched[-1][0])


def test_the_update_is_in_the_data_state(online):
    state = online[1]
    assert state["mixture_updates"] == [
        [4, {"long": 0.5, "short": 0.5}],
        [8, {"long": 0.9, "short": 0.1}],
        [9, {"long": 0.0, "short": 1.0}],
    ]
    assert [s for s, _ in state["mixture_schedule"]] == [0, 4, 5, 8, 9]
    json.dumps(state)


def test_a_later_call_replaces_updates_still_pending_from_its_step_on():
    updates = {1: ({"short": 1.0}, 6), 2: ({"long": 1.0}, 4)}
    _, state = _run(_data(mixture_schedule=None), 3, updates=updates)
    assert state["mixture_updates"] == [[4, {"long": 1.0, "short": 0.0}]]


def _wait_for_prefetch(iterator):
    iterator.start_prefetch()
    time.sleep(1.5)  # the prefetch thread (and workers) prepare later steps meanwhile


@pytest.mark.parametrize("workers", [0, 2])
def test_batches_prepared_ahead_are_prepared_again(workers, as_configured):
    batches, _ = _run(
        _data(worker_count=workers, prefetch=3),
        14,
        updates=UPDATES,
        before_update=_wait_for_prefetch,
    )
    _same(batches, as_configured)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_resume_after_an_update_replays_it(workers, online):
    # Saved before step 7 with the update from 8 still pending, with workers prefetching.
    early = {k: v for k, v in UPDATES.items() if k < 7}
    first, state = _run(
        _data(worker_count=workers), 7, updates=early, before_update=_wait_for_prefetch
    )
    later = {k: v for k, v in UPDATES.items() if k >= 7}
    rest, _ = _run(_data(worker_count=workers), 14, updates=later, state=state)
    _same(first + rest, online[0])


def _train_iterator():
    train, evals = xd.iterators_from_config(_data(), xd.create_mesh())
    for iterator in evals.values():
        iterator.close()
    return train


@pytest.mark.parametrize(
    ("weights", "from_step", "message"),
    [
        ({"long": 1.0}, 1, "set_mixture(from_step=1) is in the past: the next batch is data step"),
        ({"long": "x"}, 5, "set_mixture(weights)['long']='x' is invalid"),
        ({"web": 1.0}, 5, "set_mixture(weights) names unknown datasets ['web']"),
        ({"long": -1.0, "short": 1.0}, 5, "set_mixture(weights)['long']=-1.0 is invalid"),
        ({"long": math.nan}, 5, "set_mixture(weights)['long']=nan is invalid"),
        ({"long": math.inf}, 5, "set_mixture(weights)['long']=inf is invalid"),
        ({"long": 0.0, "short": 0}, 5, "set_mixture(weights): all weights are zero"),
        ({}, 5, "set_mixture(weights)={} is invalid"),
        ({"long": 1.0}, 2.5, "set_mixture(from_step=2.5) is invalid; expected an int"),
    ],
)
def test_bad_updates_are_refused_by_name(weights, from_step, message):
    train = _train_iterator()
    try:
        next(train), next(train)
        before = train.get_state()
        with pytest.raises(xd.DataConfigError) as error:
            train.set_mixture(weights, from_step)
        assert message in str(error.value)
        assert train.get_state() == before  # a refused update changes nothing
    finally:
        train.close()


def test_an_update_from_the_next_step_applies_to_it():
    train = _train_iterator()
    try:
        next(train)
        train.set_mixture({"short": 1.0}, 1)
        batch = next(train)
        ids = np.asarray(batch.source_ids)
        assert set(np.unique(ids).tolist()) <= {-1, 1}  # only "short" (index 1), and padding
        assert train.source_names == ("long", "short")
    finally:
        train.close()


@pytest.mark.parametrize("processes", [1, 3])
def test_two_processes_update_save_and_resume_on_other_process_counts(tmp_path, processes):
    params = {
        "config": CONFIG,
        "directory": str(tmp_path / "checkpoints"),
        "save_at": 7,
        "end": 14,
        "updates": {str(k): [w, s] for k, (w, s) in UPDATES.items()},
    }
    saved = run_processes("online_mixing", 2, tmp_path, {**params, "mode": "save"})[0]
    (tmp_path / "resume").mkdir()
    resumed = run_processes(
        "online_mixing", processes, tmp_path / "resume", {**params, "mode": "resume"}
    )[0]
    assert sorted(saved, key=int) == [str(s) for s in range(7, 14)]
    assert resumed == saved


def test_batch_workdir_lists_the_batches_of_the_online_mixture(tmp_path, online):
    train = _train_iterator()
    manager = checkpoint_manager(tmp_path / "checkpoints", async_save=False)
    try:
        yielded = []
        while train.step_counter < 10:
            if train.step_counter in UPDATES:
                train.set_mixture(*UPDATES[train.step_counter])
            yielded.append(next(train))
        manager.save(10, args=save_args({"w": np.zeros(2)}, train))
    finally:
        manager.close()
        train.close()
    out = io.StringIO()
    rows = run_batch(None, str(tmp_path), range(0, 10), out=out, err=io.StringIO())
    opened = open_train_plan(_data())
    names = list(opened.plan.spec.names)
    for row in rows:
        record = row.to_json()
        inputs = np.asarray(yielded[row.step].inputs)[row.row]
        np.testing.assert_array_equal(inputs, _expected_inputs(record, opened))
        ids = np.asarray(yielded[row.step].source_ids)[row.row]
        sources = {names.index(d["source"]) for d in record["documents"]}
        assert set(np.unique(ids[ids >= 0]).tolist()) == sources
    assert len(rows) == sum(b.inputs.shape[0] for b in yielded)


def test_source_ids_mark_each_token_of_a_row_by_its_dataset_and_padding_by_minus_one(online):
    for inputs, ids in online[0]:
        assert ids.dtype == np.int32 and ids.shape == inputs.shape
        assert set(np.unique(ids).tolist()) <= {-1, 0, 1}


def test_loss_by_source_in_a_jitted_step_over_a_sharded_batch():
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    mesh = xd.create_mesh()
    sharding = NamedSharding(mesh, PartitionSpec(("dp", "fsdp")))
    rng = np.random.default_rng(0)
    ids = rng.integers(-1, 3, size=(8, 16)).astype(np.int32)
    loss = rng.random((8, 16)).astype(np.float32)
    totals = jax.jit(lambda x, i: xd.loss_by_source(x, i, 3))(
        jax.device_put(loss, sharding), jax.device_put(ids, sharding)
    )
    for source in range(3):
        np.testing.assert_allclose(totals[0, source], loss[ids == source].sum(), rtol=1e-5)
        assert totals[1, source] == np.count_nonzero(ids == source)


def test_config_stage_after_an_update_still_starts_where_configured():
    data = _data(mixture_schedule=[[0, {"long": 0.7, "short": 0.3}], [6, {"long": 1.0}]])
    batches, state = _run(data, 9, updates={2: ({"short": 1.0}, 2)})
    ids = [set(np.unique(b[1]).tolist()) - {-1} for b in batches]
    assert ids[2:6] == [{1}] * 4 and ids[6:] == [{0}] * 3
    assert state["mixture_schedule"][1:] == [
        [2, {"long": 0.0, "short": 1.0}],
        [6, {"long": 1.0, "short": 0.0}],
    ]
