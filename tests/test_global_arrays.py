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
from jax.sharding import NamedSharding, PartitionSpec

from tests.test_planned_iterator import DATA  # a mixture with a ramp-up at step 3
from xlstm_data import create_mesh, iterators_from_config
from xlstm_data.multihost import global_arrays
from xlstm_data.reading.row_assembly import aligned_empty, fields_of

pytestmark = pytest.mark.usefixtures("small_chunks")

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


# A chunk lent from a worker's shared-memory slot (`SlotRing.lease`) ------------------

NAMES = ("inputs", "targets", "inputs_position")
LENT_STEPS, LENT_ROWS, LENT_LENGTH = 4, 8, 16


def _lent_chunk() -> tuple[global_arrays.ChunkTransfer, np.ndarray]:
    mesh = create_mesh("dp:4,fsdp:1,tp:1,sp:1")
    sharding = NamedSharding(mesh, PartitionSpec(("dp", "fsdp")))
    transfer = global_arrays.ChunkTransfer(NAMES, sharding, 1, LENT_STEPS)
    block = aligned_empty((len(NAMES), LENT_STEPS * LENT_ROWS, LENT_LENGTH), np.int32)
    block[...] = np.random.default_rng(0).integers(0, 1000, block.shape)
    return transfer, block


def _lent_steps() -> tuple[list, np.ndarray, np.ndarray, list[int]]:
    """A lent chunk's steps, the chunk, a copy of it, and the list each release appends 1 to."""
    transfer, block = _lent_chunk()
    released: list[int] = []
    steps = transfer.steps(block, [LENT_ROWS] * LENT_STEPS, release=lambda: released.append(1))
    return steps, block, block.copy(), released


def _check_steps(steps, expected: np.ndarray) -> None:
    for k, step in enumerate(steps):
        rows = expected[:, k * LENT_ROWS : (k + 1) * LENT_ROWS]
        for i, name in enumerate(NAMES):
            np.testing.assert_array_equal(np.asarray(step.get()[name]), rows[i])


def _second_pick_fails(monkeypatch) -> None:
    """Picks are compiled afresh, and the second pick call raises (out of memory)."""
    monkeypatch.setattr(global_arrays, "PYTREE_STEPS", 0)
    monkeypatch.setattr(global_arrays, "_PICKS", {})
    calls = itertools.count()
    compiled = global_arrays._compiled_pick

    def flaky_compile(*key):
        pick = compiled(*key)

        def flaky(chunk, index):
            if next(calls) == 1:
                raise RuntimeError("RESOURCE_EXHAUSTED: out of memory")
            return pick(chunk, index)

        return flaky

    monkeypatch.setattr(global_arrays, "_compiled_pick", flaky_compile)


def test_a_lent_chunk_is_released_after_its_last_pick_and_no_array_reads_it_then(monkeypatch):
    monkeypatch.setattr(global_arrays, "PYTREE_STEPS", 0)
    monkeypatch.setattr(global_arrays, "_PICKS", {})
    steps, block, expected, released = _lent_steps()
    for k in (2, 0, 3):  # in any order, by any thread
        steps[k].get()
    assert released == []  # step 1's pick has not read the slot yet
    steps[1].get()
    assert released == [1]
    block[...] = -1  # the worker writes its slot again
    _check_steps(steps, expected)
    assert released == [1]


def test_a_failed_pick_keeps_a_lent_chunk_until_its_retry_has_read_it(monkeypatch):
    _second_pick_fails(monkeypatch)
    steps, block, expected, released = _lent_steps()
    steps[0].get()
    with pytest.raises(RuntimeError, match="out of memory"):
        steps[1].get()
    steps[2].get()
    steps[3].get()
    assert released == []  # step 1 must still read the slot
    steps[1].get()
    assert released == [1]
    block[...] = -1
    _check_steps(steps, expected)


@pytest.mark.parametrize("path", ["pytree", "accelerator"])
def test_a_lent_chunk_not_picked_in_place_is_copied_and_released_at_once(monkeypatch, path):
    """A pytree transfer on CPU would alias the slot; an accelerator's chunk put is not awaited."""
    monkeypatch.setattr(global_arrays, "PYTREE_STEPS", 10**6 if path == "pytree" else 0)
    monkeypatch.setattr(global_arrays, "_PICKS", {})
    if path == "accelerator":
        monkeypatch.setattr(global_arrays, "picks_read_host_chunks", lambda sharding: False)
    steps, block, expected, released = _lent_steps()
    assert released == [1]
    block[...] = -1
    _check_steps(steps, expected)


def test_a_pick_that_fails_while_waited_for_keeps_a_lent_chunk_for_its_retry(monkeypatch):
    """Each pick waits for its own outputs; an error there is its step's, and it is retried."""
    monkeypatch.setattr(global_arrays, "PYTREE_STEPS", 0)
    monkeypatch.setattr(global_arrays, "_PICKS", {})

    class FailsWhenWaitedFor:
        def block_until_ready(self):
            raise RuntimeError("INTERNAL: the copy failed")

    calls = itertools.count()
    compiled = global_arrays._compiled_pick

    def failing_once(*key):
        pick = compiled(*key)
        return lambda chunk, index: (
            {name: FailsWhenWaitedFor() for name in NAMES}
            if next(calls) == LENT_STEPS - 1
            else pick(chunk, index)
        )

    monkeypatch.setattr(global_arrays, "_compiled_pick", failing_once)
    steps, block, expected, released = _lent_steps()
    for step in steps[:-1]:
        step.get()
    with pytest.raises(RuntimeError, match="the copy failed"):
        steps[-1].get()
    assert released == []
    steps[-1].get()
    assert released == [1]
    block[...] = -1
    _check_steps(steps, expected)


def test_a_step_picked_but_lost_gets_its_arrays_again_not_the_rewritten_slot(monkeypatch):
    """An interrupt after a step's pick but before its `StepArrays` kept the arrays."""
    monkeypatch.setattr(global_arrays, "PYTREE_STEPS", 0)
    monkeypatch.setattr(global_arrays, "_PICKS", {})
    steps, block, expected, released = _lent_steps()
    for step in steps[:-1]:
        step.get()
    steps[-1]._make()  # noqa: SLF001 - picked and counted, then lost
    assert released == [1]
    block[...] = -1  # the worker writes the freed slot
    _check_steps(steps, expected)


def test_a_retry_does_not_wait_for_arrays_the_loop_already_donated(monkeypatch):
    """Only a step's own outputs are waited for, before anyone holds them."""
    _second_pick_fails(monkeypatch)
    steps, block, _, released = _lent_steps()
    for array in steps[0].get().values():
        array.delete()  # as a train step that donates its batch
    with pytest.raises(RuntimeError, match="out of memory"):
        steps[1].get()
    steps[2].get()
    steps[3].get()
    steps[1].get()  # the retry is the last pick: it waits for its own outputs only
    assert released == [1]
