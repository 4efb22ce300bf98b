"""A tiny causal language model for the reference training loop.

The data pipeline's job ends at an `LLMBatch`; this module exists so the reference loop (and
its tests) can show that batch being consumed correctly: packed documents are kept apart by
a segment-aware attention mask, positions restart at 0 per document, and the loss counts only
tokens whose `targets_segmentation` is non-zero. It is deliberately small, not a research
model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax.training import train_state

from xlstm_data import LLMBatch


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Hyper-parameters of `CausalLM`.

    Attributes:
      vocab_size: Number of token ids.
      max_length: Largest position id + 1 (size of the position table).
      d_model: Width of the residual stream.
      num_layers: Number of transformer blocks. One by default: the model is
        here to train on the data path, and a second block cost every
        training launch 1.1-1.5 s of tracing (a fifth of a 3-step run of
        configs/demo.py on 8 CPU devices, with the compilation cache warm).
      num_heads: Attention heads per block.
      mlp_dim: Hidden width of each block's MLP.
      dtype: Computation dtype.
    """

    vocab_size: int
    max_length: int
    d_model: int = 32
    num_layers: int = 1
    num_heads: int = 2
    mlp_dim: int = 128
    dtype: Any = jnp.float32

    @classmethod
    def from_config(
        cls, config: Mapping[str, Any] | Any, vocab_size: int, max_length: int
    ) -> ModelConfig:
        """Builds a config, taking optional sizes from a dict or `ConfigDict`.

        Args:
          config: Mapping (or `ml_collections.ConfigDict`) that may hold `d_model`,
            `num_layers`, `num_heads` and `mlp_dim`; missing keys keep their defaults.
          vocab_size: Number of token ids.
          max_length: Largest position id + 1.

        Returns:
          The `ModelConfig`.
        """
        sizes = ("d_model", "num_layers", "num_heads", "mlp_dim")
        kwargs = {name: int(config[name]) for name in sizes if name in config}
        return cls(vocab_size=vocab_size, max_length=max_length, **kwargs)


def attention_mask(segment_ids: jax.Array) -> jax.Array:
    """Causal, same-document mask of shape `[b, 1, l, l]`.

    Padding keys (segment 0) are masked; every token may attend to itself, so a padding
    query's row is never fully masked and its softmax stays finite.

    Args:
      segment_ids: `[b, l]` document ids, 0 for padding.

    Returns:
      Boolean mask, True where a query may attend to a key.
    """
    causal = nn.make_causal_mask(segment_ids, dtype=jnp.bool_)
    same = nn.make_attention_mask(segment_ids, segment_ids, jnp.equal, dtype=jnp.bool_)
    real_key = (segment_ids != 0)[:, None, None, :]
    self_only = jnp.eye(segment_ids.shape[-1], dtype=jnp.bool_)[None, None]
    return (causal & same & real_key) | self_only


class Block(nn.Module):
    """Pre-LayerNorm transformer block: self-attention then MLP, both residual."""

    config: ModelConfig

    @nn.compact
    def __call__(self, x: jax.Array, mask: jax.Array) -> jax.Array:
        """Applies the block to `x` (`[b, l, d_model]`) under `mask` (`[b, 1, l, l]`)."""
        cfg = self.config
        h = nn.LayerNorm(dtype=cfg.dtype)(x)
        h = nn.MultiHeadDotProductAttention(num_heads=cfg.num_heads, dtype=cfg.dtype)(
            h, h, mask=mask
        )
        x = x + h
        h = nn.LayerNorm(dtype=cfg.dtype)(x)
        h = nn.Dense(cfg.mlp_dim, dtype=cfg.dtype)(h)
        h = nn.Dense(cfg.d_model, dtype=cfg.dtype)(nn.gelu(h))
        return x + h


class CausalLM(nn.Module):
    """Decoder-only transformer over packed rows."""

    config: ModelConfig

    @nn.compact
    def __call__(
        self, tokens: jax.Array, segment_ids: jax.Array, positions: jax.Array
    ) -> jax.Array:
        """Computes next-token logits.

        Args:
          tokens: `[b, l]` int token ids.
          segment_ids: `[b, l]` document ids within each row, 0 for padding.
          positions: `[b, l]` position of each token within its document.

        Returns:
          Logits of shape `[b, l, vocab_size]`.
        """
        cfg = self.config
        x = nn.Embed(cfg.vocab_size, cfg.d_model, dtype=cfg.dtype, name="tokens")(tokens)
        x = x + nn.Embed(cfg.max_length, cfg.d_model, dtype=cfg.dtype, name="pos")(positions)
        mask = attention_mask(segment_ids)
        for i in range(cfg.num_layers):
            x = Block(cfg, name=f"block_{i}")(x, mask)
        x = nn.LayerNorm(dtype=cfg.dtype)(x)
        return nn.Dense(cfg.vocab_size, dtype=cfg.dtype, name="head")(x)


def masked_loss(
    logits: jax.Array, targets: jax.Array, targets_segmentation: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Summed cross entropy over non-padding targets.

    Args:
      logits: `[b, l, vocab]` logits.
      targets: `[b, l]` int target ids.
      targets_segmentation: `[b, l]` document ids of the targets, 0 for padding.

    Returns:
      `(loss_sum, token_count)`, both float32 scalars.
    """
    mask = (targets_segmentation != 0).astype(jnp.float32)
    return jnp.sum(token_losses(logits, targets, targets_segmentation)), jnp.sum(mask)


def token_losses(
    logits: jax.Array, targets: jax.Array, targets_segmentation: jax.Array
) -> jax.Array:
    """Cross entropy of every target, 0 on padding: float32 `[b, l]`."""
    mask = (targets_segmentation != 0).astype(jnp.float32)
    losses = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), targets)
    return losses * mask


def create_train_state(
    rng: jax.Array,
    model_config: ModelConfig,
    learning_rate: float,
    seq_len: int,
    *,
    warmup_steps: int = 0,
) -> train_state.TrainState:
    """Initialises parameters and an AdamW optimiser with gradient clipping at 1.0.

    Args:
      rng: PRNG key for parameter initialisation.
      model_config: Model sizes.
      learning_rate: Peak learning rate.
      seq_len: Sequence length of the dummy batch used for initialisation.
      warmup_steps: Steps of linear warmup from 0 to `learning_rate` (0: none).

    Returns:
      A `TrainState` whose `apply_fn` is `CausalLM(model_config).apply`.
    """
    model = CausalLM(model_config)
    dummy = jnp.ones((1, seq_len), jnp.int32)
    params = model.init(rng, dummy, dummy, jnp.zeros_like(dummy))["params"]
    schedule: float | optax.Schedule = learning_rate
    if warmup_steps > 0:
        schedule = optax.linear_schedule(0.0, learning_rate, warmup_steps)
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule))
    return train_state.TrainState.create(apply_fn=model.apply, params=params, tx=tx)


def _logits(state: train_state.TrainState, params: Any, batch: LLMBatch) -> jax.Array:
    return state.apply_fn(
        {"params": params}, batch.inputs, batch.inputs_segmentation, batch.inputs_position
    )


def train_step(
    state: train_state.TrainState, batch: LLMBatch
) -> tuple[train_state.TrainState, dict[str, jax.Array]]:
    """One optimiser step on the mean loss over non-padding tokens (pure; jit it).

    Args:
      state: Current training state.
      batch: The batch to train on.

    Returns:
      `(new_state, metrics)` with metrics `{"loss": mean loss, "tokens": token
      count, "token_loss": [b, l] per-token loss, 0 on padding}` (the last for
      per-dataset loss: `DataMetricsHook.record_loss`).
    """

    def loss_fn(params: Any) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
        token_loss = token_losses(
            _logits(state, params, batch), batch.targets, batch.targets_segmentation
        )
        tokens = jnp.sum(batch.targets_segmentation != 0).astype(jnp.float32)
        return jnp.sum(token_loss) / jnp.maximum(tokens, 1.0), (tokens, token_loss)

    (loss, (tokens, token_loss)), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    metrics = {"loss": loss, "tokens": tokens, "token_loss": token_loss}
    return state.apply_gradients(grads=grads), metrics


def eval_step(params_state: train_state.TrainState, batch: LLMBatch) -> dict[str, jax.Array]:
    """Summed loss and token count of a batch, for averaging over an eval set.

    Args:
      params_state: Training state whose parameters are evaluated.
      batch: The batch to evaluate.

    Returns:
      `{"loss_sum": summed loss, "tokens": token count}`.
    """
    loss_sum, tokens = masked_loss(
        _logits(params_state, params_state.params, batch),
        batch.targets,
        batch.targets_segmentation,
    )
    return {"loss_sum": loss_sum, "tokens": tokens}
