"""The reference model respects packing: segments isolated, positions restart, padding ignored."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from trainer_hooks.model import (
    CausalLM,
    ModelConfig,
    create_train_state,
    eval_step,
    masked_loss,
    train_step,
)
from xlstm_data import LLMBatch

VOCAB = 32
SEQ = 8
CONFIG = ModelConfig(vocab_size=VOCAB, max_length=SEQ, d_model=32, num_layers=2, mlp_dim=64)


@pytest.fixture(scope="module")
def params():
    model = CausalLM(CONFIG)
    dummy = jnp.ones((1, SEQ), jnp.int32)
    return model.init(jax.random.key(0), dummy, dummy, dummy)["params"]


@pytest.fixture(scope="module")
def state():
    return create_train_state(jax.random.key(1), CONFIG, 1e-2, SEQ)


@pytest.fixture(scope="module")
def apply(params):
    fn = jax.jit(CausalLM(CONFIG).apply)

    def run(tokens, segs, pos):
        arrays = (np.asarray(a, np.int32) for a in (tokens, segs, pos))
        return np.asarray(fn({"params": params}, *arrays))

    return run


def _batch(tokens, segs, pos, targets=None) -> LLMBatch:
    tokens, segs, pos = (np.asarray(a, np.int32) for a in (tokens, segs, pos))
    if targets is None:
        targets = (tokens * 7 + 3) % VOCAB
    return LLMBatch(
        inputs=tokens,
        targets=np.asarray(targets, np.int32),
        inputs_segmentation=segs,
        targets_segmentation=segs,
        inputs_position=pos,
        targets_position=pos,
    )


def test_logits_shape_and_finite_with_padding(apply):
    tokens = [[0] * 8, [5, 6, 7, 8, 9, 0, 0, 0], [1, 2, 3, 4, 5, 6, 7, 8]]
    segs = [[0] * 8, [1, 1, 1, 2, 2, 0, 0, 0], [1] * 8]
    pos = [[0] * 8, [0, 1, 2, 0, 1, 0, 0, 0], list(range(8))]
    logits = apply(tokens, segs, pos)
    assert logits.shape == (3, SEQ, VOCAB)
    assert np.isfinite(logits).all()


def test_segments_are_isolated_and_attention_is_causal(apply):
    segs = [[1, 1, 1, 2, 2, 2, 2, 0]]
    pos = [[0, 1, 2, 0, 1, 2, 3, 0]]
    base_tokens = np.array([[3, 4, 5, 10, 11, 12, 13, 0]])
    base = apply(base_tokens, segs, pos)

    doc1_changed = base_tokens.copy()
    doc1_changed[0, :3] = [20, 21, 22]
    out = apply(doc1_changed, segs, pos)
    np.testing.assert_allclose(out[0, 3:7], base[0, 3:7], atol=1e-6, rtol=0)
    assert not np.allclose(out[0, :3], base[0, :3])  # the edit is visible where it should be

    doc2_changed = base_tokens.copy()
    doc2_changed[0, 3:7] = [25, 26, 27, 28]
    out = apply(doc2_changed, segs, pos)
    np.testing.assert_allclose(out[0, :3], base[0, :3], atol=1e-6, rtol=0)

    later_changed = base_tokens.copy()
    later_changed[0, 5] = 30
    out = apply(later_changed, segs, pos)
    np.testing.assert_allclose(out[0, :5], base[0, :5], atol=1e-6, rtol=0)
    assert not np.allclose(out[0, 5:7], base[0, 5:7])


def test_positions_restart_per_document(apply):
    doc = [9, 8, 7, 6]
    alone = apply([doc + [0] * 4], [[1] * 4 + [0] * 4], [[0, 1, 2, 3, 0, 0, 0, 0]])
    packed = apply(
        [[1, 2, 3] + doc + [0]],
        [[1, 1, 1, 2, 2, 2, 2, 0]],
        [[0, 1, 2, 0, 1, 2, 3, 0]],
    )
    np.testing.assert_allclose(packed[0, 3:7], alone[0, :4], atol=1e-5, rtol=0)


def test_masked_loss_ignores_padding(state):
    rng = np.random.default_rng(0)
    logits = jnp.asarray(rng.normal(size=(2, SEQ, VOCAB)), jnp.float32)
    targets = rng.integers(0, VOCAB, size=(2, SEQ)).astype(np.int32)
    segs = np.array([[1, 1, 2, 2, 2, 0, 0, 0], [1] * 4 + [0] * 4], np.int32)
    loss_sum, count = masked_loss(logits, targets, segs)
    other_targets = np.where(segs == 0, rng.integers(0, VOCAB, size=(2, SEQ)), targets)
    other_logits = jnp.where(jnp.asarray(segs == 0)[..., None], 100.0 * logits, logits)
    loss_sum2, count2 = masked_loss(other_logits, other_targets.astype(np.int32), segs)
    assert count.dtype == jnp.float32 and float(count) == 9.0
    assert float(loss_sum2) == float(loss_sum) and float(count2) == float(count)
    # Truncating the padding away gives the same sum.
    np.testing.assert_allclose(
        float(loss_sum), float(masked_loss(logits[:, :5], targets[:, :5], segs[:, :5])[0])
    )

    # Through the model: appending padding with arbitrary targets changes nothing.
    short = _batch([[3, 4, 5, 6]], [[1, 1, 2, 2]], [[0, 1, 0, 1]])
    padded = _batch(
        [[3, 4, 5, 6, 0, 0, 0, 0]],
        [[1, 1, 2, 2, 0, 0, 0, 0]],
        [[0, 1, 0, 1, 0, 0, 0, 0]],
        targets=np.concatenate([short.targets, [[31, 17, 2, 9]]], axis=1),
    )
    evaluate = jax.jit(eval_step)
    a, b = evaluate(state, short), evaluate(state, padded)
    assert float(a["tokens"]) == float(b["tokens"]) == 4.0
    np.testing.assert_allclose(float(a["loss_sum"]), float(b["loss_sum"]), rtol=1e-6)


def _train_batch() -> LLMBatch:
    rng = np.random.default_rng(3)
    tokens = rng.integers(1, VOCAB, size=(4, SEQ))
    segs = np.array([[1] * 8, [1, 1, 1, 2, 2, 2, 2, 2], [1] * 5 + [0] * 3, [0] * 8])
    pos = np.array([list(range(8)), [0, 1, 2, 0, 1, 2, 3, 4], [0, 1, 2, 3, 4, 0, 0, 0], [0] * 8])
    return _batch(tokens * (segs != 0), segs, pos, targets=rng.integers(0, VOCAB, size=(4, SEQ)))


def test_train_steps_reduce_loss(state):
    batch = _train_batch()
    step = jax.jit(train_step)
    losses = []
    for _ in range(8):
        state, metrics = step(state, batch)
        losses.append(float(metrics["loss"]))
    assert float(metrics["tokens"]) == 21.0
    assert np.isfinite(losses).all()
    assert losses[-1] < 0.7 * losses[0], losses


def test_train_step_is_deterministic_and_warms_up():
    batch = _train_batch()
    runs = []
    for _ in range(2):
        state = create_train_state(jax.random.key(4), CONFIG, 1e-2, SEQ, warmup_steps=2)
        step = jax.jit(train_step)
        first, _ = step(state, batch)
        second, _ = step(first, batch)
        runs.append([jax.tree.leaves(s.params) for s in (state, first, second)])
        # Linear warmup from 0: the first update is a no-op, the second is not.
        for a, b in zip(runs[-1][0], runs[-1][1], strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        assert any(not np.array_equal(a, b) for a, b in zip(runs[-1][1], runs[-1][2], strict=True))
    for a, b in zip(runs[0][2], runs[1][2], strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_from_config_reads_dicts_and_config_dicts():
    cfg = ModelConfig.from_config({"d_model": 16, "num_heads": 2}, vocab_size=10, max_length=5)
    assert (cfg.d_model, cfg.num_heads, cfg.num_layers, cfg.vocab_size) == (16, 2, 1, 10)
    cd = ml_collections.ConfigDict({"num_layers": 2, "mlp_dim": 32})
    cfg = ModelConfig.from_config(cd, vocab_size=10, max_length=5)
    assert (cfg.num_layers, cfg.mlp_dim, cfg.d_model) == (2, 32, 32)
