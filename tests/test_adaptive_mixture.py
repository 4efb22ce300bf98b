"""The adaptive mixture of the reference loop: its rule, its keys, and exact resumes.

`AdaptiveMixtureHook` moves the weights by exponentiated gradient on each
dataset's loss (DoReMi's rule). Its updates go through `set_mixture`, so they
are in the data state, and what it sums between updates is saved in the same
orbax step: a run killed between two updates and resumed must log the same
batches and losses as the uninterrupted run, on one process and on another
process count.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import xlstm_data as xd
from tests.test_train_resume import launch, records, wait_all
from trainer_hooks.adaptive_mixture import AdaptiveMixtureHook, check_adaptive_mixture

#: Every 3 steps; "long" is far above its reference and "short" below its
#: own, so the weights move a long way towards "long" at the first update.
ADAPTIVE = (
    "--config.adaptive_mixture.every_steps=3",
    "--config.adaptive_mixture.smoothing=0.2",
    "--config.adaptive_mixture.reference_loss={'long': 0.0, 'short': 100.0}",
    "--config.num_train_steps=16",
    "--config.checkpoint.every_steps=4",
)


class _Iterator:
    """What the rule needs of an iterator (no data is read)."""

    source_names = ("a", "b", "c")
    global_mesh = xd.create_mesh()


def _hook(**kwargs):
    return AdaptiveMixtureHook(_Iterator(), every_steps=10, **kwargs)


def test_the_dataset_with_more_excess_loss_gains_weight():
    hook = _hook(step_size=1.0, smoothing=0.0)
    prior = np.array([0.5, 0.3, 0.2])
    new = hook.next_weights(np.array([3.0, 2.0, 2.0]), prior, prior)
    assert new[0] > prior[0] and new[1] < prior[1] and new[2] < prior[2]
    assert math.isclose(new.sum(), 1.0, abs_tol=1e-5)
    # exactly w_i * exp(excess_i), normalised
    expected = prior * np.exp([3.0, 2.0, 2.0])
    np.testing.assert_allclose(new, expected / expected.sum(), atol=1e-6)


def test_the_reference_loss_is_subtracted_and_excess_is_never_negative():
    hook = _hook(step_size=1.0, smoothing=0.0, reference_loss={"a": 3.0, "b": 1.0})
    w = np.array([1 / 3] * 3)
    new = hook.next_weights(np.array([2.0, 2.0, 0.5]), w, w)
    # excess: a 0 (below its reference), b 1.0, c 0.5
    expected = w * np.exp([0.0, 1.0, 0.5])
    np.testing.assert_allclose(new, expected / expected.sum(), atol=1e-6)


def test_smoothing_pulls_towards_the_configured_weights_and_off_stays_off():
    hook = _hook(step_size=5.0, smoothing=0.25)
    prior = np.array([0.6, 0.4, 0.0])
    new = hook.next_weights(np.array([9.0, 1.0, 50.0]), prior, prior)
    assert new[2] == 0.0  # weight 0 in force and in the config: never revived
    assert new[1] >= 0.25 * 0.4 - 1e-6
    # A dataset without tokens in the interval (NaN) has no excess.
    new = hook.next_weights(np.array([1.0, math.nan, 1.0]), np.array([0.5, 0.5, 0.0]), prior)
    assert np.all(np.isfinite(new)) and math.isclose(new.sum(), 1.0, abs_tol=1e-5)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((0, 1.0, 0.1, None), "adaptive_mixture.every_steps=0 must be an int >= 1"),
        ((10, 0.0, 0.1, None), "adaptive_mixture.step_size=0.0 is invalid"),
        ((10, math.nan, 0.1, None), "adaptive_mixture.step_size=nan is invalid"),
        ((10, 1.0, 1.0, None), "adaptive_mixture.smoothing=1.0 is invalid"),
        ((10, 1.0, -0.1, None), "adaptive_mixture.smoothing=-0.1 is invalid"),
        ((10, 1.0, 0.1, {"web": 1.0}), "reference_loss names unknown datasets ['web']"),
        ((10, 1.0, 0.1, {"a": "low"}), "adaptive_mixture.reference_loss['a']='low' is invalid"),
        ((10, 1.0, 0.1, [1.0]), "adaptive_mixture.reference_loss=[1.0] must be a dict"),
    ],
)
def test_bad_keys_are_refused_by_name(args, message):
    with pytest.raises(xd.DataConfigError) as error:
        check_adaptive_mixture(*args, ("a", "b"))
    assert message in str(error.value)


def test_one_dataset_cannot_adapt():
    with pytest.raises(xd.DataConfigError, match=r"declare two or more, or set it to 0"):
        check_adaptive_mixture(5, 1.0, 0.1, None, ("only",))


def test_a_bad_key_in_a_training_run_is_one_error_line(tmp_path):
    workdir = tmp_path / "bad"
    workdir.mkdir()
    out = wait_all(
        launch(workdir, 1, "--config.adaptive_mixture.every_steps=3", *_smoothing(1.5)),
        expect=1,
    )
    assert "error: adaptive_mixture.smoothing=1.5 is invalid; expected a number in [0, 1)" in out
    assert "Traceback" not in out and not (workdir / "checkpoints").exists()


def _smoothing(value):
    return (f"--config.adaptive_mixture.smoothing={value}",)


def _planned_shares(workdir):
    lines = (workdir / "metrics.jsonl").read_text().splitlines()
    return [
        (m["step"], m["data/planned_share/long"], m.get("data/loss/long"))
        for m in map(json.loads, lines)
        if "data/planned_share/long" in m
    ]


@pytest.fixture(scope="module")
def adaptive_reference(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("adaptive") / "reference"
    workdir.mkdir()
    wait_all(launch(workdir, 1, *ADAPTIVE))
    return workdir


def test_the_weights_move_and_the_loss_per_dataset_is_logged(adaptive_reference):
    shares = _planned_shares(adaptive_reference)
    # Reported at steps 5, 10, 15, where the config asks 0.2 of long: the updates
    # (every 3 steps, long far above its reference) keep it near 0.8 + 0.2 * 0.2.
    assert [step for step, _, _ in shares] == [5, 10, 15]
    assert all(share > 0.8 for _, share, _ in shares), shares
    assert all(loss is not None and loss > 0 for _, _, loss in shares)


@pytest.mark.parametrize("processes", [1, 2])
def test_a_run_killed_between_updates_resumes_exactly(tmp_path, adaptive_reference, processes):
    # Pre-empted after step 10: the checkpoint at 8 is between the updates at 6 and 9,
    # so the rerun needs the saved sums of steps 7-8 to update at 9 as the reference did.
    workdir = tmp_path / "killed"
    workdir.mkdir()
    wait_all(
        launch(workdir, processes, *ADAPTIVE, "--simulate_preemption_at_step=10"),
        expect=-9,
    )
    wait_all(launch(workdir, processes, *ADAPTIVE))
    expected = {r["step"]: r for r in records(adaptive_reference)}
    got = {r["step"]: r for r in records(workdir)}
    assert sorted(got) == list(range(1, 17))
    for step in range(9, 17):
        assert got[step]["fingerprint"] == expected[step]["fingerprint"], step
        if processes == 1:  # another device count reduces the loss in another order
            assert got[step]["loss"] == expected[step]["loss"], step
    # The weights themselves, to the last digit kept (the batches hide small changes).
    assert _updates(workdir, processes) == _updates(adaptive_reference, 1)


def _updates(workdir, processes):
    path = workdir / "checkpoints" / "16" / "data" / f"process_0-of-{processes}.json"
    return json.loads(path.read_text())["state"]["mixture_updates"]
