"""Tests for batch-size ramp-up schedules (pure python, no devices)."""

from __future__ import annotations

import json
import pickle

import ml_collections
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xlstm_data.config.rampup import BatchSizeSchedule, RampupSchedule, Stage, parse_rampup
from xlstm_data.errors import DataConfigError

THREE_STAGES = {0: 0.25, 10: 0.5, 25: 1.0}


def _expected_global(step: int) -> int:
    """Straightforward expectation for THREE_STAGES with global batch 32."""
    if step < 10:
        return 8
    if step < 25:
        return 16
    return 32


def test_three_stage_batch_size_at_every_step() -> None:
    schedule = BatchSizeSchedule(32, parse_rampup(THREE_STAGES), data_parallel_size=4, host_count=2)
    for step in range(60):
        assert schedule.global_batch_size_at(step) == _expected_global(step)
        assert schedule.host_batch_size_at(step) == _expected_global(step) // 2
        assert schedule(step) == _expected_global(step) // 2
    assert schedule.rampup.factor_at(9) == 0.25
    assert schedule.rampup.factor_at(10) == 0.5
    assert schedule.rampup.factor_at(10**9) == 1.0
    # numpy integer steps (as train loops often hold) work too.
    assert schedule(np.int64(12)) == 8


def test_stages_and_next_boundary() -> None:
    schedule = BatchSizeSchedule(32, THREE_STAGES, data_parallel_size=4, host_count=2)
    assert schedule.stages() == [
        Stage(start_step=0, end_step=10, factor=0.25, global_batch_size=8, host_batch_size=4),
        Stage(start_step=10, end_step=25, factor=0.5, global_batch_size=16, host_batch_size=8),
        Stage(start_step=25, end_step=None, factor=1.0, global_batch_size=32, host_batch_size=16),
    ]
    assert [schedule.next_boundary(s) for s in (0, 9, 10, 24, 25, 1000)] == [
        10,
        10,
        25,
        25,
        None,
        None,
    ]


def test_no_rampup_is_constant() -> None:
    for value in (None, {}, [], (), ml_collections.ConfigDict()):
        rampup = parse_rampup(value)
        assert rampup == RampupSchedule((0,), (1.0,))
        assert rampup.is_constant
        assert rampup.to_pairs() == [[0, 1.0]]
    assert not parse_rampup({0: 0.5}).is_constant
    schedule = BatchSizeSchedule(8, None)
    assert [schedule(s) for s in range(5)] == [8] * 5
    assert schedule.next_boundary(0) is None
    assert schedule.examples_seen(5) == 40


def test_redundant_boundaries_are_merged() -> None:
    assert parse_rampup({0: 0.5, 10: 0.5, 20: 1.0}) == parse_rampup({0: 0.5, 20: 1.0})
    assert parse_rampup({0: 1.0, 100: 1.0}).is_constant


def test_all_forms_and_json_round_trips_are_equal() -> None:
    int_keys = {25: 1.0, 0: 0.25, 10: 0.5}
    str_keys = {"0": 0.25, "10": 0.5, "25": 1.0}
    pairs = [[10, 0.5], [0, 0.25], [25, 1.0]]
    tuples = ((0, 0.25), (10, 0.5), (25, 1.0))
    config = ml_collections.ConfigDict(int_keys)
    str_config = ml_collections.ConfigDict(str_keys)
    frozen = ml_collections.FrozenConfigDict({"rampup": str_keys, "pairs": pairs})
    forms = [
        int_keys,
        str_keys,
        pairs,
        tuples,
        config,
        str_config,
        frozen.rampup,
        frozen.pairs,
        json.loads(config.to_json()),
        json.loads(ml_collections.ConfigDict({"r": pairs}).to_json())["r"],
    ]
    forms += [json.loads(json.dumps(form)) for form in (int_keys, str_keys, pairs, tuples)]
    expected = RampupSchedule((0, 10, 25), (0.25, 0.5, 1.0))
    for form in forms:
        assert parse_rampup(form) == expected, form
    assert parse_rampup(expected.to_pairs()) == expected
    assert parse_rampup(json.loads(json.dumps(expected.to_pairs()))) == expected
    assert parse_rampup(expected) is expected


def test_pickle_round_trip() -> None:
    schedule = BatchSizeSchedule(32, THREE_STAGES, data_parallel_size=4, host_count=2)
    restored = pickle.loads(pickle.dumps(schedule))
    assert restored == schedule
    assert [restored(s) for s in range(40)] == [schedule(s) for s in range(40)]
    assert restored.stages() == schedule.stages()
    assert hash(restored) == hash(schedule)


@st.composite
def schedules(draw: st.DrawFn) -> BatchSizeSchedule:
    """Random valid schedules: stage batches are multiples of dp up to 3x the global batch."""
    hosts = draw(st.integers(1, 4))
    dp = hosts * draw(st.integers(1, 4))
    global_batch = dp * draw(st.integers(1, 16))
    n_extra = draw(st.integers(0, 4))
    later = draw(st.lists(st.integers(1, 200), min_size=n_extra, max_size=n_extra, unique=True))
    boundaries = [0, *sorted(later)]
    multiples = st.integers(1, 3 * global_batch // dp)
    factors = [draw(multiples) * dp / global_batch for _ in boundaries]
    rampup = dict(zip(boundaries, factors, strict=True))
    return BatchSizeSchedule(global_batch, rampup, data_parallel_size=dp, host_count=hosts)


@settings(max_examples=200, deadline=None)
@given(schedule=schedules(), step=st.integers(0, 400))
def test_examples_seen_matches_brute_force(schedule: BatchSizeSchedule, step: int) -> None:
    brute = sum(schedule.global_batch_size_at(s) for s in range(step))
    assert schedule.examples_seen(step) == brute
    assert schedule.step_for_examples(brute) <= step
    assert schedule.host_batch_size_at(step) * schedule.host_count == (
        schedule.global_batch_size_at(step)
    )
    assert schedule.global_batch_size_at(step) % schedule.data_parallel_size == 0


@settings(max_examples=200, deadline=None)
@given(schedule=schedules(), examples=st.integers(0, 20_000))
def test_step_for_examples_is_inverse(schedule: BatchSizeSchedule, examples: int) -> None:
    step = schedule.step_for_examples(examples)
    assert schedule.examples_seen(step) >= examples
    if step > 0:
        assert schedule.examples_seen(step - 1) < examples
    if examples == 0:
        assert step == 0


@settings(max_examples=100, deadline=None)
@given(schedule=schedules(), step=st.integers(0, 400))
def test_stages_agree_with_pointwise_queries(schedule: BatchSizeSchedule, step: int) -> None:
    stages = schedule.stages()
    (stage,) = [
        s for s in stages if s.start_step <= step and (s.end_step is None or step < s.end_step)
    ]
    assert stage.global_batch_size == schedule.global_batch_size_at(step)
    assert stage.factor == schedule.rampup.factor_at(step)
    assert schedule.next_boundary(step) == stage.end_step
    # One stage per batch shape: adjacent stages never share a batch size.
    assert all(
        a.global_batch_size != b.global_batch_size for a, b in zip(stages, stages[1:], strict=False)
    )


@pytest.mark.parametrize(
    ("value", "bad"),
    [
        ({"abc": 0.5, 0: 1.0}, "'abc'"),
        ({0: 1.0, 1.5: 0.5}, "1.5"),
        ({0: 1.0, True: 0.5}, "True"),
        ([[0, 1.0], ["x1", 0.5]], "'x1'"),
        ({0: 1.0, -5: 0.5}, "-5"),
        ({0: 1.0, "-5": 0.5}, "'-5'"),
        ({0: 0.5, "10": 0.75, 10: 1.0}, "10"),
        ([[0, 0.5], [10, 0.75], ["10", 1.0]], "'10'"),
        ({0: "half"}, "'half'"),
        ({0: True}, "True"),
        ({0: None}, "None"),
        ({0: 0.0}, "0.0"),
        ({0: -0.5}, "-0.5"),
        ({0: float("inf")}, "inf"),
        ({0: float("nan")}, "nan"),
        ({10: 0.5, 20: 1.0}, "10"),
        ([[0, 0.5, 3]], "[0, 0.5, 3]"),
        ([[0]], "[0]"),
        ([0.5], "0.5"),
        ("0:0.5", "'0:0.5'"),
        (0.5, "0.5"),
        ({0, 1}, "{0, 1}"),
    ],
)
def test_bad_rampup_raises_with_key_and_value(value: object, bad: str) -> None:
    with pytest.raises(DataConfigError) as info:
        parse_rampup(value, key="train.data.rampup")
    message = str(info.value)
    assert "train.data.rampup" in message
    assert bad in message


def test_missing_step_zero_suggests_adding_it() -> None:
    with pytest.raises(DataConfigError, match="step 0") as info:
        parse_rampup({"100": 0.5, "200": 1.0})
    assert "data.rampup" in str(info.value)
    assert "Add step 0" in str(info.value)


def test_duplicate_steps_message() -> None:
    with pytest.raises(DataConfigError, match="repeats step 10"):
        parse_rampup({0: 0.5, "10": 0.75, 10: 1.0})


def test_stage_not_divisible_by_dp_names_step_factor_and_sizes() -> None:
    with pytest.raises(DataConfigError) as info:
        BatchSizeSchedule(32, {0: 0.25, 10: 0.375, 20: 1.0}, data_parallel_size=8, host_count=2)
    message = str(info.value)
    for part in ("data.rampup", "step 10", "0.375", "= 12", "data-parallel size 8"):
        assert part in message, (part, message)
    # Suggests the nearest factors whose stage batch divides over dp: 8/32 and 16/32.
    assert "0.25 (= 8/32)" in message and "0.5 (= 16/32)" in message


def test_stage_not_whole_number_names_step_and_factor() -> None:
    with pytest.raises(DataConfigError) as info:
        BatchSizeSchedule(32, {0: 0.1, 5: 1.0}, data_parallel_size=4, key="cfg.rampup")
    message = str(info.value)
    for part in ("cfg.rampup", "step 0", "0.1", "3.2", "data-parallel size 4", "4/32"):
        assert part in message, (part, message)


def test_global_batch_smaller_than_dp_suggests_a_factor_above_one() -> None:
    with pytest.raises(DataConfigError) as info:
        BatchSizeSchedule(4, None, data_parallel_size=8, host_count=1)
    message = str(info.value)
    assert "factor 1.0" in message and "= 4" in message
    assert "multiples of 8/4" in message and "2.0 (= 8/4)" in message
    # The suggested factor is accepted.
    assert BatchSizeSchedule(4, {0: 2.0}, data_parallel_size=8).global_batch_size_at(0) == 8


@pytest.mark.parametrize(
    ("kwargs", "bad"),
    [
        ({"global_batch_size": 0}, "global_batch_size=0"),
        ({"global_batch_size": True}, "global_batch_size=True"),
        ({"data_parallel_size": 0}, "data_parallel_size=0"),
        ({"host_count": 0}, "host_count=0"),
        ({"data_parallel_size": 4, "host_count": 3}, "host_count=3"),
    ],
)
def test_bad_sizes_raise(kwargs: dict, bad: str) -> None:
    args = {"global_batch_size": 24, "rampup": None, **kwargs}
    with pytest.raises(DataConfigError) as info:
        BatchSizeSchedule(**args)
    assert bad in str(info.value)
    assert "data.rampup" in str(info.value)


def test_bad_steps_raise_value_error() -> None:
    schedule = BatchSizeSchedule(32, THREE_STAGES, data_parallel_size=4)
    for call in (
        schedule.global_batch_size_at,
        schedule.host_batch_size_at,
        schedule,
        schedule.examples_seen,
        schedule.next_boundary,
        schedule.rampup.factor_at,
    ):
        with pytest.raises(ValueError, match="-1"):
            call(-1)
        with pytest.raises(DataConfigError):
            call(1.5)
    with pytest.raises(ValueError, match="examples=-3"):
        schedule.step_for_examples(-3)


def test_direct_rampup_schedule_is_validated() -> None:
    with pytest.raises(DataConfigError, match="start at 0"):
        RampupSchedule((5,), (1.0,))
    with pytest.raises(DataConfigError, match="strictly increasing"):
        RampupSchedule((0, 10, 10), (0.25, 0.5, 1.0))
    with pytest.raises(DataConfigError, match="equal length"):
        RampupSchedule((0, 10), (0.5,))
    with pytest.raises(DataConfigError, match="-2.0"):
        RampupSchedule((0,), (-2.0,))
    assert RampupSchedule((0,), (2.0,)).factors == (2.0,)
    assert RampupSchedule([0, 10], [0.5, 1]) == RampupSchedule((0, 10), (0.5, 1.0))


# Factors above 1 (xlstm-jax configs use 2.0): they scale the base batch up.


def test_factors_above_one_scale_the_base_batch_up() -> None:
    schedule = BatchSizeSchedule(
        8, {0: 1.0, 5: 2.0, "9": 4}, data_parallel_size=4, host_count=2, key="data.rampup"
    )
    assert [schedule.global_batch_size_at(s) for s in (0, 4, 5, 8, 9, 100)] == [
        8,
        8,
        16,
        16,
        32,
        32,
    ]
    assert [schedule(s) for s in (0, 5, 9)] == [4, 8, 16]
    assert schedule.stages() == [
        Stage(start_step=0, end_step=5, factor=1.0, global_batch_size=8, host_batch_size=4),
        Stage(start_step=5, end_step=9, factor=2.0, global_batch_size=16, host_batch_size=8),
        Stage(start_step=9, end_step=None, factor=4.0, global_batch_size=32, host_batch_size=16),
    ]
    assert schedule.examples_seen(10) == 5 * 8 + 4 * 16 + 32
    assert schedule.step_for_examples(5 * 8 + 4 * 16 + 1) == 10
    # Fractions and factors above 1 mix; not cumulative: each scales the base batch.
    mixed = BatchSizeSchedule(16, [[0, 0.5], [3, 1.5], [6, 2.0]], data_parallel_size=4)
    assert [mixed.global_batch_size_at(s) for s in (0, 3, 6)] == [8, 24, 32]


def test_factor_above_one_survives_json_and_pickle() -> None:
    rampup = parse_rampup(json.loads(json.dumps({"0": 1.0, "100": 2.0})))
    assert rampup == RampupSchedule((0, 100), (1.0, 2.0))
    assert not rampup.is_constant
    assert parse_rampup(rampup.to_pairs()) == rampup
    schedule = BatchSizeSchedule(8, rampup, data_parallel_size=8)
    assert pickle.loads(pickle.dumps(schedule)) == schedule


def test_factor_above_one_still_checks_divisibility() -> None:
    # 12 * 1.5 = 18 rows do not split over 4 data-parallel devices.
    with pytest.raises(DataConfigError) as info:
        BatchSizeSchedule(12, {0: 1.0, 7: 1.5}, data_parallel_size=4, key="batch_rampup_factors")
    message = str(info.value)
    for part in ("batch_rampup_factors", "step 7", "1.5", "= 18", "data-parallel size 4"):
        assert part in message, (part, message)
    assert "1.3333333333333333 (= 16/12)" in message and "1.6666666666666667 (= 20/12)" in message
    # 10 * 2.25 = 22.5 is not a whole number of rows.
    with pytest.raises(DataConfigError) as info:
        BatchSizeSchedule(10, {0: 1.0, 3: 2.25}, data_parallel_size=2)
    message = str(info.value)
    for part in ("data.rampup", "step 3", "2.25", "22.5", "whole number", "(= 22/10)"):
        assert part in message, (part, message)
    # A stage above the base is checked like any other: 4 * 3.0 = 12 rows over dp 8.
    with pytest.raises(DataConfigError, match="step 2 has factor 3.0.*= 12.*host_count 4"):
        BatchSizeSchedule(4, {0: 2.0, 2: 3.0}, data_parallel_size=8, host_count=4)


def test_factor_that_overflows_is_rejected() -> None:
    with pytest.raises(DataConfigError, match="1e\\+308.*overflows"):
        BatchSizeSchedule(8, {0: 1e308}, data_parallel_size=2)
