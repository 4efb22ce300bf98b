"""The data plan as a pure function, over many host counts, packings and stage layouts.

No processes and no documents: the plan is computed from lengths alone, so
every property is checked on the plan itself (MosaicML streaming checks its
partition the same way, for node counts 1..120).
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

from tests.helpers import plan_spec
from xlstm_data.batch import LLM_BATCH_FIELDS
from xlstm_data.config.rampup import BatchSizeSchedule
from xlstm_data.errors import DataCheckpointError, DataConfigError
from xlstm_data.plan.global_plan import GlobalPlan, HostPlanner
from xlstm_data.plan.mixture import parse_mixture_schedule
from xlstm_data.plan.order import EPOCHS_KEPT
from xlstm_data.plan.packing import MODES, packing_mode
from xlstm_data.plan.permutation import FeistelPermutation
from xlstm_data.plan.pieces import Pieces, example_tokens
from xlstm_data.plan.spec import PlanSpec
from xlstm_data.reading.planned_batches import PlannedBatchDataset
from xlstm_data.reading.row_assembly import fields_of
from xlstm_data.sources import InMemorySource, SyntheticSource

#: Stage layouts: (name, global batch, ramp-up, mixture schedule or None).
LAYOUTS = {
    "constant": (60, None, None),
    "rampup": (64, [[0, 0.25], [3, 0.5], [7, 1]], None),
    "stages": (48, None, [[0, {"a": 1, "b": 1}], [4, {"b": 1}], [9, {"a": 3, "b": 1}]]),
    "rampup_and_stages": (
        120,
        [[0, 0.5], [5, 1]],
        [[0, {"a": 1, "b": 0}], [3, {"a": 1, "b": 2}], [8, {"a": 0, "b": 1}]],
    ),
}


def _lengths(seed: int, count: int, mean: float) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.maximum(0, rng.lognormal(np.log(mean), 1.0, count)).astype(np.int64)


SOURCES = {"a": _lengths(0, 700, 40.0), "b": _lengths(1, 400, 12.0)}


def make_plan(
    layout: str,
    packing: str,
    *,
    num_epochs: int | None = None,
    drop_remainder: bool = True,
    names: tuple[str, ...] = ("a", "b"),
    shift: bool = True,
    shift_target: bool = True,
    block_documents: int = 48,
    row_length: int = 32,
) -> GlobalPlan:
    batch_size, rampup, schedule = LAYOUTS[layout]
    if num_epochs is not None:
        names, schedule = ("a",), None
    batch = BatchSizeSchedule(batch_size, rampup)
    mixture = parse_mixture_schedule(schedule, names, {n: 1.0 for n in names})
    spec = PlanSpec(
        names=names,
        mixture=mixture,
        mixture_unit="tokens",
        row_length=row_length,
        packing=packing,
        shift=shift,
        shift_target=shift_target,
        seed=3,
        shuffle=True,
        batch=batch,
        block_documents=block_documents,
        num_epochs=num_epochs,
        drop_remainder=drop_remainder,
    )
    return GlobalPlan(spec, [SOURCES[n] for n in names])


def _divisors_of_all(plan: GlobalPlan, limit: int = 64) -> list[int]:
    sizes = [s.global_batch_size for s in plan.spec.batch.stages()]
    return [h for h in range(1, limit + 1) if all(b % h == 0 for b in sizes)]


def _cursor_saved_at(plan: GlobalPlan, hosts: int, step: int):
    """The cursor at `step`, as each of `hosts` hosts that ran steps 0..step-1 saves it."""
    cursors = []
    for host in range(hosts):
        saver = HostPlanner(plan, host, hosts)
        for done in range(step):
            saver.pieces_at(done)
        cursors.append(saver.cursor_at(step))
    assert all(c == cursors[0] for c in cursors)
    return cursors[0]


def _same(a: Pieces, b: Pieces) -> None:
    for field in ("row_offsets", "source", "document", "start", "stop"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field), err_msg=field)


def test_feistel_is_a_permutation_for_many_sizes():
    for size in [1, 2, 3, 4, 5, 7, 8, 9, 100, 1000, 4097, 65_537]:
        values = FeistelPermutation(size, seed=size)(np.arange(size))
        assert sorted(values.tolist()) == list(range(size)), size
    a = FeistelPermutation(1000, seed=1)(np.arange(1000))
    b = FeistelPermutation(1000, seed=2)(np.arange(1000))
    assert (a != b).mean() > 0.9


def test_feistel_answers_any_position_of_a_huge_source_without_a_table():
    permutation = FeistelPermutation(10**8, seed=5)
    positions = np.array([0, 1, 10**8 - 1, 12_345_678])
    values = permutation(positions)
    assert ((values >= 0) & (values < 10**8)).all()
    assert len(set(values.tolist())) == 4
    np.testing.assert_array_equal(values[2:3], permutation(positions[2:3]))


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("packing", MODES)
def test_host_slices_concatenate_to_the_global_plan(layout, packing):
    """Every host count that divides the batch: the hosts' pieces are the global rows.

    Up to 6 hosts, all of them are planned and concatenated; above, the first,
    a middle and the last host are each compared with their slice of the global
    rows (`host_rows` tiles them by construction): each host plans the whole
    window, so planning all 60 of 60 hosts made this test ~40 s of CPU.
    """
    plan = make_plan(layout, packing)
    steps = 12
    world = HostPlanner(plan, 0, 1)
    expected = [world.pieces_at(step) for step in range(steps)]
    for hosts in _divisors_of_all(plan):
        if hosts <= 6:
            planners = [HostPlanner(plan, h, hosts) for h in range(hosts)]
            for step in range(steps):
                _same(Pieces.concat([p.pieces_at(step) for p in planners]), expected[step])
            continue
        for host in sorted({0, hosts // 2, hosts - 1}):
            planner = HostPlanner(plan, host, hosts)
            for step in range(steps):
                lo, count = planner.host_rows(step)
                _same(planner.pieces_at(step), expected[step].row_slice(lo, lo + count))


@pytest.mark.parametrize("window_rows", [1, 7, 50])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_planning_steps_ahead_gives_each_steps_rows_and_cursor(monkeypatch, layout, window_rows):
    """Windows of many steps plan what one step at a time plans, cursors included."""
    from xlstm_data.plan import global_plan

    for packing in ("best_fit", "concat"):
        plan = make_plan(layout, packing, block_documents=16)
        wide = HostPlanner(plan, 0, 1)
        expected = [(wide.pieces_at(step), wide.cursor_at(step + 1)) for step in range(14)]
        monkeypatch.setattr(global_plan, "WINDOW_ROWS", window_rows)
        for hosts in _divisors_of_all(plan, 8):
            for host in range(hosts):
                planner = HostPlanner(plan, host, hosts)
                for step in range(14):
                    pieces, cursor = expected[step]
                    lo, count = planner.host_rows(step)
                    _same(planner.pieces_at(step), pieces.row_slice(lo, lo + count))
                    assert planner.cursor_at(step + 1) == cursor
        monkeypatch.undo()


def _coverage(plan: GlobalPlan, hosts: int) -> dict[tuple[int, int], list[tuple[int, int]]]:
    steps = plan.num_steps()
    covered: dict[tuple[int, int], list[tuple[int, int]]] = {}
    planners = [HostPlanner(plan, h, hosts) for h in range(hosts)]
    for step in range(steps):
        for planner in planners:
            pieces = planner.pieces_at(step)
            for i in range(len(pieces.source)):
                key = (int(pieces.source[i]), int(pieces.document[i]))
                covered.setdefault(key, []).append((int(pieces.start[i]), int(pieces.stop[i])))
    return covered


@pytest.mark.parametrize("packing", MODES)
@pytest.mark.parametrize(("shift", "shift_target"), [(True, True), (True, False), (False, True)])
def test_an_epoch_covers_every_token_of_every_document_exactly_once(packing, shift, shift_target):
    for layout, hosts in (("constant", 1), ("constant", 4), ("rampup", 2), ("rampup", 16)):
        plan = make_plan(
            layout,
            packing,
            num_epochs=1,
            drop_remainder=False,
            shift=shift,
            shift_target=shift_target,
        )
        covered = _coverage(plan, hosts)
        sizes = example_tokens(SOURCES["a"], shift, shift_target)
        expected = {(0, d) for d in range(len(sizes)) if sizes[d] > 0}
        assert set(covered) == expected, (layout, hosts)
        for (_, doc), ranges in covered.items():
            position = 0
            for start, stop in sorted(ranges):
                assert start == position, (layout, hosts, doc)
                position = stop
            assert position == sizes[doc]


@pytest.mark.parametrize("packing", MODES)
def test_two_epochs_cover_each_document_twice_in_different_orders(packing):
    plan = make_plan("constant", packing, num_epochs=2, drop_remainder=False)
    covered = _coverage(plan, 3)
    sizes = example_tokens(SOURCES["a"], True, True)
    for (_, doc), ranges in covered.items():
        assert sum(b - a for a, b in ranges) == 2 * sizes[doc]
    first = make_plan("constant", packing, num_epochs=1, drop_remainder=False)
    order1 = [int(d) for d in HostPlanner(first, 0, 1).pieces_at(0).document]
    second = HostPlanner(plan, 0, 1)
    late = [int(d) for d in second.pieces_at(plan.num_steps() - 2).document]
    assert order1 != late


def test_an_endless_run_keeps_a_bounded_number_of_epoch_orders(monkeypatch):
    """Worker memory grew with every epoch planned: each epoch's table stayed cached."""
    import xlstm_data.plan.order

    monkeypatch.setattr(xlstm_data.plan.order, "SMALL_EPOCHS_POSITIONS", 1600)  # 4 of b's
    plan = make_plan("constant", "best_fit")
    planner = HostPlanner(plan, 0, 1)
    for step in range(300):  # source b passes ~60 epochs, a ~10
        planner.pieces_at(step)
    assert planner.cursor_at(300).position[1] > 40 * len(SOURCES["b"])
    kept = [EPOCHS_KEPT, 4]
    assert all(len(o._epochs) <= k for o, k in zip(plan.orders, kept, strict=True))
    # An epoch dropped from the cache comes back identical.
    order = plan.orders[1]
    positions = np.arange(0, 3 * order.num_documents, 7)
    assert np.array_equal(order.documents(positions), order.without_cache().documents(positions))
    assert len(order._epochs) <= kept[1]


def test_an_epoch_table_is_built_only_once_much_of_the_epoch_is_looked_up():
    """A cold start needs one block of a large source: no table of 10^5 entries for it."""
    from xlstm_data.plan.order import TABLE_AFTER_POSITIONS, SourceOrder

    order = SourceOrder(100_000, 3, "web", True)
    first = order.documents(np.arange(2048))
    assert not isinstance(order._epochs[0], np.ndarray)
    rest = order.documents(np.arange(2048, TABLE_AFTER_POSITIONS + 1))
    assert isinstance(order._epochs[0], np.ndarray)  # the table now
    whole = SourceOrder(100_000, 3, "web", True).documents(np.arange(100_000))
    np.testing.assert_array_equal(np.concatenate([first, rest]), whole[: len(first) + len(rest)])
    np.testing.assert_array_equal(order.documents(np.arange(100_000)), whole)


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("packing", ["best_fit", "concat"])
def test_resuming_from_a_cursor_on_another_host_count_continues_the_same_plan(layout, packing):
    plan = make_plan(layout, packing)
    world = HostPlanner(plan, 0, 1)
    expected = [world.pieces_at(step) for step in range(14)]
    host_counts = _divisors_of_all(plan, 16)
    for saved_hosts, resumed_hosts in itertools.permutations(host_counts[:4], 2):
        cursor = _cursor_saved_at(plan, saved_hosts, 6)
        resumed = [HostPlanner(plan, h, resumed_hosts, cursor) for h in range(resumed_hosts)]
        for step in range(6, 14):
            _same(Pieces.concat([p.pieces_at(step) for p in resumed]), expected[step])


def test_mixture_stages_hold_their_token_shares():
    schedule = [[0, {"a": 1, "b": 1}], [200, {"a": 1, "b": 3}], [400, {"a": 0, "b": 1}]]
    lengths = {"a": _lengths(5, 5000, 300.0), "b": _lengths(6, 5000, 30.0)}
    batch = BatchSizeSchedule(16, [[0, 0.5], [100, 1]])
    spec = plan_spec(
        {"a": 1, "b": 1},
        mixture=parse_mixture_schedule(schedule, ("a", "b"), {}),
        row_length=256,
        batch=batch,
        block_documents=512,
    )
    plan = GlobalPlan(spec, [lengths["a"], lengths["b"]])
    planner = HostPlanner(plan, 0, 1)
    for start, stop, share_a in ((0, 200, 0.5), (200, 400, 0.25), (400, 600, 0.0)):
        tokens = np.zeros(2)
        for step in range(start, stop):
            pieces = planner.pieces_at(step)
            tokens += np.bincount(pieces.source, weights=pieces.stop - pieces.start, minlength=2)
        assert abs(tokens[0] / tokens.sum() - share_a) < 0.01, (start, tokens / tokens.sum())
        if share_a == 0.0:  # turned off: not one token from the stage's first step on
            assert tokens[0] == 0


def test_document_weighting_follows_document_counts():
    lengths = {"a": _lengths(5, 5000, 300.0), "b": _lengths(6, 5000, 30.0)}
    spec = plan_spec(
        {"a": 1.0, "b": 1.0},
        mixture_unit="documents",
        row_length=256,
        batch=BatchSizeSchedule(16, None),
        block_documents=400,
    )
    planner = HostPlanner(GlobalPlan(spec, [lengths["a"], lengths["b"]]), 0, 1)
    docs = np.zeros(2)
    for step in range(150):
        pieces = planner.pieces_at(step)
        docs += np.bincount(pieces.source[pieces.start == 0], minlength=2)
    assert abs(docs[0] / docs.sum() - 0.5) < 0.02


def test_best_fit_fills_99_percent_of_the_lognormal_bench_corpus_at_1024():
    source = SyntheticSource(num_documents=20_000, mean_length=512.0, sigma=1.0, seed=1)
    plan = GlobalPlan(plan_spec({"web": 1.0}, row_length=1024, num_epochs=1), [source.lengths()])
    planner = HostPlanner(plan, 0, 1)
    tokens = sum(planner.pieces_at(step).tokens for step in range(plan.num_steps()))
    assert tokens / (plan.num_steps() * 64 * 1024) >= 0.99
    # Only documents longer than a row are split.
    split = 0
    again = HostPlanner(plan, 0, 1)
    for step in range(5):
        pieces = again.pieces_at(step)
        split += int(((pieces.start > 0) & (pieces.stop - pieces.start < 1024)).sum())
    long_docs = (source.lengths() > 1024).sum()
    assert split <= long_docs


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ([[1, {"a": 1}]], "must start at 0"),
        ([[0, {"a": 1}], [5, {"b": 1}], [3, {"a": 1}]], "strictly increasing"),
        ([[0, {"a": 1, "c": 1}]], "unknown components ['c']"),
        ([[0, {"a": 1}], [4, {"a": 0, "b": 0}]], "all weights are zero"),
        ([[0, {"a": 1}], [2.5, {"a": 1}]], "int >= 0"),
        ([[0, {"a": 1}], [-2, {"a": 1}]], "int >= 0"),
        ([[0, {"a": -1}]], "finite number >= 0"),
        ("a:1", "non-empty list"),
    ],
)
def test_bad_mixture_schedules_are_refused_naming_the_key(value, message):
    with pytest.raises(DataConfigError, match="data.mixture_schedule") as error:
        parse_mixture_schedule(value, ("a", "b"), {})
    assert message in str(error.value)


def test_packing_values():
    assert packing_mode(True) == "best_fit"
    assert packing_mode(False) == "none"
    for mode in MODES:
        assert packing_mode(mode) == mode
    with pytest.raises(DataConfigError, match=r"data.packing='tight' is invalid.*best_fit"):
        packing_mode("tight")


def test_the_plan_depends_on_neither_host_count_nor_planning_history():
    plan = make_plan("rampup_and_stages", "first_fit")
    again = make_plan("rampup_and_stages", "first_fit")
    a, b = HostPlanner(plan, 0, 1), HostPlanner(again, 1, 2)
    for step in range(8):
        a.pieces_at(step)
    _same(a.pieces_at(8).row_slice(60, 120), b.pieces_at(8))


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_planner_asked_for_an_earlier_step_plans_again_from_its_cursor(layout):
    """A grain dataset of the steps iterated a second time starts again at its first index."""
    plan = make_plan(layout, "best_fit")
    expected = [HostPlanner(plan, 0, 1).pieces_at(step) for step in range(40)]
    planner = HostPlanner(plan, 0, 1)
    for step in [*range(30), 0, 1, 25, 3, *range(30, 40), 7]:
        _same(planner.pieces_at(step), expected[step])
    planner.pieces_at(39)
    assert planner.cursor_at(12) == _cursor_saved_at(plan, 1, 12)  # a rewind through cursor_at
    assert planner.cursor_at(0) == plan.start_cursor()
    cursor = _cursor_saved_at(plan, 1, 10)
    resumed = HostPlanner(plan, 0, 1, cursor)
    for step in [20, 10, 15]:
        _same(resumed.pieces_at(step), expected[step])
    with pytest.raises(DataCheckpointError, match="data step 9, before the cursor it started from"):
        resumed.pieces_at(9)


def test_a_plan_sent_to_a_worker_maps_its_lengths_instead_of_copying_them(tmp_path):
    import pickle

    big = np.tile(SOURCES["a"], 200)
    np.save(tmp_path / "lengths.npy", big)
    mapped = np.load(tmp_path / "lengths.npy", mmap_mode="r")
    plan = make_plan("constant", "best_fit")
    plan = GlobalPlan(plan.spec, [mapped, SOURCES["b"]])
    HostPlanner(plan, 0, 1).pieces_at(2)  # fills the order caches
    payload = pickle.dumps(plan)
    assert len(payload) < big.nbytes / 10
    copy = pickle.loads(payload)
    assert isinstance(copy.lengths[0], np.memmap)
    assert copy.document_tokens == plan.document_tokens == (int(big.sum()), int(SOURCES["b"].sum()))
    assert copy.mean_tokens.tolist() == plan.mean_tokens.tolist()
    for step in range(3):
        _same(HostPlanner(copy, 0, 1).pieces_at(step), HostPlanner(plan, 0, 1).pieces_at(step))


class _PlainSource:
    """A grain random-access source of `{"tokens": ...}` without `read_many`."""

    def __init__(self, documents):
        self._documents = documents

    def __len__(self) -> int:
        return len(self._documents)

    def __getitem__(self, index):
        return {"tokens": self._documents[index]}


@pytest.mark.parametrize("shift, shift_target", [(True, True), (True, False), (False, False)])
def test_assembled_batches_equal_a_piece_by_piece_reference(shift, shift_target):
    """Whole-batch assembly (batched reads, threads, any source) fills rows as a loop would."""
    plan = make_plan("rampup", "best_fit", shift=shift, shift_target=shift_target)
    rng = np.random.default_rng(5)
    documents = [
        [rng.integers(2, 250, n, dtype=np.int32) for n in SOURCES[name]] for name in ("a", "b")
    ]
    eod = 1
    datasets = {
        "read_many": PlannedBatchDataset(plan, [InMemorySource(d) for d in documents], 0, 1, eod),
        "threads": PlannedBatchDataset(
            plan, [InMemorySource(d) for d in documents], 0, 1, eod, read_threads=3
        ),
        "plain": PlannedBatchDataset(plan, [_PlainSource(d) for d in documents], 0, 1, eod),
    }
    planner = HostPlanner(plan, 0, 1)
    length = plan.spec.row_length
    for step in range(12):
        pieces = planner.pieces_at(step)
        want = {name: np.zeros((pieces.rows, length), np.int32) for name in LLM_BATCH_FIELDS}
        want["source_ids"] = np.full((pieces.rows, length), -1, np.int32)
        for row in range(pieces.rows):
            col = 0
            for segment, (source, doc, start, stop) in enumerate(pieces.row_list(row), 1):
                tokens = documents[source][doc]
                stream = np.concatenate(
                    [[eod], tokens, [eod]] if shift and not shift_target else [tokens, [eod]]
                )
                n = stop - start
                want["inputs"][row, col : col + n] = stream[start:stop]
                want["targets"][row, col : col + n] = stream[start + shift : stop + shift]
                for prefix in ("inputs", "targets"):
                    want[f"{prefix}_segmentation"][row, col : col + n] = segment
                    want[f"{prefix}_position"][row, col : col + n] = np.arange(n)
                want["source_ids"][row, col : col + n] = source
                col += n
        for name, dataset in datasets.items():
            got = fields_of(dataset[step]["fields"])
            assert list(got) == [*LLM_BATCH_FIELDS, "source_ids"]
            for field in got:
                assert got[field].dtype == np.int32
                np.testing.assert_array_equal(got[field], want[field], err_msg=f"{name} {field}")


def _textbook_best_fit_decreasing(sizes: np.ndarray, row_length: int) -> list[int]:
    """Each item, largest first, into the open row with the least room that fits it."""
    rooms: list[int] = []
    row_of = [0] * len(sizes)
    for item in np.argsort(-sizes, kind="stable").tolist():
        fits = [row for row, room in enumerate(rooms) if room >= sizes[item]]
        row = min(fits, key=lambda r: rooms[r]) if fits else len(rooms)
        if not fits:
            rooms.append(row_length)
        rooms[row] -= int(sizes[item])
        row_of[item] = row
    return row_of


def test_best_fit_decreasing_is_the_textbook_algorithm():
    """The fast BFD (big items placed with numpy, open rows as sorted ints) places every
    item where the textbook algorithm does, ties to the lowest row included."""
    from xlstm_data.plan.packing import _best_fit_decreasing

    rng = np.random.default_rng(1)
    for case in range(400):
        row_length = int(rng.integers(1, 200))
        count = int(rng.integers(0, 120))
        if case % 2:
            sizes = rng.integers(1, row_length + 1, count)
        else:
            typical = np.log(max(1.0, row_length / 3))
            sizes = np.minimum(row_length, rng.lognormal(typical, 1.0, count).astype(np.int64) + 1)
        expected = _textbook_best_fit_decreasing(sizes, row_length)
        assert _best_fit_decreasing(sizes, row_length).tolist() == expected, (row_length, sizes)


def _textbook_first_fit(sizes: np.ndarray, row_length: int) -> list[int]:
    """Each item, in order, into the first open row with room for it."""
    rooms: list[int] = []
    row_of = []
    for size in sizes.tolist():
        row = next((r for r, room in enumerate(rooms) if room >= size), len(rooms))
        if row == len(rooms):
            rooms.append(row_length)
        rooms[row] -= size
        row_of.append(row)
    return row_of


def test_first_fit_is_the_textbook_algorithm():
    """The first fit that searches only rows with room, and none when no open row can
    hold the item, places every item where the textbook algorithm does (empty pieces too)."""
    from xlstm_data.plan.packing import _first_fit

    rng = np.random.default_rng(2)
    for case in range(400):
        row_length = int(rng.integers(1, 200))
        count = int(rng.integers(0, 160))
        if case % 3 == 0:  # whole rows and tails, as documents of many rows are cut
            sizes = np.where(
                rng.random(count) < 0.7, row_length, rng.integers(0, row_length, count)
            )
        elif case % 3 == 1:
            sizes = rng.integers(0, row_length + 1, count)
        else:
            typical = np.log(max(1.0, row_length / 3))
            sizes = np.minimum(row_length, rng.lognormal(typical, 1.0, count).astype(np.int64))
        sizes = np.asarray(sizes, dtype=np.int64)
        expected = _textbook_first_fit(sizes, row_length)
        assert _first_fit(sizes, row_length).tolist() == expected, (row_length, sizes)


@pytest.mark.parametrize("packing", ["best_fit", "concat"])
def test_a_plan_with_new_stages_reuses_the_blocks_planned_and_serves_the_same_rows(
    monkeypatch, packing
):
    """Blocks do not depend on the mixture: an update packs no block again, and its rows
    equal those of a plan built with the new stages from the start."""
    from xlstm_data.plan import source_rows

    packed = []
    plan_block = source_rows.SourceRows._plan_block

    def recorded(rows, start, offset):
        packed.append((id(rows.blocks), rows.index, start, offset))
        return plan_block(rows, start, offset)

    monkeypatch.setattr(source_rows.SourceRows, "_plan_block", recorded)
    plan = make_plan("stages", packing, block_documents=256)
    walked = HostPlanner(plan, 0, 1)
    for step in range(6):
        walked.pieces_at(step)
    cursor = walked.cursor_at(6)
    schedule = [[0, {"a": 1, "b": 1}], [4, {"b": 1}], [6, {"a": 1, "b": 5}]]
    mixture = parse_mixture_schedule(schedule, ("a", "b"), {})
    resumed = HostPlanner(plan.with_mixture(mixture), 0, 1, cursor)
    spec = dataclasses.replace(plan.spec, mixture=mixture)
    expected = HostPlanner(GlobalPlan(spec, [SOURCES["a"], SOURCES["b"]]), 0, 1)
    for step in range(6):
        expected.pieces_at(step)
    for step in range(6, 30):
        _same(resumed.pieces_at(step), expected.pieces_at(step))
        assert resumed.cursor_at(step + 1) == expected.cursor_at(step + 1)
    assert len(packed) == len(set(packed))  # no block of a cache packed twice
    shared = zip(plan.sources, resumed.plan.sources, strict=True)
    assert all(a.blocks is b.blocks for a, b in shared)
