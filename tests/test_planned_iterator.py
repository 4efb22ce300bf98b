"""The planned iterator: workers change speed only, positions move between layouts.

Run in this process with 4 CPU devices (conftest); worker processes are real.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from xlstm_data import create_mesh, iterators_from_config
from xlstm_data.errors import DataCheckpointError, DataConfigError
from xlstm_data.multihost import global_arrays, shared_slots
from xlstm_data.plan.global_plan import HostPlanner

pytestmark = pytest.mark.usefixtures("small_chunks")

DATA = {
    "train": {
        "a": {"kind": "synthetic", "num_documents": 300, "mean_length": 80},
        "b": {"kind": "synthetic", "num_documents": 200, "mean_length": 20, "seed": 1},
    },
    "global_batch_size": 8,
    "max_target_length": 64,
    "rampup": [[0, 0.5], [3, 1]],
    "mixture_schedule": [[0, {"a": 1, "b": 1}], [4, {"a": 1, "b": 3}]],
    "block_documents": 64,
}


def _host(batch) -> dict[str, np.ndarray]:
    return {k: np.asarray(v) for k, v in batch.to_dict().items()}


def _take(iterator, steps: int) -> list[dict[str, np.ndarray]]:
    return [_host(next(iterator)) for _ in range(steps)]


def _assert_same(a, b) -> None:
    assert len(a) == len(b)
    for step, (x, y) in enumerate(zip(a, b, strict=True)):
        assert x.keys() == y.keys()
        for key in x:
            np.testing.assert_array_equal(x[key], y[key], err_msg=f"step {step} {key}")


@pytest.fixture(scope="module")
def reference():
    train, _ = iterators_from_config(DATA, create_mesh())
    try:
        return _take(train, 9)
    finally:
        train.close()


@pytest.mark.parametrize("workers", [1, 3])
def test_worker_count_changes_nothing_and_a_position_moves_between_counts(reference, workers):
    mesh = create_mesh()
    with_workers, _ = iterators_from_config({**DATA, "worker_count": workers}, mesh)
    try:
        _assert_same(_take(with_workers, 4), reference[:4])
        state = with_workers.get_state()
    finally:
        with_workers.close()
    inline, _ = iterators_from_config(DATA, mesh)
    try:
        inline.set_state(state)
        _assert_same(_take(inline, 5), reference[4:])
        back = inline.get_state()
    finally:
        inline.close()
    again, _ = iterators_from_config({**DATA, "worker_count": workers}, mesh)
    try:
        state_at_4 = dict(back, step=4, data_step=4, cursor=state["cursor"])
        again.set_state(state_at_4)
        _assert_same(_take(again, 5), reference[4:])
    finally:
        again.close()


#: One source, one epoch, workers of buffer 1: most steps come from the workers' chunks.
ONE_SOURCE_EPOCH = {
    **DATA,
    "train": {"a": DATA["train"]["a"]},
    "mixture_schedule": None,
    "num_epochs": 1,
    "worker_buffer_size": 1,
}


def _whole_epoch_inline(data: dict, mesh) -> list[dict[str, np.ndarray]]:
    inline, _ = iterators_from_config(data, mesh)
    try:
        return [_host(batch) for batch in inline]
    finally:
        inline.close()


def test_workers_with_no_room_for_shared_slots_send_the_same_chunks_through_grain(
    monkeypatch, caplog
):
    """A small `/dev/shm` (64 MB in a default Docker container) has no room for the slots."""
    from xlstm_data.multihost import iterator as iterator_module

    data = ONE_SOURCE_EPOCH
    mesh = create_mesh()
    expected = _whole_epoch_inline(data, mesh)
    monkeypatch.setattr(iterator_module, "slots_that_fit", lambda *args: 0)
    with_workers, _ = iterators_from_config({**data, "worker_count": 2}, mesh)
    try:
        _assert_same([_host(batch) for batch in with_workers], expected)
    finally:
        with_workers.close()
    assert "too little for 2 chunks" in caplog.text


def test_workers_take_smaller_chunks_where_2_slots_a_worker_would_not_fit(monkeypatch, caplog):
    """Halved chunks through the slots, rather than whole ones through grain's segments."""
    from xlstm_data.multihost import iterator as iterator_module
    from xlstm_data.reading.row_assembly import FIELDS

    data = ONE_SOURCE_EPOCH
    mesh = create_mesh()
    expected = _whole_epoch_inline(data, mesh)
    step_bytes = len(FIELDS) * 8 * 64 * 4  # the largest step: 8 rows of 64, int32
    monkeypatch.setattr(
        iterator_module,
        "slots_that_fit",
        lambda workers, wanted, slot_bytes: wanted if slot_bytes <= 2 * step_bytes else 0,
    )
    lent = []
    lease = shared_slots.SlotRing.lease
    monkeypatch.setattr(
        shared_slots.SlotRing, "lease", lambda ring, element: lent.append(1) or lease(ring, element)
    )
    inline, _ = iterators_from_config(data, mesh)
    inline.close()
    with_workers, _ = iterators_from_config({**data, "worker_count": 2}, mesh)
    try:
        assert (inline._per_chunk, with_workers._per_chunk) == (8, 2)  # noqa: SLF001
        _assert_same([_host(batch) for batch in with_workers], expected)
    finally:
        with_workers.close()
    assert lent and "too little" not in caplog.text


def test_rows_hold_exactly_the_planned_pieces_of_the_documents():
    train, _ = iterators_from_config(DATA, create_mesh())
    try:
        batches = _take(train, 5)
        planner = HostPlanner(train.plan, 0, 1)
        sources = [train.sources[name] for name in train.plan.spec.names]
    finally:
        train.close()
    eod = 1  # the byte tokenizer's
    for step, batch in enumerate(batches):
        pieces = planner.pieces_at(step)
        assert pieces.rows == batch["inputs"].shape[0]
        for row in range(pieces.rows):
            col = 0
            for segment, (source, doc, start, stop) in enumerate(pieces.row_list(row), 1):
                stream = np.concatenate([sources[source][doc]["tokens"], [eod]])
                cols = slice(col, col + stop - start)
                np.testing.assert_array_equal(batch["inputs"][row, cols], stream[start:stop])
                np.testing.assert_array_equal(
                    batch["targets"][row, cols], stream[start + 1 : stop + 1]
                )
                assert (batch["inputs_segmentation"][row, cols] == segment).all()
                np.testing.assert_array_equal(
                    batch["targets_position"][row, cols], np.arange(stop - start)
                )
                col += stop - start
            for key in ("inputs", "targets", "inputs_segmentation", "targets_position"):
                assert (batch[key][row, col:] == 0).all()


def test_a_position_from_another_plan_is_refused():
    mesh = create_mesh()
    train, _ = iterators_from_config(DATA, mesh)
    try:
        next(train)
        state = train.get_state()
    finally:
        train.close()
    other, _ = iterators_from_config({**DATA, "rampup": [[0, 1.0]]}, mesh)
    try:
        with pytest.raises(DataConfigError, match="already trained step 0"):
            other.set_state(state)
        with pytest.raises(DataCheckpointError, match="streaming pipeline"):
            other.set_state({"format_version": 1, "step": 3})
        with pytest.raises(DataCheckpointError, match="plan state format 3; .* reads format 5"):
            other.set_state(dict(state, format_version=3))
    finally:
        other.close()
    same, _ = iterators_from_config(DATA, mesh)
    try:
        with pytest.raises(DataCheckpointError, match="cursor is at data step 1 but .* is 5"):
            same.set_state(dict(state, step=5, data_step=5))
    finally:
        same.close()


@pytest.mark.parametrize("packing", ["best_fit", "first_fit", "concat", "none"])
@pytest.mark.parametrize("rampup", [None, [[0, 0.5], [2, 1.0]]])
def test_exact_epoch_length_equals_the_batches_yielded(packing, rampup):
    data = {
        "train": {"a": {"kind": "synthetic", "num_documents": 120, "mean_length": 40}},
        "eval": {"e": {"kind": "synthetic", "num_documents": 37, "seed": 4}},
        "global_batch_size": 8,
        "max_target_length": 32,
        "num_epochs": 2,
        "packing": packing,
        "rampup": rampup,
    }
    train, evals = iterators_from_config(data, create_mesh())
    try:
        assert train.epoch_length.exact
        yielded = sum(1 for _ in train)
        assert yielded == train.epoch_length.steps == train.iterator_length > 0
        evaluation = evals["e"]
        assert evaluation.epoch_length.exact
        assert sum(1 for _ in evaluation) == evaluation.iterator_length
        assert sum(1 for _ in evaluation) == evaluation.iterator_length  # again, after reset
    finally:
        train.close()
        evals["e"].close()


def test_a_layout_the_batch_does_not_divide_over_names_the_layouts_that_work():
    data = {**DATA, "global_batch_size": 6, "rampup": None, "mixture_schedule": None}
    with pytest.raises(DataConfigError, match=r"divides over data-parallel sizes \[1, 2, 3, 6\]"):
        iterators_from_config(data, create_mesh())


def test_a_saved_cursor_follows_datasets_by_name_when_the_datasets_change():
    from xlstm_data.multihost.plan_state import cursor_by_name

    # [step, stage start, block start a, b, rows taken a, b, served a, b, offset a, b]
    state = {"sources": ["a", "b"], "cursor": [30, 10, 2048, 64, 7, 9, 500, 77, 0, 5]}
    assert cursor_by_name(state, ["b"]) == [30, 10, 64, 9, 77, 5]
    assert cursor_by_name(state, ["a", "b", "c"]) == [
        *[30, 10, 2048, 64, 0, 7, 9, 0, 500, 77, 0, 0, 5, 0]
    ]
    # Format 4 had no offsets: they read as 0.
    old = {"sources": ["a", "b"], "cursor": [30, 10, 2048, 64, 7, 9, 500, 77], "format_version": 4}
    assert cursor_by_name(old, ["b"]) == [30, 10, 64, 9, 77, 0]
    with pytest.raises(DataCheckpointError, match="corrupted"):
        cursor_by_name({"sources": ["a"], "cursor": [3, 40, 7]}, ["a"])


def test_the_iterator_tells_a_loop_its_tokenizer_vocabulary_and_end_of_document_id(tmp_path):
    from xlstm_data.sources.tokenizers import ByteTokenizer

    for name in ("a", "b"):
        (tmp_path / f"{name}.txt").write_text("".join(f"{name} line {i}\n" for i in range(300)))
    data = {
        "train": {
            name: {"kind": "text", "path": str(tmp_path / f"{name}.txt"), "weight": 0.5}
            for name in ("a", "b")
        },
        "global_batch_size": 4,
        "max_target_length": 32,
    }
    train, _ = iterators_from_config(data, create_mesh())
    try:
        assert isinstance(train.tokenizer, ByteTokenizer)
        assert train.vocab_size == 258 and train.eod_token_id == train.tokenizer.eod_id
        assert train.tokenizer.decode(np.asarray(next(train).inputs)[0][:3]) != ""
    finally:
        train.close()
    synthetic = {"train": {"s": {"kind": "synthetic", "num_documents": 100}}}
    train, _ = iterators_from_config(
        {**synthetic, "global_batch_size": 4, "max_target_length": 32}, create_mesh()
    )
    try:
        assert train.tokenizer is None and train.vocab_size == 258
    finally:
        train.close()


def test_workers_hand_over_chunks_of_steps_that_are_the_inline_steps():
    """Past the steps computed in this process, workers send 8 steps at a time.

    Every step after the handover (4 steps with 2 workers of buffer 1) comes
    from a chunk: across ramp-up stages, to the finite plan's last, partial
    chunk, and resumed inside a chunk, on another worker count.
    """
    data = ONE_SOURCE_EPOCH
    mesh = create_mesh()
    expected = _whole_epoch_inline(data, mesh)
    assert len(expected) > 13 and (len(expected) - 4) % 8  # the last chunk is partial
    inline, _ = iterators_from_config(data, mesh)
    try:
        _take(inline, 13)
        state = inline.get_state()
    finally:
        inline.close()
    with_workers, _ = iterators_from_config({**data, "worker_count": 2}, mesh)
    try:
        first = _take(with_workers, 13)
        assert with_workers.get_state()["cursor"] == state["cursor"]  # mid-chunk position
        _assert_same(first + [_host(batch) for batch in with_workers], expected)
    finally:
        with_workers.close()
    resumed, _ = iterators_from_config({**data, "worker_count": 3}, mesh)
    try:
        resumed.set_state(state)
        _assert_same([_host(batch) for batch in resumed], expected[13:])
    finally:
        resumed.close()


def test_a_workers_chunk_is_picked_from_its_slot_and_no_batch_aliases_the_slot(monkeypatch):
    """Past the pytree steps, each step is picked from the worker's slot itself (no copy).

    Every batch is kept as device arrays until the end, while the worker
    rewrites its slots many times: a batch still reading a slot would differ
    from the inline run's.
    """
    data = {
        "train": {"a": {"kind": "synthetic", "num_documents": 2000, "mean_length": 80}},
        "global_batch_size": 8,
        "max_target_length": 64,
        "worker_buffer_size": 1,
    }
    steps = global_arrays.PYTREE_STEPS + 40
    picked_in_place = []
    pick = global_arrays._ReleasedWhenPicked.pick  # noqa: SLF001

    def counted(self, *args):
        picked_in_place.append(1)
        return pick(self, *args)

    monkeypatch.setattr(global_arrays._ReleasedWhenPicked, "pick", counted)  # noqa: SLF001
    lent = []
    lease = shared_slots.SlotRing.lease
    monkeypatch.setattr(
        shared_slots.SlotRing, "lease", lambda ring, element: lent.append(1) or lease(ring, element)
    )
    mesh = create_mesh()
    with_workers, _ = iterators_from_config({**data, "worker_count": 1}, mesh)
    try:
        batches = [next(with_workers)]
        deadline = time.monotonic() + 60  # until the worker's first chunk is there
        while not lent and time.monotonic() < deadline:
            time.sleep(0.05)
        assert lent, "the worker sent no chunk within 60 s"
        batches += [next(with_workers) for _ in range(steps - 1)]
    finally:
        with_workers.close()
    assert len(picked_in_place) >= 24  # the chunks after the pytree steps
    inline, _ = iterators_from_config(data, mesh)
    try:
        _assert_same([_host(batch) for batch in batches], _take(inline, steps))
    finally:
        inline.close()
