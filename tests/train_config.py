"""A small, fast config for the training-run tests.

A 2-component mixture whose weights change at step 5 (a mixture stage), a
ramp-up from 12 to 24 rows at step 10, and packing. Both batch sizes divide
over 1, 2, 3 and 4 processes of 2 CPU devices, so a checkpoint of it can
resume on another process count.
"""

from ml_collections import config_dict

from trainer_hooks.config import default_config


def get_config() -> config_dict.ConfigDict:
    config = default_config()
    config.num_train_steps = 30
    config.warmup_steps = 5
    config.log_every_steps = 5
    config.model.update({"vocab_size": 258, "d_model": 32, "num_layers": 1, "num_heads": 2})
    config.model.mlp_dim = 64
    config.checkpoint.every_steps = 4
    data = config.data
    data.train = config_dict.ConfigDict(
        {
            "long": {"kind": "synthetic", "num_documents": 400, "mean_length": 60, "weight": 0.7},
            "short": {
                "kind": "synthetic",
                "num_documents": 400,
                "mean_length": 12,
                "seed": 1,
                "weight": 0.3,
            },
        }
    )
    data.eval = config_dict.ConfigDict(
        {"held_out": {"kind": "synthetic", "num_documents": 20, "seed": 2}}
    )
    data.mixture_schedule = [[0, {"long": 0.7, "short": 0.3}], [5, {"long": 0.2, "short": 0.8}]]
    data.global_batch_size = 24
    data.eval_global_batch_size = 12
    data.max_target_length = 32
    data.rampup = [[0, 0.5], [10, 1.0]]
    return config
