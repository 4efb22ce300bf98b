"""Train and eval iterators built from a config: mixtures, ramp-up, eval padding."""

from __future__ import annotations

import collections
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xlstm_data as xd
from tests.helpers import assert_batches_equal, to_numpy
from tests.test_config import small_config
from xlstm_data.errors import DataConfigError
from xlstm_data.from_config import iterators_from_config


@pytest.fixture(scope="module")
def mesh():
    return xd.create_mesh()


def _tagged_mixture(weights: dict[str, float], steps: int, mesh) -> collections.Counter:
    """Counts rows per component; each component's tokens carry its id."""
    components = {}
    for tag, name in enumerate(weights, start=1):
        docs = [{"tokens": np.full(6, 1000 * tag + i, np.int32)} for i in range(11 + tag)]
        components[name] = xd.make_grain_llm_dataset(0, 1, docs, 8, 8, True, tag)
    iterator = xd.make_grain_multihost_iterator(
        components, None, mesh, 8, worker_count=0, dataset_weights=weights
    )
    counts = collections.Counter()
    names = list(weights)
    for _ in range(steps):
        first_tokens = np.asarray(next(iterator).inputs)[:, 0]
        counts.update(names[t // 1000 - 1] for t in first_tokens)
    iterator.close()
    return counts


def test_mixture_shares_match_weights(mesh):
    weights = {"big": 0.9, "mid": 0.09, "rare": 0.01}
    counts = _tagged_mixture(weights, 500, mesh)
    total = sum(counts.values())
    for name, weight in weights.items():
        # grain's mix is a deterministic interleave: shares are exact up to rounding.
        assert abs(counts[name] / total - weight) < 0.005, (name, counts)


def test_zero_weight_drops_a_component(mesh):
    counts = _tagged_mixture({"a": 1.0, "b": 0.0, "c": 3.0}, 50, mesh)
    assert counts["b"] == 0 and counts["c"] == 3 * counts["a"]


def _first_batches(config, mesh, n=6):
    train, _ = iterators_from_config(config.data, mesh)
    batches = [to_numpy(next(train)) for _ in range(n)]
    train.close()
    return batches


def test_same_seed_same_batches_other_seed_different(mesh):
    a = _first_batches(small_config(), mesh)
    b = _first_batches(small_config(), mesh)
    for x, y in zip(a, b, strict=True):
        assert_batches_equal(x, y)
    other = small_config()
    other.data.data_shuffle_seed = 1234
    c = _first_batches(other, mesh)
    assert any(not np.array_equal(x["inputs"], z["inputs"]) for x, z in zip(a, c, strict=True))


def test_rampup_batch_size_at_every_step_and_restore_in_and_across_stages(mesh):
    config = small_config()
    config.data.rampup = [[0, 0.5], [3, 0.75], [6, 1.0]]
    config.data.global_batch_size = 16  # stages of 8, 12 and 16 rows over 4 devices
    train, _ = iterators_from_config(config.data, mesh)
    expected_sizes = [8, 8, 8, 12, 12, 12, 16, 16, 16, 16]
    states, batches = [], []
    for step, size in enumerate(expected_sizes):
        states.append(train.get_state())
        batch = next(train)
        assert batch.inputs.shape == (size, 32)
        assert train.batch_size_at(step) == size
        assert train.examples_seen() == sum(expected_sizes[: step + 1])
        batches.append(to_numpy(batch))
    train.close()
    fresh, _ = iterators_from_config(config.data, mesh)
    # Inside each stage (1, 4, 7) and at each boundary (3, 6).
    for step in (1, 3, 4, 6, 7):
        fresh.set_state(states[step])
        for later in range(step, len(expected_sizes)):
            assert_batches_equal(next(fresh), batches[later])
    fresh.close()


def _masked_mean(values_fn):
    @jax.jit
    def sums(batch):
        mask = batch.targets_segmentation != 0
        return jnp.sum(jnp.where(mask, values_fn(batch.targets), 0.0)), jnp.sum(mask)

    return sums


def test_eval_pads_last_batch_and_masked_loss_is_exact(mesh):
    config = small_config()
    config.data.eval = {"held_out": {"kind": "synthetic", "num_documents": 37, "seed": 4}}
    config.data.eval_global_batch_size = 8
    config.data.packing = False
    _, evals = iterators_from_config(config.data, mesh)
    iterator = evals["held_out"]
    # A per-token "loss" that depends on the target token only.
    loss = lambda t: jnp.sin(t.astype(jnp.float32)) + 2.0  # noqa: E731
    sums = _masked_mean(loss)
    total, count, shapes, padding_rows = 0.0, 0, set(), 0
    for batch in iterator:
        s, n = sums(batch)
        total, count = total + float(s), count + int(n)
        shapes.add(batch.inputs.shape)
        padding_rows += int((~np.asarray(batch.inputs_segmentation).any(axis=1)).sum())
    assert shapes == {(8, 32)} and padding_rows > 0
    # The same over the unpadded documents, computed directly.
    source = xd.sources.SyntheticSource(num_documents=37, seed=4)
    targets = np.concatenate([np.append(source[i]["tokens"][1:], 1) for i in range(37)])
    direct = float(np.mean(np.sin(targets.astype(np.float32)) + 2.0))
    assert count == len(targets)
    assert total / count == pytest.approx(direct, rel=1e-5)
    # A second pass (reset_after_epoch) sees the same data.
    again = sum(int(sums(b)[1]) for b in iterator)
    assert again == count


def test_eval_iterators_are_not_shuffled(mesh):
    config = small_config()
    config.data.eval = {"held_out": {"kind": "synthetic", "num_documents": 5, "seed": 4}}
    config.data.packing = False
    _, evals = iterators_from_config(config.data, mesh)
    first_rows = np.asarray(next(evals["held_out"]).inputs)
    source = xd.sources.SyntheticSource(num_documents=5, seed=4)
    assert first_rows[0, 0] == source[0]["tokens"][0]


def test_a_json_file_in_a_text_dataset_is_refused_naming_the_key(mesh, tmp_path):
    rows = [{"text": "a {braced} document"}, {"text": "another"}]
    (tmp_path / "web.json").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    config = {
        "train": {"web": {"kind": "text", "path": str(tmp_path / "web.json")}},
        "global_batch_size": 4,
        "max_target_length": 8,
    }
    with pytest.raises(DataConfigError) as error:
        iterators_from_config(config, mesh)
    message = str(error.value)
    assert message.startswith("data.train.web (kind 'text'):") and "kind='jsonl'" in message
    config["train"]["web"]["kind"] = "jsonl"
    train, _ = iterators_from_config(config, mesh)
    tokens = set(np.asarray(next(train).inputs).ravel().tolist())
    train.close()
    assert ord("{") + 2 in tokens and ord('"') + 2 not in tokens  # the text, not the JSON


def test_the_model_vocabulary_covers_train_and_eval_sources(mesh):
    from trainer_hooks.train import model_vocab_size

    config = {
        "train": {"web": {"kind": "synthetic", "num_documents": 50}},
        "eval": {"wide": {"kind": "synthetic", "num_documents": 8, "vocab_size": 1000}},
        "global_batch_size": 8,
        "max_target_length": 32,
    }
    train, evals = iterators_from_config(config, mesh)
    iterators = [train, *evals.values()]
    assert model_vocab_size(None, iterators) == 1000
    with pytest.raises(xd.DataConfigError, match=r"model.vocab_size=258 .* 'wide' \(1000 ids\)"):
        model_vocab_size(258, iterators)
    for iterator in iterators:
        iterator.close()


def _source_order(train, name: str, positions: int = 64) -> np.ndarray:
    """The first positions of a dataset's document order in the train plan."""
    plan = train.plan
    return plan.orders[plan.spec.names.index(name)].documents(np.arange(positions))


def test_reordering_datasets_or_changing_a_weight_keeps_every_other_dataset_order(mesh):
    config = small_config()
    train, _ = iterators_from_config(config.data, mesh)
    names = train.plan.spec.names
    assert names == tuple(sorted(config.data.train))  # the plan's order is by name
    orders = {name: _source_order(train, name) for name in names}
    batches = [to_numpy(next(train)) for _ in range(3)]
    train.close()
    # The datasets in reverse order: nothing changes.
    data = config.data.to_dict()
    data["train"] = dict(reversed(list(data["train"].items())))
    reordered, _ = iterators_from_config(data, mesh)
    assert reordered.plan.spec.names == names
    for batch in batches:
        assert_batches_equal(batch, to_numpy(next(reordered)))
    reordered.close()
    # One weight changed: the mix changes, no dataset's document order does.
    data["train"][names[0]]["weight"] *= 3
    changed, _ = iterators_from_config(data, mesh)
    for name in names:
        np.testing.assert_array_equal(_source_order(changed, name), orders[name], err_msg=name)
    changed.close()
    # The seed does change them (each order is a permutation, not the file order).
    data["data_shuffle_seed"] = 1234
    reseeded, _ = iterators_from_config(data, mesh)
    for name in names:
        assert not np.array_equal(_source_order(reseeded, name), orders[name]), name
    reseeded.close()


def test_a_dataset_of_weight_zero_in_every_stage_is_not_opened(mesh, monkeypatch):
    from xlstm_data.config.data_config import SourceConfig

    built = []
    build = SourceConfig.build
    monkeypatch.setattr(SourceConfig, "build", lambda self: built.append(self.name) or build(self))
    config = small_config()
    names = list(config.data.train)
    data = config.data.to_dict()
    data["train"][names[0]]["weight"] = 0.0
    train, _ = iterators_from_config(data, mesh)
    assert names[0] not in train.sources and names[0] not in train.plan.spec.names
    train.close()
    assert names[0] not in built and set(names[1:]) <= set(built)
    # Off in the first stage but on in a later one: opened.
    built.clear()
    data["mixture_schedule"] = [[0, {names[1]: 1.0}], [5, {names[0]: 1.0, names[1]: 1.0}]]
    train, _ = iterators_from_config(data, mesh)
    assert names[0] in train.sources and names[0] in built
    assert names[2] not in built  # weight 0 in both stages
    train.close()
