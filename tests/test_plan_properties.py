"""What the plan serves, checked as properties over random corpora and schedules.

Each example draws sources (10 to 10^6 documents, lengths from 1 to 100 rows),
a ramp-up, 1 to 5 mixture stages at random steps, a packing mode, a mixture
unit and a host count, then walks the plan the way hosts do and checks:

1. every stage of at least 200 steps serves each source within 1.0 point of
   its weight (tokens, or documents with `mixture_unit="documents"`). With
   documents the bound is also one row's documents over the stage's: rows
   are whole, so a stage of 107 documents next to a source that begins 12 in
   one row cannot split finer (hypothesis found 51/56 where 50/50 was asked:
   ~80-row documents against 4-token ones, in a fresh clone's run);
2. the rows of every step before a stage's start equal those of the plan
   with the schedule cut there;
3. no piece of a document is served a second time before every document of
   its source has been served once in that epoch.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers import plan_spec
from xlstm_data.config.rampup import BatchSizeSchedule
from xlstm_data.plan.global_plan import GlobalPlan, HostPlanner
from xlstm_data.plan.mixture import parse_mixture_schedule
from xlstm_data.plan.packing import MODES
from xlstm_data.plan.pieces import Pieces, example_tokens
from xlstm_data.plan.source_rows import row_units
from xlstm_data.plan.spec import PlanSpec

NAMES = ("a", "b", "c")
SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def corpora(draw, max_documents: int = 10**6):
    """1-3 sources of lognormal lengths, each with its own mean (1/8 to 100 rows)."""
    row_length = draw(st.sampled_from([16, 32, 64]))
    count = draw(st.integers(1, 3))
    lengths = []
    for i in range(count):
        documents = draw(st.sampled_from([10, 37, 300, 2000, max_documents]))
        mean_rows = draw(st.sampled_from([0.05, 0.3, 1.0, 4.0, 100.0]))
        rng = np.random.default_rng(draw(st.integers(0, 2**16)) + i)
        values = rng.lognormal(np.log(mean_rows * row_length), 0.8, documents)
        lengths.append(np.clip(values, 1, 100 * row_length).astype(np.int64))
    return row_length, lengths


@st.composite
def schedules(draw, count: int, steps: int):
    """1-5 stages at random steps; a stage may turn sources off, never all of them."""
    stages = draw(st.integers(1, 5))
    starts = sorted({0, *draw(st.lists(st.integers(1, steps - 1), max_size=stages - 1))})
    pairs = []
    for start in starts:
        weights = draw(st.lists(st.sampled_from([0, 1, 2, 5, 17]), min_size=count, max_size=count))
        if not any(weights):
            weights[draw(st.integers(0, count - 1))] = 1
        pairs.append([start, {NAMES[i]: w for i, w in enumerate(weights)}])
    return pairs


@st.composite
def plans(draw, steps: int, max_documents: int = 10**6, max_rows: int = 1024):
    """A plan and a host count; global batches of 4 to `max_rows` rows.

    A source of ten 2-token documents gives about one row per block: walking
    400 steps of 1,024 rows on 4 hosts took minutes, so a test that walks
    many steps on several hosts bounds the batch.
    """
    row_length, lengths = draw(corpora(max_documents))
    names = NAMES[: len(lengths)]
    hosts = draw(st.sampled_from([h for h in (1, 2, 3, 4, 8, 64) if 4 * h <= max_rows]))
    per_host = draw(st.sampled_from([p for p in (1, 2, 4) if 4 * hosts * p <= max_rows]))
    rampup = draw(
        st.sampled_from([None, [[0, 0.5], [steps // 3, 1]], [[0, 0.25], [40, 0.5], [90, 1]]])
    )
    batch = 4 * hosts * per_host  # every ramp-up factor keeps it divisible by the hosts
    schedule = draw(schedules(len(names), steps))
    spec = PlanSpec(
        names=names,
        mixture=parse_mixture_schedule(schedule, names, {}),
        mixture_unit=draw(st.sampled_from(["tokens", "documents"])),
        row_length=row_length,
        packing=draw(st.sampled_from(MODES)),
        shift=True,
        shift_target=draw(st.booleans()),
        seed=draw(st.integers(0, 1000)),
        shuffle=True,
        batch=BatchSizeSchedule(batch, rampup),
        block_documents=draw(st.sampled_from([7, 64, 2048])),
    )
    return GlobalPlan(spec, lengths), hosts


def _walk(plan: GlobalPlan, hosts: int, steps: int) -> list[Pieces]:
    """The global batch of each step, joined from every host's planner."""
    planners = [HostPlanner(plan, h, hosts) for h in range(hosts)]
    return [Pieces.concat([p.pieces_at(step) for p in planners]) for step in range(steps)]


def _units(pieces: Pieces, unit: str, sources: int) -> np.ndarray:
    chosen = np.ones(len(pieces.source), bool) if unit == "tokens" else pieces.start == 0
    weights = (pieces.stop - pieces.start)[chosen] if unit == "tokens" else None
    return np.bincount(pieces.source[chosen], weights=weights, minlength=sources)


# Batches up to 64 rows: a 256-row batch of 7-document blocks of short documents
# took 22.9 s to walk for 600 steps, and this test took 36 to 244 s across suite runs.
# 10 fresh examples a run: 25 drawn here walked in up to 5.0 s each (1.25 s on average).
@settings(SETTINGS, max_examples=10)
@given(plans(steps=600, max_documents=10**5, max_rows=64))
def test_every_long_stage_serves_its_weights_within_one_point(drawn):
    plan, _ = drawn  # the global batch does not depend on the host count (test_plan)
    steps = 600
    batches = _walk(plan, 1, steps)
    mixture, n = plan.spec.mixture, len(plan.spec.names)
    ends = [*mixture.starts[1:], steps]
    for stage, (start, end) in enumerate(zip(mixture.starts, ends, strict=True)):
        if end - start < 200:
            continue
        served = sum(_units(b, plan.spec.mixture_unit, n) for b in batches[start:end])
        shares = served / served.sum()
        asked = np.asarray(mixture.weights[stage])
        # Rows are whole: a stage's documents split no finer than one row's documents.
        row_documents = max(int(row_units(b, "documents").max(initial=0)) for b in batches)
        granularity = (row_documents + 1) / served.sum()
        tolerance = max(0.01, granularity if plan.spec.mixture_unit == "documents" else 0)
        assert np.abs(shares - asked).max() <= tolerance, (stage, shares, asked, served)
        assert (served[asked == 0] == 0).all()


# Up to 64 rows, as above: with 128 this test took 30 to 65 s across suite runs.
@settings(SETTINGS, max_examples=12)
@given(plans(steps=300, max_rows=64), st.data())
def test_a_stage_changes_no_row_before_it_starts(drawn, data):
    plan, hosts = drawn
    mixture = plan.spec.mixture
    cut = data.draw(st.integers(1, 299))
    kept = [i for i, start in enumerate(mixture.starts) if start < cut]
    earlier = plan.with_mixture(
        type(mixture)(
            mixture.names,
            tuple(mixture.starts[i] for i in kept),
            tuple(mixture.weights[i] for i in kept),
        )
    )
    assert earlier.document_tokens == plan.document_tokens
    hosts = min(hosts, 4)
    for a, b in zip(_walk(plan, hosts, cut), _walk(earlier, hosts, cut), strict=True):
        assert a.equals(b)


# 10 fresh examples a run (took 14-42 s across suite runs with 15).
@settings(SETTINGS, max_examples=10)
@given(plans(steps=200, max_documents=300, max_rows=64))
def test_no_piece_is_served_twice_before_its_epoch_is_complete(drawn):
    plan, hosts = drawn
    spec = plan.spec
    walked = _walk(plan, min(hosts, 4), 200)
    # Every piece in serving order (step, row, piece), vectorised: a loop per piece
    # over 400 steps of 1,024 rows of 3-token documents ran past 300 s in CI.
    every = Pieces.concat(walked)
    rows = every.row_offsets[:-1][np.diff(every.row_offsets) > 0]
    lowest = np.minimum.reduceat(every.source, rows)
    assert (lowest == np.maximum.reduceat(every.source, rows)).all(), "a row mixes sources"
    step = np.repeat(np.arange(len(walked)), [int(p.row_offsets[-1]) for p in walked])
    taken = every.stop - every.start
    for source, lengths in enumerate(plan.lengths):
        size = example_tokens(lengths, spec.shift, spec.shift_target)
        chosen = np.flatnonzero(every.source == source)
        document, piece = every.document[chosen], taken[chosen]
        order = np.argsort(document, kind="stable")
        # Tokens of its document served up to and including each piece.
        served = np.empty_like(piece)
        grouped = np.cumsum(piece[order])
        first = np.r_[True, document[order][1:] != document[order][:-1]]
        before = np.maximum.accumulate(np.where(first, grouped - piece[order], 0))
        served[order] = grouped - before
        own = size[document]  # example positions of each piece's document
        epoch = (served - 1) // own  # the epoch a piece's tokens belong to
        completes = served // own > (served - piece) // own
        # Epoch k is complete after the last of the source's documents completes it.
        real = int((size > 0).sum())
        done = np.full(int(epoch.max(initial=0)) + 2, np.iinfo(np.int64).max)
        k, at = served[completes] // own[completes], np.flatnonzero(completes)
        for value in np.unique(k):
            if (k == value).sum() == real:
                done[value] = at[k == value].max()
        later = epoch > 0
        early = later & (done[epoch] >= np.arange(len(chosen)))
        assert not early.any(), (
            f"step {step[chosen][early][0]}: {spec.names[source]} document "
            f"{document[early][0]} served again before epoch {epoch[early][0]} was complete"
        )


def test_a_source_smaller_than_a_block_is_served_once_per_epoch():
    """627 documents, blocks of 2048: the case that repeated 3 % of tokens on 64 streams."""
    rng = np.random.default_rng(0)
    lengths = [
        rng.lognormal(np.log(9000), 0.5, 4263).astype(np.int64),
        rng.lognormal(np.log(18000), 0.5, 627).astype(np.int64),
    ]
    plan = GlobalPlan(plan_spec({"a": 0.2, "b": 0.8}), lengths)
    planner = HostPlanner(plan, 0, 1)
    size = example_tokens(lengths[1], True, True)
    served = np.zeros(len(size), dtype=np.int64)
    epoch = 0
    for step in range(3000):
        pieces = planner.pieces_at(step)
        for row in range(pieces.rows):
            lo, hi = pieces.row_offsets[row], pieces.row_offsets[row + 1]
            if hi > lo and pieces.source[lo] == 1:
                np.add.at(served, pieces.document[lo:hi], pieces.stop[lo:hi] - pieces.start[lo:hi])
                assert (served <= (epoch + 1) * size).all(), step
                epoch = int((served // size).min())
    assert epoch >= 1  # the test crossed into the second epoch


def test_an_eval_pass_is_dense_ordered_and_serves_every_token_once():
    """12 held-out documents of ~20k tokens, batches of 16 x 128 (it was 410 batches for 153)."""
    from xlstm_data.config.data_config import validate_data_config
    from xlstm_data.from_config import eval_plan_spec

    rng = np.random.default_rng(4)
    lengths = rng.lognormal(np.log(20_000), 0.3, 12).astype(np.int64)
    cfg = validate_data_config(
        {
            "train": {"t": {"kind": "synthetic", "num_documents": 10}},
            "eval": {"held_out": {"kind": "synthetic", "num_documents": 12}},
            "global_batch_size": 16,
            "max_target_length": 128,
        }
    )
    plan = GlobalPlan(eval_plan_spec(cfg, "held_out"), [lengths])
    steps = plan.num_steps()
    sizes = example_tokens(lengths, True, True)
    assert steps <= 1.05 * np.ceil(sizes.sum() / (16 * 128)) + 1, steps
    for hosts in (1, 2, 4):
        planners = [HostPlanner(plan, h, hosts) for h in range(hosts)]
        batches = [Pieces.concat([p.pieces_at(s) for p in planners]) for s in range(steps)]
        served = np.zeros(len(lengths), dtype=np.int64)
        empty_seen = False
        for pieces in batches:
            np.add.at(served, pieces.document, pieces.stop - pieces.start)
            for row in range(pieces.rows):
                empty = pieces.row_offsets[row] == pieces.row_offsets[row + 1]
                assert not (empty_seen and not empty), "a padding row before real rows"
                empty_seen |= bool(empty)
        np.testing.assert_array_equal(served, sizes)  # every token exactly once
        assert batches[0].row_list(0)[0][1] == 0  # the pass opens with the first document
        firsts = [int(p.document[p.start == 0].min()) for p in batches if (p.start == 0).any()]
        assert firsts == sorted(firsts)  # documents begin in corpus order


@SETTINGS
@given(
    corpora(max_documents=2000),
    st.sampled_from([1, 3, 7, 64, 2048]),
    st.sampled_from([None, 1, 2]),
    st.sampled_from([1, 2, 4]),
    st.booleans(),
    st.integers(0, 1000),
)
def test_concat_fills_every_row_but_at_the_end_of_a_finite_run(
    drawn, block_documents, num_epochs, hosts, shift_target, seed
):
    """Every concat row is full (blocks complete their last row from the next documents).

    Endless runs check 120 steps; a finite run of one source checks every
    step: every row is full but in the last step, and every example position
    of every document is served exactly once per epoch.
    """
    row_length, lengths = drawn
    lengths = lengths[:1] if num_epochs is not None else lengths
    names = NAMES[: len(lengths)]
    spec = PlanSpec(
        names=names,
        mixture=parse_mixture_schedule([[0, dict.fromkeys(names, 1)]], names, {}),
        mixture_unit="tokens",
        row_length=row_length,
        packing="concat",
        shift=True,
        shift_target=shift_target,
        seed=seed,
        shuffle=True,
        batch=BatchSizeSchedule(4 * hosts, None),
        block_documents=block_documents,
        num_epochs=num_epochs,
        drop_remainder=False,
    )
    plan = GlobalPlan(spec, lengths)
    steps = 120 if num_epochs is None else plan.num_steps()
    batches = _walk(plan, hosts, steps)
    for step, pieces in enumerate(batches[:-1] if num_epochs else batches):
        filled = np.add.reduceat(pieces.stop - pieces.start, pieces.row_offsets[:-1])
        assert (np.diff(pieces.row_offsets) > 0).all() and (filled == row_length).all(), step
    if num_epochs is not None:
        sizes = example_tokens(lengths[0], True, shift_target)
        served = np.zeros(len(sizes), dtype=np.int64)
        for pieces in batches:
            np.add.at(served, pieces.document, pieces.stop - pieces.start)
        np.testing.assert_array_equal(served, num_epochs * sizes)


@settings(max_examples=200, deadline=None)
@given(
    count=st.integers(1, 5000),
    high=st.sampled_from([1, 2, 100, 2**16, 2**31 - 1]),
    seed=st.integers(0, 2**16),
    shift=st.booleans(),
    shift_target=st.booleans(),
)
def test_the_plan_sums_each_source_once_and_keeps_its_mean_length_whole(
    count, high, seed, shift, shift_target
):
    """The plan's one pass over the lengths gives their sum and their exact mean.

    The mean (positions a document fills) sets the reported shares of
    `mixture_unit="documents"`: it was cut to a whole number, so a source of
    documents of 1 or 2 tokens read as 1, and one of mean 0.3 as empty. The
    sum is the corpus size `check_batch_fits` refuses too large a batch against.
    """
    lengths = np.random.default_rng(seed).integers(0, high, count, endpoint=True, dtype=np.int32)
    lengths[0] = max(int(lengths[0]), 1)  # never all empty
    spec = plan_spec({"a": 1.0}, mixture_unit="documents", shift=shift, shift_target=shift_target)
    plan = GlobalPlan(spec, [lengths])
    assert plan.document_tokens == (int(lengths.sum(dtype=np.int64)),)
    positions = example_tokens(lengths, shift, shift_target)
    assert plan.mean_tokens.tolist() == [lengths.mean() + (positions[0] - lengths[0])]
    assert plan.mean_tokens[0] == pytest.approx(positions.mean(), rel=1e-12)
