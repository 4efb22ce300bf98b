"""`iterator_length` of epoch-based configs equals the batches actually produced."""

from __future__ import annotations

import pytest

import xlstm_data as xd
from xlstm_data.from_config import iterators_from_config


def _data(packing: bool, drop_remainder: bool, shift_target: bool = True) -> dict:
    return {
        "train": {
            "only": {"kind": "synthetic", "num_documents": 90, "mean_length": 30.0, "seed": 2}
        },
        "eval": {"held_out": {"kind": "synthetic", "num_documents": 41, "seed": 3}},
        "global_batch_size": 16,
        "eval_global_batch_size": 8,
        "max_target_length": 24,
        "packing": packing,
        "packing_bin_count": 8,
        "shift_target": shift_target,
        "num_epochs": 2,
        "drop_remainder": drop_remainder,
        "rampup": [[0, 0.25], [5, 0.5], [9, 1.0]],
    }


@pytest.mark.parametrize("drop_remainder", [True, False])
@pytest.mark.parametrize("shift_target", [True, False])
def test_unpacked_length_is_exact(drop_remainder, shift_target):
    mesh = xd.create_mesh()
    train, evals = iterators_from_config(_data(False, drop_remainder, shift_target), mesh)
    assert train.epoch_length.exact
    expected = train.iterator_length
    train.iterator_length = None  # count what the data really yields
    assert sum(1 for _ in train) == expected
    held_out = evals["held_out"]
    expected_eval = held_out.iterator_length
    held_out.iterator_length = None
    assert held_out.epoch_length.exact and sum(1 for _ in held_out) == expected_eval


def test_packed_length_is_a_marked_lower_bound():
    mesh = xd.create_mesh()
    train, _ = iterators_from_config(_data(True, False), mesh)
    assert not train.epoch_length.exact and train.iterator_length is None
    produced = sum(1 for _ in train)
    assert train.epoch_length.steps <= produced <= 1.3 * train.epoch_length.steps


def test_rampup_above_one_yields_larger_batches_and_an_exact_length():
    """Factors above 1 scale global_batch_size up; the epoch length follows them."""
    data = _data(False, True)
    data["global_batch_size"] = 8
    data["rampup"] = {"0": 0.5, "3": 1.0, "6": 2.0}  # 4, 8, then 16 rows per step
    train, _ = iterators_from_config(data, xd.create_mesh())
    assert [stage.global_batch_size for stage in train.batch_schedule.stages()] == [4, 8, 16]
    assert train.epoch_length.exact
    expected = train.iterator_length
    train.iterator_length = None  # count what the data really yields
    rows = [batch.inputs.shape[0] for batch in train]
    assert len(rows) == expected > 6
    assert rows[:7] == [4, 4, 4, 8, 8, 8, 16] and set(rows[6:]) == {16}
