"""Global arrays from the host pipeline: every device gets its rows of what the host computed.

A step goes to the devices as a pytree of fields (the first
`global_arrays.PYTREE_STEPS` steps of an iterator, and a chunk's steps split
by a ramp-up boundary: no compile) or picked by a compiled call from its whole
chunk of steps sent at once (after them). Both must hand out the host
pipeline's fields bit for bit, sharded over the batch axes only, across
ramp-up stages (a new shape compiles a new pick) and mesh layouts.
Run in this process with 4 CPU devices (conftest).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from tests.test_planned_iterator import DATA  # a mixture with a ramp-up at step 3
from xlstm_data import create_mesh, iterators_from_config
from xlstm_data.multihost import global_arrays
from xlstm_data.reading.row_assembly import fields_of

STEPS = 20  # a chunk of 8 steps split by the ramp-up, then whole ones


@pytest.mark.parametrize("pytree_steps", [0, 2, 10**6])
@pytest.mark.parametrize(
    "axes",
    ["dp:4,fsdp:1,tp:1,sp:1", "dp:2,fsdp:2,tp:1,sp:1", "dp:1,fsdp:2,tp:2,sp:1"],
)
def test_every_device_holds_its_rows_of_the_host_batch(monkeypatch, axes, pytree_steps):
    monkeypatch.setattr(global_arrays, "PYTREE_STEPS", pytree_steps)
    monkeypatch.setattr(global_arrays, "_PICKS", {})
    _check_every_step(axes, pytree_steps)


def test_chunks_put_on_the_devices_once_give_the_same_batches(monkeypatch):
    """An accelerator's path: each chunk goes to the devices, and the picks read it there."""
    monkeypatch.setattr(global_arrays, "PYTREE_STEPS", 0)
    monkeypatch.setattr(global_arrays, "_PICKS", {})
    monkeypatch.setattr(global_arrays, "picks_read_host_chunks", lambda sharding: False)
    _check_every_step("dp:2,fsdp:2,tp:1,sp:1", 0)


def _check_every_step(axes: str, pytree_steps: int) -> None:
    train, _ = iterators_from_config(DATA, create_mesh(axes))
    try:
        host = [fields_of(e["fields"]) for e in itertools.islice(train.host_batches(), STEPS)]
        assert {len(h["inputs"]) for h in host} == {4, 8}  # both ramp-up stages
        for step, expected in enumerate(host):
            batch = next(train).to_dict()
            assert batch.keys() == expected.keys()
            for name, want in expected.items():
                got = batch[name]
                where = f"{axes} step {step} {name}"
                assert got.sharding == train.sharding, where
                np.testing.assert_array_equal(np.asarray(got), want, err_msg=where)
                for shard in got.addressable_shards:  # rows split, replicated over tp
                    np.testing.assert_array_equal(shard.data, want[shard.index], err_msg=where)
                    assert shard.data.shape[0] == len(want) // train.layout.data_parallel_size
        # Whole chunks after the pytree steps were picked from the devices.
        assert bool(global_arrays._PICKS) == (pytree_steps < STEPS)
    finally:
        train.close()


def test_the_host_pipeline_iterated_again_starts_again_at_its_first_step():
    """Each `iter()` of a grain dataset starts afresh; the planner under it walked forward only.

    `bench.run throughput` iterates `host_batches()` once per round: its second
    round raised "the plan was asked for data step 0, before its position".
    """
    train, _ = iterators_from_config(DATA, create_mesh("dp:4,fsdp:1,tp:1,sp:1"))
    try:
        steps = train.host_batches()
        passes = [
            list(itertools.islice(iter(steps), STEPS)),
            list(itertools.islice(iter(steps), 5)),  # after the first pass went ahead
            list(itertools.islice(iter(steps), 2 * STEPS)),  # and past where it stopped
        ]
        fresh = list(itertools.islice(iter(train.host_batches()), 2 * STEPS))
        assert [len(p) for p in passes] == [STEPS, 5, 2 * STEPS] and len(fresh) == 2 * STEPS
        for elements in passes:
            for step, (got, want) in enumerate(zip(elements, fresh, strict=False)):
                assert got.keys() == want.keys()  # fields, cursor, data step, ...
                for key in want:
                    np.testing.assert_array_equal(got[key], want[key], err_msg=f"{step} {key}")
    finally:
        train.close()
