"""Data control on the plan: skipped steps, mixture changes on resume, runs bound to data.

In this process (4 CPU devices, conftest); the same on other process counts is
checked by the training-run tests (tests/test_train_resume.py).
"""

from __future__ import annotations

import os

import numpy as np
import orbax.checkpoint as ocp
import pytest

import xlstm_data as xd
from tests.test_checkpoint import restore, save
from xlstm_data.errors import DataCheckpointError, DataConfigError
from xlstm_data.plan.skips import StepSkips, parse_skip_steps

DATA = {
    "train": {
        "a": {"kind": "synthetic", "num_documents": 300, "mean_length": 80},
        "b": {"kind": "synthetic", "num_documents": 200, "mean_length": 20, "seed": 1},
    },
    "global_batch_size": 8,
    "max_target_length": 64,
    "rampup": [[0, 0.5], [14, 1]],
    "mixture_schedule": [[0, {"a": 1, "b": 1}], [4, {"a": 1, "b": 3}]],
    "block_documents": 64,
}
STATE = {"w": np.arange(4.0)}


def _host(batch) -> dict[str, np.ndarray]:
    return {k: np.asarray(v) for k, v in batch.to_dict().items()}


def _take(iterator, steps: int) -> list[dict[str, np.ndarray]]:
    return [_host(next(iterator)) for _ in range(steps)]


def _same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def _build(config):
    train, _ = xd.iterators_from_config(config, xd.create_mesh())
    return train


def _checkpoint_after(tmp_path, config, steps: int) -> ocp.CheckpointManager:
    """A checkpoint of `config`'s run at step `steps`."""
    train = _build(config)
    _take(train, steps)
    manager = ocp.CheckpointManager(tmp_path / "ckpt")
    save(manager, steps, STATE, train)
    manager.wait_until_finished()
    train.close()
    return manager


@pytest.fixture(scope="module")
def reference():
    train = _build(DATA)
    try:
        return _take(train, 34)
    finally:
        train.close()


def test_the_data_step_map_of_skip_ranges():
    # Ranges are data steps: training steps walk the data steps and jump over them.
    skips = parse_skip_steps([[10, 20], [30, 35]])
    steps = (0, 9, 10, 19, 20, 29, 30)
    assert [skips.data_step(t) for t in steps] == [0, 9, 20, 29, 35, 44, 45]
    assert skips.ranges == ((10, 20), (30, 35))
    # A finite run of 50 data steps has 35 training steps (15 skipped).
    assert skips.train_steps_before(50) == 35
    assert StepSkips().data_step(7) == 7
    # A second spike inside the data a first range jumped to is a range after it.
    assert parse_skip_steps([[10, 20], [25, 27]]).data_step(15) == 27


@pytest.mark.parametrize(
    "value, words",
    [
        ([[10, 20], [15, 30]], ["[10, 20) and [15, 30) are overlapping", "data.skip_steps"]),
        ([[30, 40], [10, 20]], ["unsorted", "data.skip_steps"]),
        ([[20, 10]], ["0 <= start < end", "[20, 10]"]),
        ([[5]], ["[5]", "[start, end]"]),
        ("10:20", ["data.skip_steps='10:20'", "list of [start, end]"]),
    ],
)
def test_bad_skip_ranges_are_refused_naming_the_key_and_the_value(value, words):
    with pytest.raises(DataConfigError) as error:
        xd.iterators_from_config({**DATA, "skip_steps": value}, xd.create_mesh())
    for word in words:
        assert word in str(error.value)


def test_a_skipped_range_gives_its_first_step_the_data_of_its_end(reference):
    train = _build({**DATA, "skip_steps": [[10, 20]]})
    try:
        batches = _take(train, 14)
        assert train.data_step_at(10) == 20
        # Ramp-up stages are data steps: step 10 has the full batch of data step 20.
        assert train.batch_size_at(10) == 8 and train.batch_size_at(9) == 4
        state = train.get_state()
    finally:
        train.close()
    for step in range(10):
        assert _same(batches[step], reference[step]), step
    for step in range(10, 14):
        assert _same(batches[step], reference[step + 10]), step
    assert state["step"] == 14 and state["data_step"] == 24


def test_a_skip_range_added_on_resume_continues_at_its_end(tmp_path, reference):
    manager = _checkpoint_after(tmp_path, DATA, 12)

    resumed = _build({**DATA, "skip_steps": [[12, 30]]})
    try:
        restore(manager, 12, STATE, resumed)  # no allow flag: only future steps change
        batches = _take(resumed, 4)
    finally:
        resumed.close()
    for offset, batch in enumerate(batches):
        assert _same(batch, reference[30 + offset]), offset

    early = _build({**DATA, "skip_steps": [[8, 10]]})
    try:
        with pytest.raises(DataCheckpointError) as error:
            restore(manager, 12, STATE, early)
    finally:
        early.close()
    message = str(error.value)
    assert "data.skip_steps=[[8, 10]]" in message and "data step 12" in message


def _with_stage_at(step: int) -> dict:
    stages = [[0, {"a": 1, "b": 1}], [4, {"a": 1, "b": 3}], [step, {"a": 0, "b": 1}]]
    return {**DATA, "mixture_schedule": stages}


def test_a_future_mixture_stage_added_on_resume_equals_a_run_that_had_it(tmp_path, reference):
    """Stages are causal: one added at any step from the checkpoint's on resumes exactly."""
    manager = _checkpoint_after(tmp_path, DATA, 7)
    for stage_at in (7, 9):
        planned = _build(_with_stage_at(stage_at))
        try:
            expected = _take(planned, stage_at + 4)
        finally:
            planned.close()
        # Up to the stage, that run trained exactly what the one without it did.
        for step in range(stage_at):
            assert _same(expected[step], reference[step]), (stage_at, step)
        resumed = _build(_with_stage_at(stage_at))
        try:
            restore(manager, 7, STATE, resumed)  # no allow flag: only untrained steps change
            batches = _take(resumed, stage_at + 4 - 7)
        finally:
            resumed.close()
        for offset, batch in enumerate(batches):
            assert _same(batch, expected[7 + offset]), (stage_at, 7 + offset)
        assert not _same(batches[-1], reference[stage_at + 3])  # the new stage is in effect


def test_a_change_to_a_trained_stage_is_refused_naming_its_step(tmp_path):
    manager = _checkpoint_after(tmp_path, DATA, 7)
    moved = {**DATA, "mixture_schedule": [[0, {"a": 1, "b": 1}], [5, {"a": 1, "b": 3}]]}
    refused = _build(moved)
    try:
        with pytest.raises(DataCheckpointError) as error:
            restore(manager, 7, STATE, refused)
        restore(manager, 7, STATE, refused, allow_config_change="data.mixture_schedule")
    finally:
        refused.close()
    assert "data.mixture_schedule" in str(error.value)
    assert "change at step 4, before the checkpoint's data step 7" in str(error.value)
    assert "--allow_data_config_change=data.mixture_schedule" in str(error.value)


def _text_corpus(directory) -> dict:
    directory.mkdir()
    for part in range(3):
        lines = [f"document {part}-{i} " + "words " * (i % 7 + 1) for i in range(40)]
        (directory / f"part-{part}.txt").write_text("\n".join(lines) + "\n")
    return {
        **DATA,
        "train": {"text": {"kind": "text", "path": str(directory / "part-*.txt")}},
        "mixture_schedule": None,
    }


def test_a_resume_on_changed_files_is_refused_naming_each_file(tmp_path):
    config = _text_corpus(tmp_path / "corpus")
    manager = _checkpoint_after(tmp_path, config, 3)
    record = (tmp_path / "ckpt" / "3" / "data" / "process_0-of-1.json").read_text()
    assert "lengths_sha256" in record and "part-2.txt" in record

    changed = tmp_path / "corpus" / "part-1.txt"
    changed.write_text(changed.read_text() + "one more document\n")
    touched = tmp_path / "corpus" / "part-2.txt"
    stat = os.stat(touched)
    os.utime(touched, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    resumed = _build(config)
    try:
        with pytest.raises(DataCheckpointError) as error:
            restore(manager, 3, STATE, resumed)
        restore(manager, 3, STATE, resumed, allow_config_change="data.train.text")
        next(resumed)
    finally:
        resumed.close()
    message = str(error.value)
    assert f"{changed} (data.train.text) changed: size" in message
    assert f"{touched} (data.train.text) changed: modified since" in message
    assert "part-0.txt" not in message
    assert "data.train.text.lengths_sha256" in message
