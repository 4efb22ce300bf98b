"""A training loop written the way Flax's lm1b example is, fed by xlstm-data.

Not our loop: lm1b's habits. Its own config keys (`per_device_batch_size`,
`checkpoint_every_steps`, ...) with the data section from
`xd.default_data_config()`, a `('data', 'fsdp', 'tensor')` mesh, dict-style
batch access (`batch["inputs"]`, `batch.get("inputs_segmentation")`), its own
`jax.jit(..., in_shardings=(state_sharding, data_sharding))`, 0-based steps,
a checkpoint "at step" when `step % checkpoint_every_steps == 0` and the
start step read back from the train state. Run by tests/test_lm1b_style.py:

    python tests/lm1b_style_loop.py WORKDIR [KILL_AFTER_STEP]
"""

import json
import os
import sys

import jax

jax.config.update("jax_num_cpu_devices", 2)

import flax.linen as nn  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import ml_collections  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402
from flax.training import train_state  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import xlstm_data as xd  # noqa: E402


def get_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.seed = 0
    config.per_device_batch_size = 4
    config.max_target_length = 32
    config.num_train_steps = 12
    config.checkpoint_every_steps = 4
    config.learning_rate = 0.01
    config.emb_dim = 16
    config.data = xd.default_data_config()
    config.data.train = {
        "web": {"kind": "synthetic", "num_documents": 300, "mean_length": 20, "weight": 0.6},
        "code": {"kind": "synthetic", "num_documents": 300, "mean_length": 50, "seed": 1},
    }
    config.data.train.code.weight = 0.4
    return config


class TinyLM(nn.Module):
    vocab_size: int
    emb_dim: int

    @nn.compact
    def __call__(self, inputs, positions):
        x = nn.Embed(self.vocab_size, self.emb_dim)(inputs)
        x = x + nn.Embed(64, self.emb_dim)(positions)
        return nn.Dense(self.vocab_size)(nn.gelu(nn.Dense(self.emb_dim)(x)))


def train_step(state, batch):
    inputs = batch["inputs"]
    weights = jnp.where(batch.get("targets_segmentation") > 0, 1.0, 0.0)

    def loss_fn(params):
        logits = state.apply_fn({"params": params}, inputs, batch.get("inputs_position"))
        losses = optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"])
        return (losses * weights).sum() / weights.sum()

    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    return state.apply_gradients(grads=grads), {"loss": loss}


def main(workdir: str, kill_after: int | None) -> None:
    config = get_config()
    devices = np.asarray(jax.devices()).reshape(2, 1, 1)
    mesh = jax.sharding.Mesh(devices, ("data", "fsdp", "tensor"))
    data_sharding = NamedSharding(mesh, P(("data", "fsdp")))
    replicated = NamedSharding(mesh, P())
    config.data.global_batch_size = config.per_device_batch_size * jax.device_count()
    config.data.max_target_length = config.max_target_length
    train_iter, _ = xd.iterators_from_config(config.data, mesh)
    vocab = max(int(s.vocab_size) for s in train_iter.sources.values())

    model = TinyLM(vocab, config.emb_dim)
    dummy = jnp.ones((1, config.max_target_length), jnp.int32)
    params = jax.jit(model.init)(jax.random.key(config.seed), dummy, dummy)["params"]
    state = train_state.TrainState.create(
        apply_fn=model.apply, params=params, tx=optax.adam(config.learning_rate)
    )
    state = jax.device_put(state, replicated)
    manager = ocp.CheckpointManager(os.path.join(workdir, "checkpoints"))
    start_step = 0
    if manager.latest_step() is not None:
        restored = manager.restore(
            manager.latest_step(),
            args=ocp.args.Composite(
                state=ocp.args.StandardRestore(state), data=xd.DataCheckpointRestore(train_iter)
            ),
        )
        state = restored["state"]
        start_step = int(state.step)  # lm1b's habit: the step comes from the train state

    p_train_step = jax.jit(
        train_step,
        in_shardings=(replicated, data_sharding),
        out_shardings=(replicated, replicated),
        donate_argnums=(0,),
    )
    log = open(os.path.join(workdir, "steps.jsonl"), "a")  # noqa: SIM115
    for step in range(start_step, config.num_train_steps):
        is_last_step = step == config.num_train_steps - 1
        batch = next(train_iter)
        # Each of the 2 data replicas holds its own half of the batch, not all of it.
        assert {s.data.shape[0] for s in batch["inputs"].addressable_shards} == {4}
        state, metrics = p_train_step(state, batch)
        rows = np.asarray(batch["inputs"])
        record = {"step": step, "rows": rows[:, :6].tolist(), "loss": float(metrics["loss"])}
        log.write(json.dumps(record) + "\n")
        log.flush()
        if step % config.checkpoint_every_steps == 0 or is_last_step:
            manager.save(
                step,
                args=ocp.args.Composite(
                    state=ocp.args.StandardSave(state), data=xd.DataCheckpointSave(train_iter)
                ),
            )
            manager.wait_until_finished()
        if step == kill_after:
            os.kill(os.getpid(), 9)
    manager.close()
    train_iter.close()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else None)
