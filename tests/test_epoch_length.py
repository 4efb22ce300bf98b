"""`iterator_length` of epoch-based configs equals the batches actually produced.

On the plan the count is exact with every packing mode (the plan packs on
document lengths alone), for train and eval alike.
"""

from __future__ import annotations

import numpy as np
import pytest

import xlstm_data as xd
from xlstm_data.from_config import iterators_from_config

PACKING_MODES = ["none", "best_fit", "first_fit", "concat"]


def _data(packing: str | bool, drop_remainder: bool, shift_target: bool = True) -> dict:
    return {
        "train": {
            "only": {"kind": "synthetic", "num_documents": 90, "mean_length": 30.0, "seed": 2}
        },
        "eval": {"held_out": {"kind": "synthetic", "num_documents": 41, "seed": 3}},
        "global_batch_size": 16,
        "eval_global_batch_size": 8,
        "max_target_length": 24,
        "packing": packing,
        "shift_target": shift_target,
        "num_epochs": 2,
        "drop_remainder": drop_remainder,
        "rampup": [[0, 0.25], [5, 0.5], [9, 1.0]],
    }


def _example_positions(source, shift_target: bool) -> int:
    """Input positions of one pass over a source (shift=True)."""
    lengths = np.asarray(source.lengths(), dtype=np.int64)
    return int(lengths.sum()) + (0 if shift_target else len(lengths))


def _tokens_per_row(batch) -> np.ndarray:
    return np.count_nonzero(np.asarray(batch.targets_segmentation), axis=1)


@pytest.mark.parametrize("packing", PACKING_MODES)
@pytest.mark.parametrize("drop_remainder", [True, False])
@pytest.mark.parametrize("shift_target", [True, False])
def test_length_is_exact_with_every_packing_mode(packing, drop_remainder, shift_target):
    mesh = xd.create_mesh()
    train, evals = iterators_from_config(_data(packing, drop_remainder, shift_target), mesh)
    held_out = evals["held_out"]
    try:
        assert train.epoch_length.exact
        expected = train.iterator_length
        assert expected == train.epoch_length.steps > 9  # past the last ramp-up stage
        rows = [_tokens_per_row(batch) for batch in train]
        assert len(rows) == expected
        epoch_positions = _example_positions(train.sources["only"], shift_target)
        yielded = sum(int(r.sum()) for r in rows)
        if drop_remainder:
            # Only full batches: not a single row past the data's end.
            assert all((r > 0).all() for r in rows)
            assert yielded <= 2 * epoch_positions
        else:
            # Every position of both epochs, and no batch beyond the last one holding data.
            assert yielded == 2 * epoch_positions
            assert rows[-1].sum() > 0
        assert held_out.epoch_length.exact
        eval_rows = [_tokens_per_row(batch) for batch in held_out]
        assert len(eval_rows) == held_out.iterator_length == held_out.epoch_length.steps
        assert sum(int(r.sum()) for r in eval_rows) == _example_positions(
            held_out.sources["held_out"], shift_target
        )
        assert eval_rows[-1].sum() > 0
    finally:
        train.close()
        held_out.close()


def test_packing_aliases():
    """True/False are best_fit/none: the same plan, the same exact length."""
    mesh = xd.create_mesh()
    for alias, mode in ((True, "best_fit"), (False, "none")):
        a, _ = iterators_from_config(_data(alias, False), mesh)
        b, _ = iterators_from_config(_data(mode, False), mesh)
        try:
            assert a.plan.spec.packing == mode
            assert a.iterator_length == b.iterator_length
        finally:
            a.close()
            b.close()


def test_packing_fills_rows_and_shortens_the_epoch():
    mesh = xd.create_mesh()
    lengths = {}
    for mode in PACKING_MODES:
        train, _ = iterators_from_config(_data(mode, False), mesh)
        try:
            lengths[mode] = train.iterator_length
        finally:
            train.close()
    # Documents average 30 tokens in rows of 24: unpacked rows are about half empty.
    assert lengths["concat"] <= lengths["best_fit"] <= lengths["first_fit"] < lengths["none"]


def test_rampup_above_one_yields_larger_batches_and_an_exact_length():
    """Factors above 1 scale global_batch_size up; the epoch length follows them."""
    data = _data("none", True)
    data["global_batch_size"] = 8
    data["rampup"] = {"0": 0.5, "3": 1.0, "6": 2.0}  # 4, 8, then 16 rows per step
    train, evals = iterators_from_config(data, xd.create_mesh())
    try:
        assert [stage.global_batch_size for stage in train.batch_schedule.stages()] == [4, 8, 16]
        assert train.epoch_length.exact
        expected = train.iterator_length
        rows = [batch.inputs.shape[0] for batch in train]
        assert len(rows) == expected > 6
        assert rows[:7] == [4, 4, 4, 8, 8, 8, 16] and set(rows[6:]) == {16}
    finally:
        train.close()
        evals["held_out"].close()
