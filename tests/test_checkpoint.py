"""The data position as an orbax item: round trips, refusals, pruning, crashes."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

import xlstm_data as xd
from tests.helpers import assert_batches_equal
from tests.mp_worker import checkpoint_data_config
from tests.multiprocess import REPO, run_processes, subprocess_env
from trainer_hooks.model import ModelConfig, create_train_state
from xlstm_data.checkpoint import CHECKPOINT_FORMAT_VERSION, state_file_name


@pytest.fixture
def mesh():
    return xd.create_mesh("dp:1,fsdp:-1,tp:1,sp:1")


def build(mesh, config=None):
    train, _ = xd.iterators_from_config(config or checkpoint_data_config(), mesh)
    return train


def save(manager, step, state, iterator):
    manager.save(
        step,
        args=ocp.args.Composite(
            model=ocp.args.StandardSave(state), data=xd.DataCheckpointSave(iterator)
        ),
    )


def restore(manager, step, state, iterator, **restore_kwargs):
    return manager.restore(
        step,
        args=ocp.args.Composite(
            model=ocp.args.StandardRestore(state),
            data=xd.DataCheckpointRestore(iterator, **restore_kwargs),
        ),
    )


def take(iterator, n):
    return [next(iterator) for _ in range(n)]


def saved_at_step_5(tmp_path, mesh, state=None):
    """A checkpoint at step 5 and the 4 batches that follow it."""
    state = {"w": np.arange(4.0)} if state is None else state
    train = build(mesh)
    take(train, 5)
    manager = ocp.CheckpointManager(tmp_path / "ckpt")
    save(manager, 5, state, train)
    # Moving on before the async write lands must not change what was saved.
    following = take(train, 4)
    manager.wait_until_finished()
    train.close()
    return manager, state, following


def refused_restore(manager, step, state, mesh, match):
    """The error restoring `step` into a fresh iterator raises (it must raise)."""
    resumed = build(mesh)
    try:
        with pytest.raises(xd.DataCheckpointError, match=match) as error:
            restore(manager, step, state, resumed)
    finally:
        resumed.close()
    return error.value


def edit_state_file(path, change):
    """Rewrites a data-state file with `change(record)` applied (still valid JSON)."""
    record = json.loads(path.read_text())
    change(record)
    path.write_text(json.dumps(record))


def test_round_trip_with_flax_train_state(tmp_path, mesh):
    config = ModelConfig(vocab_size=258, max_length=32, d_model=16, num_layers=1, num_heads=2)
    state = create_train_state(jax.random.key(0), config, 1e-3, 32)
    manager, _, following = saved_at_step_5(tmp_path, mesh, state)
    fresh_state = create_train_state(jax.random.key(1), config, 1e-3, 32)
    resumed = build(mesh)
    restored = restore(ocp.CheckpointManager(tmp_path / "ckpt"), 5, fresh_state, resumed)
    jax.tree.map(np.testing.assert_array_equal, restored["model"].params, state.params)
    assert restored["data"]["step"] == 5
    assert resumed.step_counter == 5
    for expected, got in zip(following, take(resumed, 4), strict=True):
        assert_batches_equal(expected, got)
    resumed.close()
    manager.close()


def test_header_records_versions_layout_step_and_config(tmp_path, mesh):
    manager, _, _ = saved_at_step_5(tmp_path, mesh)
    record = json.loads((tmp_path / "ckpt" / "5" / "data" / state_file_name(0, 1)).read_text())
    header = record["header"]
    assert header["format_version"] == CHECKPOINT_FORMAT_VERSION
    assert header["grain_version"]
    assert (header["process_index"], header["process_count"], header["step"]) == (0, 1, 5)
    assert header["data_config"]["data.train.a.weight"] == 0.7
    assert len(header["data_config_fingerprint"]) == 16
    assert record["state"]["step"] == 5


def test_changed_data_config_is_refused_with_the_changed_keys(tmp_path, mesh):
    manager, state, _ = saved_at_step_5(tmp_path, mesh)
    config = checkpoint_data_config()
    config["train"]["a"]["weight"] = 0.4
    config["max_target_length"] = 64
    resumed = build(mesh, config)
    with pytest.raises(xd.DataCheckpointError) as error:
        restore(manager, 5, state, resumed)
    message = str(error.value)
    assert "data.train.a.weight: 0.7 -> 0.4" in message
    assert "data.max_target_length: 32 -> 64" in message
    assert "allow_config_change" in message
    # Allowing only the weight still refuses the length change.
    with pytest.raises(xd.DataCheckpointError, match="max_target_length") as error:
        restore(manager, 5, state, resumed, allow_config_change=["data.train.*.weight"])
    assert "data.train.a.weight" not in str(error.value)
    resumed.close()


def test_allowed_weight_change_resumes_with_the_new_mixture(tmp_path, mesh):
    manager, state, _ = saved_at_step_5(tmp_path, mesh)
    config = checkpoint_data_config()
    config["train"]["a"]["weight"] = 0.1
    config["train"]["b"]["weight"] = 0.9
    resumed = build(mesh, config)
    restore(manager, 5, state, resumed, allow_config_change=["data.train.*.weight"])
    assert resumed.step_counter == 5
    before = resumed.data_counters.component_tokens.copy()
    take(resumed, 60)
    assert resumed.component_names == ("a", "b")
    # Weights are token shares: the tokens since the resume follow the new 0.1/0.9.
    since = resumed.data_counters.component_tokens - before
    assert since[1] / since.sum() == pytest.approx(0.9, abs=0.03)
    resumed.close()


def test_adding_an_eval_set_does_not_block_a_resume(tmp_path, mesh):
    manager, state, following = saved_at_step_5(tmp_path, mesh)
    config = checkpoint_data_config()
    config["eval"] = {"held_out": {"kind": "synthetic", "num_documents": 10}}
    config["eval_global_batch_size"] = 4
    config["prefetch"] = 4
    config["read_threads"] = 3  # read with threads now
    resumed = build(mesh, config)
    restore(manager, 5, state, resumed)
    assert_batches_equal(following[0], next(resumed))
    resumed.close()


def test_another_worker_count_resumes_with_identical_batches(tmp_path, mesh):
    """Workers compute whole steps of the plan: the count is outside the fingerprint."""
    manager, state, following = saved_at_step_5(tmp_path, mesh)
    config = checkpoint_data_config()
    config["worker_count"] = 2
    resumed = build(mesh, config)
    try:
        restore(manager, 5, state, resumed)  # not refused as a config change
        for expected, got in zip(following, take(resumed, 4), strict=True):
            assert_batches_equal(expected, got)
    finally:
        resumed.close()


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda text: text[: len(text) // 2], id="truncated"),
        pytest.param(lambda text: "\x00garbage{", id="garbage"),
        pytest.param(lambda text: json.dumps({"header": {}}), id="no-state"),
        pytest.param(lambda text: "", id="empty"),
    ],
)
def test_damaged_state_file_is_named_in_the_error(tmp_path, mesh, damage):
    manager, state, _ = saved_at_step_5(tmp_path, mesh)
    path = tmp_path / "ckpt" / "5" / "data" / state_file_name(0, 1)
    path.write_text(damage(path.read_text()))
    error = refused_restore(manager, 5, state, mesh, "corrupted or truncated")
    assert str(path) in str(error)


def _edit(record, where):
    if where == "cursor":  # one document further in the first dataset's block
        record["state"]["cursor"][2] += 1
    elif where == "state_step":
        record["state"]["step"] += 1
        record["state"]["data_step"] += 1
    elif where == "weight":
        record["state"]["mixture_schedule"][0][1]["a"] = 0.5
    elif where == "header_step":
        record["header"]["step"] = 4


@pytest.mark.parametrize("where", ["cursor", "state_step", "weight", "header_step"])
def test_a_hand_edited_state_file_fails_its_checksum(tmp_path, mesh, where):
    manager, state, _ = saved_at_step_5(tmp_path, mesh)
    path = tmp_path / "ckpt" / "5" / "data" / state_file_name(0, 1)
    edit_state_file(path, lambda record: _edit(record, where))
    error = refused_restore(manager, 5, state, mesh, "fails its checksum")
    assert str(path) in str(error)


def test_steps_that_disagree_are_refused_even_with_a_matching_checksum(tmp_path, mesh):
    from xlstm_data.checkpoint import checksum

    manager, state, _ = saved_at_step_5(tmp_path, mesh)
    path = tmp_path / "ckpt" / "5" / "data" / state_file_name(0, 1)

    def rewrite(record):  # a tool that rewrites the checksum too
        record["header"]["step"] = 4
        record["checksum"] = checksum(record["header"], record["state"])

    edit_state_file(path, rewrite)
    refused_restore(manager, 5, state, mesh, "step 4 in its header but 5 in its state")


def test_a_data_item_moved_to_another_step_is_refused(tmp_path, mesh):
    import shutil

    manager, state, _ = saved_at_step_5(tmp_path, mesh)
    train = build(mesh)
    take(train, 7)
    save(manager, 7, state, train)
    manager.wait_until_finished()
    train.close()
    shutil.rmtree(tmp_path / "ckpt" / "7" / "data")
    shutil.copytree(tmp_path / "ckpt" / "5" / "data", tmp_path / "ckpt" / "7" / "data")
    refused_restore(manager, 7, state, mesh, "saved in checkpoint step 5 but lies in step 7")


def test_unknown_header_version_is_refused(tmp_path, mesh):
    manager, state, _ = saved_at_step_5(tmp_path, mesh)
    path = tmp_path / "ckpt" / "5" / "data" / state_file_name(0, 1)
    edit_state_file(path, lambda record: record["header"].update(format_version=99))
    refused_restore(manager, 5, state, mesh, "format_version=99")


def test_max_to_keep_prunes_model_and_data_together(tmp_path, mesh):
    train = build(mesh)
    options = ocp.CheckpointManagerOptions(max_to_keep=2)
    manager = ocp.CheckpointManager(tmp_path / "ckpt", options=options)
    for step in range(1, 6):
        next(train)
        save(manager, step, {"w": np.full(3, float(step))}, train)
    manager.wait_until_finished()
    steps = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert steps == ["4", "5"]
    for step in steps:
        items = {p.name for p in (tmp_path / "ckpt" / step).iterdir()}
        assert {"model", "data"} <= items
        assert (tmp_path / "ckpt" / step / "data" / state_file_name(0, 1)).exists()
    manager.close()
    train.close()


def test_a_2_process_checkpoint_resumes_on_1_process_with_identical_batches(tmp_path, mesh):
    directory = tmp_path / "two_process_ckpt"
    run_processes("save_checkpoint", 2, tmp_path, {"directory": str(directory), "steps": 3})
    assert sorted(p.name for p in (directory / "3" / "data").glob("*.json")) == [
        state_file_name(0, 2),
        state_file_name(1, 2),
    ]
    # The plan does not depend on the layout: one process computes the same global batches.
    reference = build(mesh)
    take(reference, 3)
    following = take(reference, 4)
    reference.close()
    resumed = build(mesh)
    manager = ocp.CheckpointManager(directory)
    restored = restore(manager, 3, {"w": np.arange(4.0)}, resumed)
    assert restored["data"]["process_count"] == 2 and resumed.step_counter == 3
    for expected, got in zip(following, take(resumed, 4), strict=True):
        assert_batches_equal(expected, got)
    resumed.close()
    # Every saving process's file is needed: without one, the position is refused.
    (directory / "3" / "data" / state_file_name(1, 2)).unlink()
    incomplete = build(mesh)
    with pytest.raises(xd.DataCheckpointError, match=r"processes \[0\] of 2"):
        restore(manager, 3, {"w": np.arange(4.0)}, incomplete)
    assert incomplete.step_counter == 0  # untouched, not silently restarted elsewhere
    incomplete.close()


CRASH_DURING_SAVE = """
import os, signal, sys
import jax
jax.config.update("jax_num_cpu_devices", 4)
import numpy as np, orbax.checkpoint as ocp
sys.path.insert(0, {tests!r})
from tests.mp_worker import checkpoint_data_config
import xlstm_data as xd

mesh = xd.create_mesh("dp:1,fsdp:-1,tp:1,sp:1")
train, _ = xd.iterators_from_config(checkpoint_data_config(), mesh)
manager = ocp.CheckpointManager({directory!r})
big = {{"w": np.random.default_rng(0).normal(size=(2048, 1024))}}
for step in (1, 2):
    next(train)
    manager.save(step, args=ocp.args.Composite(
        model=ocp.args.StandardSave(big), data=xd.DataCheckpointSave(train)))
    if step == 1:
        manager.wait_until_finished()
os.kill(os.getpid(), signal.SIGKILL)  # step 2 is still being written
"""


def test_crash_during_an_async_save_leaves_the_previous_step_restorable(tmp_path, mesh):
    directory = tmp_path / "ckpt"
    script = CRASH_DURING_SAVE.format(tests=str(REPO / "tests"), directory=str(directory))
    env = subprocess_env()
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)], env=env, timeout=120, capture_output=True
    )
    assert result.returncode == -9, result.stderr.decode()[-3000:]
    manager = ocp.CheckpointManager(directory)
    latest = manager.latest_step()
    assert latest in (1, 2)
    if (directory / "2.orbax-checkpoint-tmp").exists():  # the usual case: killed mid-write
        assert manager.all_steps() == [1]
    reference = build(mesh)
    take(reference, latest)
    expected = next(reference)
    resumed = build(mesh)
    restore(manager, latest, {"w": np.zeros((2048, 1024))}, resumed)
    assert_batches_equal(expected, next(resumed))
    resumed.close()
    reference.close()


def test_a_single_pattern_string_allows_only_matching_keys(tmp_path, mesh):
    manager, state, _ = saved_at_step_5(tmp_path, mesh)
    config = checkpoint_data_config()
    config["train"]["a"]["weight"] = 0.4
    config["max_target_length"] = 64
    resumed = build(mesh, config)
    with pytest.raises(xd.DataCheckpointError, match="max_target_length"):
        restore(manager, 5, state, resumed, allow_config_change="data.train.*.weight")
    with pytest.raises(xd.DataConfigError, match="allow_config_change=5 is invalid"):
        xd.DataCheckpointRestore(resumed, allow_config_change=5)
    resumed.close()


def test_reordered_datasets_resume_the_same_stream(tmp_path, mesh):
    # Small blocks, so the saved cursor's positions per dataset are not all 0.
    config = dict(checkpoint_data_config(), block_documents=2)
    train = build(mesh, config)
    take(train, 10)
    assert any(train.get_state()["cursor"][2:])
    manager = ocp.CheckpointManager(tmp_path / "ckpt")
    save(manager, 10, {"w": np.arange(4.0)}, train)
    following = take(train, 4)
    manager.wait_until_finished()
    train.close()
    config["train"] = dict(reversed(list(config["train"].items())))
    resumed = build(mesh, config)
    restore(manager, 10, {"w": np.arange(4.0)}, resumed)
    for expected, got in zip(following, take(resumed, 4), strict=True):
        assert_batches_equal(expected, got)
    resumed.close()


def test_counters_continue_across_a_resume(tmp_path, mesh):
    train = build(mesh)
    take(train, 5)
    saved = train.data_counters.to_state()
    manager = ocp.CheckpointManager(tmp_path / "ckpt")
    save(manager, 5, {"w": np.arange(4.0)}, train)
    manager.wait_until_finished()
    train.close()
    resumed = build(mesh)
    restore(manager, 5, {"w": np.arange(4.0)}, resumed)
    assert resumed.data_counters.to_state() == saved
    assert saved["tokens"] > 0 and set(saved["component_tokens"]) == {"a", "b"}
    resumed.close()


def test_files_newly_matched_by_a_path_glob_are_a_config_change(tmp_path, mesh):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(3):
        (corpus / f"part{i}.txt").write_text("\n".join(f"doc {i}.{j} " * 5 for j in range(40)))
    config = {
        "train": {"text": {"kind": "text", "path": str(corpus / "*.txt")}},
        "global_batch_size": 4,
        "max_target_length": 32,
    }
    train = build(mesh, config)
    take(train, 2)
    manager = ocp.CheckpointManager(tmp_path / "ckpt")
    save(manager, 2, {"w": np.arange(4.0)}, train)
    manager.wait_until_finished()
    train.close()
    (corpus / "part3.txt").write_text("a new document\n")
    resumed = build(mesh, config)
    with pytest.raises(xd.DataCheckpointError, match=r"data\.train\.text\.documents: 120 -> 121"):
        restore(manager, 2, {"w": np.arange(4.0)}, resumed)
    resumed.close()


def test_start_data_fresh_gets_past_a_damaged_data_file(tmp_path, mesh):
    from trainer_hooks import checkpoint_manager, restore_or_initialize, save_args

    directory = tmp_path / "ckpt"
    manager = checkpoint_manager(directory)
    train = build(mesh)
    take(train, 3)
    manager.save(3, args=save_args({"w": np.arange(4.0) + 3}, train))
    manager.wait_until_finished()
    train.close()
    (directory / "3" / "data" / state_file_name(0, 1)).write_text("{trunc")
    fresh = build(mesh)
    with pytest.raises(xd.DataCheckpointError, match="corrupted or truncated"):
        restore_or_initialize(checkpoint_manager(directory), fresh, {"w": np.zeros(4)})
    state, step = restore_or_initialize(
        checkpoint_manager(directory), fresh, {"w": np.zeros(4)}, start_data_fresh=True
    )
    assert step == 3 and np.array_equal(state["w"], np.arange(4.0) + 3)
    assert fresh.step_counter == 0
    fresh.close()


def test_a_refusal_on_one_process_is_raised_on_every_process(tmp_path):
    params = {"directory": str(tmp_path / "ckpt"), "steps": 3}
    first, second = run_processes("refusal_on_one_process", 2, tmp_path, params, timeout=90)
    assert "corrupted or truncated" in second["outcome"]
    assert "process_1-of-2.json" in second["outcome"]
    assert "process(es) [1] failed" in first["outcome"]


def test_any_exception_on_one_process_is_raised_on_every_process(tmp_path):
    params = {"directory": str(tmp_path / "ckpt"), "steps": 3, "failure": "crash"}
    first, second = run_processes("refusal_on_one_process", 2, tmp_path, params, timeout=90)
    assert second["outcome"] == "RuntimeError: simulated: the storage went away"
    assert first["outcome"].startswith("DataCheckpointError: process(es) [1] failed")


def test_allowing_every_change_admits_a_new_dataset(tmp_path, mesh):
    manager, state, _ = saved_at_step_5(tmp_path, mesh)
    config = checkpoint_data_config()
    config["train"]["c"] = {"kind": "synthetic", "num_documents": 50, "seed": 7, "weight": 0.5}
    resumed = build(mesh, config)
    restore(manager, 5, state, resumed, allow_config_change=True)
    take(resumed, 30)
    assert resumed.data_counters.component_tokens[2] > 0  # the new dataset is mixed in
    resumed.close()


def test_a_weight_set_to_zero_is_a_change_that_can_be_allowed(tmp_path, mesh):
    manager, state, _ = saved_at_step_5(tmp_path, mesh)
    config = checkpoint_data_config()
    config["train"]["b"]["weight"] = 0.0
    resumed = build(mesh, config)
    with pytest.raises(xd.DataCheckpointError, match=r"data.train.b.weight: 1.0 -> 0.0"):
        restore(manager, 5, state, resumed)
    # Allowed, the run goes on from step 5 without b (which is not even opened).
    restore(manager, 5, state, resumed, allow_config_change=["data.train.*"])
    assert resumed.step_counter == 5 and resumed.component_names == ("a",)
    assert "b" not in resumed.sources
    before = resumed.data_counters.tokens
    take(resumed, 10)
    assert resumed.data_counters.tokens > before
    resumed.close()


def test_an_eod_id_spelled_out_or_left_to_the_tokenizer_is_the_same_config(tmp_path, mesh):
    config = checkpoint_data_config()
    config["eod_token_id"] = 1  # what the byte tokenizer's convention resolves to
    train = build(mesh, config)
    take(train, 5)
    manager = ocp.CheckpointManager(tmp_path / "ckpt")
    save(manager, 5, {"w": np.arange(4.0)}, train)
    following = take(train, 2)
    manager.wait_until_finished()
    train.close()
    config.pop("eod_token_id")
    resumed = build(mesh, config)
    restore(manager, 5, {"w": np.arange(4.0)}, resumed)  # not refused as a change
    for expected, got in zip(following, take(resumed, 2), strict=True):
        assert_batches_equal(expected, got)
    resumed.close()
    config["eod_token_id"] = 0
    other = build(mesh, config)
    with pytest.raises(xd.DataCheckpointError, match=r"data.eod_token_id: 1 -> 0"):
        restore(manager, 5, {"w": np.arange(4.0)}, other)
    other.close()
