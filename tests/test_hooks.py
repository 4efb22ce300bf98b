"""The trainer hooks: data metrics, progress line, checkpointing, JSON-lines writer."""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from jax_loop_utils.metric_writers import MemoryWriter

import xlstm_data as xd
from tests.helpers import assert_batches_equal, to_numpy
from tests.multiprocess import run_processes
from trainer_hooks import (
    CheckpointHook,
    DataMetricsHook,
    JsonlWriter,
    ProgressHook,
    checkpoint_manager,
    restore_or_initialize,
)
from trainer_hooks.batch_log import replay_check
from xlstm_data.plan.global_plan import HostPlanner

MESH_AXES = "dp:1,fsdp:-1,tp:1,sp:1"


@pytest.fixture(scope="module")
def mesh():
    return xd.create_mesh(MESH_AXES)


def _synthetic(seed: int, weight: float = 1.0, num_documents: int = 200) -> dict:
    return {
        "kind": "synthetic",
        "num_documents": num_documents,
        "mean_length": 20.0,
        "sigma": 0.8,
        "seed": seed,
        "weight": weight,
    }


def _data_config(train: dict, **overrides) -> dict:
    config = {
        "train": train,
        "global_batch_size": 8,
        "max_target_length": 32,
        "packing": True,
        "rampup": [[0, 0.5], [6, 1.0]],
        "data_shuffle_seed": 3,
    }
    config.update(overrides)
    return config


MIXTURE = _data_config({"web": _synthetic(1, 0.8), "code": _synthetic(2, 0.2)})
SINGLE = _data_config({"books": _synthetic(5)}, rampup=None)


def _tokens_and_slots(batch: dict[str, np.ndarray]) -> tuple[int, int]:
    mask = batch["targets_segmentation"]
    return int(np.count_nonzero(mask)), int(mask.size)


# DataMetricsHook ------------------------------------------------------------


def test_data_metrics_over_a_ramped_mixture(mesh):
    train, _ = xd.iterators_from_config(MIXTURE, mesh)
    writer = MemoryWriter()
    hook = DataMetricsHook(writer, train, every_steps=5)
    num_steps = 20
    batches, triggered, latest = [], [], {}
    for step in range(1, num_steps + 1):
        batches.append(to_numpy(next(train)))
        if hook(step):
            triggered.append(step)
            latest[step] = dict(hook.latest)
    train.close()

    assert triggered == [5, 10, 15, 20]
    assert sorted(writer.scalars) == [5, 10, 15, 20]
    names = ("code", "web")  # the plan's order: by name, not as declared
    expected_keys = {
        "tokens_per_sec",
        "examples_per_sec",
        "padding_fraction",
        "wait_fraction",
        "wait_secs_per_step",
        "tokens_seen",
        "batch_size",
        "mixture_stage",
        "data_step",
        "split_documents",
        "split_fraction",
        *(f"share/{n}" for n in names),
        *(f"planned_share/{n}" for n in names),
    }
    planner = HostPlanner(train.plan, 0, 1)
    for step in triggered:
        assert set(latest[step]) == expected_keys
        # The writer got the same figures, under the prefix.
        assert writer.scalars[step] == {f"data/{k}": v for k, v in latest[step].items()}

    previous = 0  # the baseline is taken when the hook is built, before batch 1
    for step in triggered:
        report = latest[step]
        # Batch `step` is the one handed out at 0-based step `step - 1`.
        assert report["batch_size"] == train.batch_size_at(step - 1)
        assert report["batch_size"] == (4 if step - 1 < 6 else 8)
        assert batches[step - 1]["inputs"].shape[0] == report["batch_size"]

        interval = batches[previous:step]  # batches previous+1 .. step
        tokens = sum(_tokens_and_slots(b)[0] for b in interval)
        slots = sum(_tokens_and_slots(b)[1] for b in interval)
        assert report["padding_fraction"] == pytest.approx(1 - tokens / slots, abs=1e-9)
        assert 0 <= report["padding_fraction"] < 1
        seen = sum(_tokens_and_slots(b)[0] for b in batches[:step])
        assert report["tokens_seen"] == seen
        shares = [report[f"share/{n}"] for n in names]
        assert sum(shares) == pytest.approx(1.0, abs=1e-9)
        assert all(0 <= s <= 1 for s in shares)
        assert report["tokens_per_sec"] > 0
        assert report["examples_per_sec"] > 0
        assert 0 <= report["wait_fraction"] <= 1
        assert report["wait_secs_per_step"] >= 0
        # The plan's stage and shares, and the documents packing split, next to them.
        assert report["mixture_stage"] == 0 and report["data_step"] == step - 1
        assert report["planned_share/web"] == pytest.approx(0.8)
        pieces = [planner.pieces_at(s) for s in range(previous, step)]
        assert report["split_documents"] == sum(int((p.start > 0).sum()) for p in pieces)
        begun = sum(int((p.start == 0).sum()) for p in pieces)
        split = report["split_documents"]
        assert report["split_fraction"] == pytest.approx(split / (begun + split))
        assert 0 <= report["split_fraction"] <= 1
        previous = step

    # Over the whole run: the weights are token shares, so web's share of the
    # tokens is 0.8 up to the documents at the ends of the plan's blocks.
    counters = train.data_counters
    assert counters.component_names == names
    assert counters.tokens == seen
    assert counters.component_tokens.sum() == counters.tokens
    web_share = counters.component_tokens[names.index("web")] / counters.tokens
    assert abs(web_share - 0.8) < 0.05, web_share


def test_data_metrics_shares_match_tagged_components_exactly(mesh):
    """Per-component shares against tokens counted from the batches themselves."""
    components = {}
    weights = {"a": 0.7, "b": 0.3}
    for tag, name in enumerate(weights, start=1):
        lengths = np.random.default_rng(tag).integers(3, 30, size=40)
        docs = [{"tokens": np.full(n, 1000 * tag + i, np.int32)} for i, n in enumerate(lengths)]
        components[name] = xd.make_grain_llm_dataset(
            0, 1, docs, 8, 16, True, tag, grain_packing=True
        )
    train = xd.make_grain_multihost_iterator(
        components, None, mesh, 8, worker_count=0, dataset_weights=weights
    )
    writer = MemoryWriter()
    hook = DataMetricsHook(writer, train, every_steps=4, prefix="")
    expected, interval = {}, np.zeros(2)
    for step in range(1, 13):
        batch = to_numpy(next(train))
        # Rows hold documents of one component, whose tokens carry its tag.
        tags = batch["inputs"].max(axis=1) // 1000
        row_tokens = np.count_nonzero(batch["targets_segmentation"], axis=1)
        assert set(tags[row_tokens > 0]) <= {1, 2}
        interval += [row_tokens[tags == 1].sum(), row_tokens[tags == 2].sum()]
        if hook(step):
            expected[step] = interval / interval.sum()
            interval = np.zeros(2)
    train.close()
    assert sorted(writer.scalars) == [4, 8, 12]
    for step, (share_a, share_b) in expected.items():
        assert writer.scalars[step]["share/a"] == pytest.approx(share_a, abs=1e-12)
        assert writer.scalars[step]["share/b"] == pytest.approx(share_b, abs=1e-12)
        assert 0 < share_b < 1


def test_data_metrics_single_component(mesh):
    train, _ = xd.iterators_from_config(SINGLE, mesh)
    writer = MemoryWriter()
    hook = DataMetricsHook(writer, train, every_steps=2)
    for step in range(1, 5):
        next(train)
        hook(step)
    train.close()
    assert sorted(writer.scalars) == [2, 4]
    shares = {k: v for k, v in hook.latest.items() if k.startswith("share/")}
    assert shares == {"share/books": 1.0}
    assert writer.scalars[4]["data/share/books"] == 1.0
    assert hook.latest["batch_size"] == 8


# ProgressHook ---------------------------------------------------------------


def test_progress_line_every_steps_and_last_step():
    loss = {"loss": 2.5}
    hook = ProgressHook(12, every_steps=5, every_secs=None, metrics=lambda: dict(loss))
    reported = []
    for step in range(1, 13):
        loss["loss"] = 3.0 - step / 10
        if hook(step):
            reported.append((step, hook.line))
    assert [s for s, _ in reported] == [5, 10, 12]
    line_5 = dict(reported)[5]
    assert line_5.startswith("step 5/12 (42%)")
    assert "steps/s" in line_5 and "ETA" in line_5
    assert "loss 2.5" in line_5
    assert "batch" not in line_5 and "data wait" not in line_5
    line_12 = dict(reported)[12]
    assert line_12.startswith("step 12/12 (100%)")
    assert "ETA 0:00" in line_12 and "loss 1.8" in line_12


def test_progress_line_with_an_iterator(mesh):
    train, _ = xd.iterators_from_config(MIXTURE, mesh)
    hook = ProgressHook(
        8, every_steps=4, every_secs=None, iterator=train, metrics=lambda: {"loss": 1.0}
    )
    lines = {}
    for step in range(1, 9):
        next(train)
        if hook(step):
            lines[step] = hook.line
    train.close()
    assert sorted(lines) == [4, 8]
    assert "| batch 4 |" in lines[4]  # the ramp-up's first stage (steps 0-5)
    assert "| batch 8 |" in lines[8]
    for line in lines.values():
        assert "loss 1" in line
        wait = float(line.rsplit("data wait ", 1)[1].rstrip("%"))
        assert wait >= 0


# Checkpointing ------------------------------------------------------------


def _state(step: int) -> dict:
    return {"w": jnp.arange(4.0) + step}


def test_checkpoint_hook_saves_and_restore_continues_exactly(tmp_path, mesh):
    directory = tmp_path / "ckpt"
    manager = checkpoint_manager(directory, max_to_keep=None)
    train, _ = xd.iterators_from_config(MIXTURE, mesh)
    current = {"state": _state(0)}
    hook = CheckpointHook(manager, lambda: current["state"], train, every_steps=3)
    batches = []
    for step in range(1, 11):
        batches.append(to_numpy(next(train)))
        current["state"] = _state(step)
        hook(step)
    hook.finish(10)
    hook.finish(10)  # already saved: nothing to do
    assert list(manager.all_steps()) == [3, 6, 9, 10]
    after_10 = to_numpy(next(train))
    manager.close()
    train.close()

    initial = {"w": jnp.zeros(4)}
    new_manager = checkpoint_manager(directory, max_to_keep=None)
    resumed, _ = xd.iterators_from_config(MIXTURE, mesh)
    state, step = restore_or_initialize(new_manager, resumed, initial)
    assert step == 10
    np.testing.assert_array_equal(np.asarray(state["w"]), np.arange(4.0) + 10)
    assert_batches_equal(next(resumed), after_10)
    resumed.close()

    # An older step: saved asynchronously while the loop went on, it still
    # holds the position and state at that step.
    older, _ = xd.iterators_from_config(MIXTURE, mesh)
    state, step = restore_or_initialize(new_manager, older, initial, step=6)
    assert step == 6
    np.testing.assert_array_equal(np.asarray(state["w"]), np.arange(4.0) + 6)
    for expected in batches[6:8]:
        assert_batches_equal(next(older), expected)
    older.close()
    new_manager.close()


def test_a_garbled_model_chunk_is_refused_naming_the_file_and_the_earlier_step(tmp_path, mesh):
    directory = tmp_path / "ckpt"
    manager = checkpoint_manager(directory, max_to_keep=None)
    train, _ = xd.iterators_from_config(SINGLE, mesh)
    current = {"state": {"w": jnp.arange(50_000.0)}}
    hook = CheckpointHook(manager, lambda: current["state"], train, every_steps=2)
    for step in range(1, 5):
        next(train)
        current["state"] = {"w": jnp.arange(50_000.0) + step}
        hook(step)
    hook.finish(4)
    manager.close()
    train.close()
    for step in (2, 4):  # every committed step has its digests, the asynchronous one too
        assert (directory / str(step) / "model.sha256.json").exists()
    chunk = max(
        (directory / "4" / "model").glob("ocdbt.process_*/d/*"), key=lambda p: p.stat().st_size
    )
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 64] = bytes(64)  # zeros where the values were
    chunk.write_bytes(bytes(data))

    manager = checkpoint_manager(directory, max_to_keep=None)
    resumed, _ = xd.iterators_from_config(SINGLE, mesh)
    initial = {"w": jnp.zeros(50_000)}
    with pytest.raises(xd.DataCheckpointError) as refused:
        restore_or_initialize(manager, resumed, initial)
    message = str(refused.value)
    assert "step 4 is damaged" in message and str(chunk) in message, message
    assert "--restore_step=2" in message, message
    state, step = restore_or_initialize(manager, resumed, initial, step=2)
    assert step == 2
    np.testing.assert_array_equal(np.asarray(state["w"]), np.arange(50_000.0) + 2)
    resumed.close()
    manager.close()


def test_restore_from_an_empty_directory_starts_fresh(tmp_path, mesh):
    manager = checkpoint_manager(tmp_path / "empty")
    train, _ = xd.iterators_from_config(SINGLE, mesh)
    initial = {"w": jnp.arange(4.0)}
    state, step = restore_or_initialize(manager, train, initial)
    assert step == 0 and state is initial
    fresh, _ = xd.iterators_from_config(SINGLE, mesh)
    assert_batches_equal(next(train), next(fresh))
    fresh.close()
    train.close()
    manager.close()


def test_model_only_checkpoint_is_refused_unless_data_starts_fresh(tmp_path, mesh):
    manager = checkpoint_manager(tmp_path / "model_only", async_save=False)
    saved = _state(7)
    manager.save(7, args=ocp.args.Composite(model=ocp.args.StandardSave(saved)))
    manager.wait_until_finished()
    initial = {"w": jnp.zeros(4)}

    train, _ = xd.iterators_from_config(SINGLE, mesh)
    with pytest.raises(xd.DataCheckpointError, match="start_data_fresh"):
        restore_or_initialize(manager, train, initial)

    state, step = restore_or_initialize(manager, train, initial, start_data_fresh=True)
    assert step == 7
    np.testing.assert_array_equal(np.asarray(state["w"]), np.asarray(saved["w"]))
    fresh, _ = xd.iterators_from_config(SINGLE, mesh)
    for _ in range(2):
        assert_batches_equal(next(train), next(fresh))
    fresh.close()
    train.close()
    manager.close()


# JsonlWriter ----------------------------------------------------------------


def test_jsonl_writer_lines_read_back(tmp_path):
    path = tmp_path / "logs" / "metrics.jsonl"
    writer = JsonlWriter(path)
    writer.write_scalars(
        3, {"np": np.float32(0.5), "np_int": np.int64(7), "jax": jnp.asarray(1.25), "py": 2}
    )
    writer.write_texts(4, {"note": "hello"})
    writer.write_hparams({"lr": np.float64(0.001), "layers": 2, "name": "tiny"})
    writer.write_images(5, {"ignored": np.zeros((1, 2, 2, 3))})
    writer.flush()
    writer.close()

    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(records) == 3
    for record in records:
        assert isinstance(record.pop("time"), float)
    assert records[0] == {"step": 3, "np": 0.5, "np_int": 7, "jax": 1.25, "py": 2}
    assert records[1] == {"step": 4, "note": "hello"}
    assert records[2] == {"step": 0, "hparams": {"lr": 0.001, "layers": 2, "name": "tiny"}}

    # Appends on reopen instead of truncating.
    again = JsonlWriter(path)
    again.write_scalars(6, {"x": np.array([1, 2])})
    again.close()
    lines = path.read_text().splitlines()
    assert len(lines) == 4 and json.loads(lines[-1])["x"] == [1, 2]


def test_a_resumed_runs_first_step_can_trigger(tmp_path, mesh):
    """Hooks count from `start_step`, so the first step after a resume is not skipped."""
    progress = ProgressHook(12, every_steps=5, every_secs=None, start_step=11)
    assert progress(12) and progress.line.startswith("step 12/12")
    train, _ = xd.iterators_from_config(MIXTURE, mesh)
    manager = checkpoint_manager(tmp_path / "ckpt", max_to_keep=None)
    hook = CheckpointHook(manager, lambda: _state(10), train, every_steps=10, start_step=9)
    next(train)
    assert hook(10)
    manager.wait_until_finished()
    assert manager.all_steps() == [10]
    metrics = DataMetricsHook(MemoryWriter(), train, every_steps=1, start_step=10)
    next(train)
    assert metrics(11) and metrics.latest["tokens_seen"] > 0
    train.close()
    manager.close()


def test_hooks_agree_across_processes(tmp_path):
    """2 real processes: saves follow process 0's clock; data totals cover both hosts."""
    results = run_processes("hooks", 2, tmp_path, {"directory": str(tmp_path / "ckpt")})
    for result in results:
        # The clock is agreed on every 2nd step, and process 0's says "due".
        assert result["saved"] == [False, True] * 3
        assert result["steps"] == [2, 4, 6]
        # Counted over both data hosts, equal to the global batches' tokens.
        assert result["tokens_seen"] == result["global_tokens"]
        assert sum(result["shares"]) == pytest.approx(1.0)
    assert results[0]["tokens_seen"] == results[1]["tokens_seen"]


def test_replay_check_finds_mismatched_replayed_steps():
    log = [{"step": s, "fingerprint": f"f{s}", "batch_size": 4, "loss": 1.0} for s in (1, 2, 3)]
    resumed = [{"step": s, "fingerprint": f"f{s}", "batch_size": 4, "loss": 1.0} for s in (3, 4)]
    assert replay_check(log + resumed) == {
        "resumes": [2],
        "replayed": 1,
        "mismatched": [],
        "loss_drift": 0.0,
    }
    # Resumed on another device count: the same batch, a loss 5e-7 apart.
    resumed[0]["loss"] = 1.0 + 5e-7
    assert replay_check(log + resumed)["mismatched"] == []
    assert replay_check(log + resumed)["loss_drift"] == pytest.approx(5e-7, rel=1e-3)
    resumed[0]["loss"] = 1.01  # a model that diverged
    assert replay_check(log + resumed)["mismatched"] == [3]
    resumed[0]["loss"] = 1.0
    resumed[0]["fingerprint"] = "other"
    assert replay_check(log + resumed)["mismatched"] == [3]


def test_train_config_typos_are_rejected_with_their_key():
    from tests.test_config import load_config
    from trainer_hooks.config import check_train_keys

    config = load_config("demo")
    check_train_keys(config)
    config.checkpoint.every_step = 10
    with pytest.raises(xd.DataConfigError, match=r"checkpoint\.every_step is unknown.*every_steps"):
        check_train_keys(config)


def test_a_typed_prng_key_and_replicated_arrays_survive_a_save_on_cpu_devices(tmp_path):
    """The reference loop saves replicated arrays whole on CPU (no replica slices).

    The handler it registers keeps orbax's array-metadata store, where a
    typed key's implementation is recorded: without it the key came back as
    raw uint32 words.
    """
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from trainer_hooks.checkpointing import MODEL_ITEM, checkpoint_manager

    manager = checkpoint_manager(tmp_path / "checkpoints", async_save=False)
    handler = ocp.type_handlers.get_type_handler(jax.Array)
    assert handler._use_replica_parallel is False  # noqa: SLF001
    mesh = Mesh(np.array(jax.devices()[:2]), ("data",))
    replicated = NamedSharding(mesh, PartitionSpec())
    state = {
        "key": jax.random.key(7),
        "w": jax.device_put(jnp.arange(12.0).reshape(3, 4), replicated),
    }
    manager.save(1, args=ocp.args.Composite(**{MODEL_ITEM: ocp.args.StandardSave(state)}))
    manager.wait_until_finished()
    restored = manager.restore(
        1, args=ocp.args.Composite(**{MODEL_ITEM: ocp.args.StandardRestore(state)})
    )[MODEL_ITEM]
    manager.close()
    assert jax.dtypes.issubdtype(restored["key"].dtype, jax.dtypes.prng_key)
    assert np.array_equal(jax.random.key_data(restored["key"]), jax.random.key_data(state["key"]))
    assert np.array_equal(np.asarray(restored["w"]), np.arange(12.0).reshape(3, 4))
    assert restored["w"].sharding.is_equivalent_to(replicated, 2)
