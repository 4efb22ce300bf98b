"""A small, fast config for the training-run tests: 2-component mixture, ramp-up."""

from ml_collections import config_dict


def get_config() -> config_dict.ConfigDict:
    config = config_dict.ConfigDict()
    config.seed = 0
    config.num_train_steps = 30
    config.learning_rate = 3e-3
    config.warmup_steps = 5
    config.log_every_steps = 5
    config.eval_every_steps = 0
    config.model = config_dict.ConfigDict(
        {"vocab_size": 258, "d_model": 32, "num_layers": 1, "num_heads": 2, "mlp_dim": 64}
    )
    config.checkpoint = config_dict.ConfigDict(
        {"every_steps": 4, "every_secs": config_dict.placeholder(float), "max_to_keep": 2}
    )
    config.mesh = config_dict.ConfigDict({"axis_dims": "dp:1,fsdp:-1,tp:1,sp:1"})
    config.data = config_dict.ConfigDict(
        {
            "train": {
                "long": {
                    "kind": "synthetic",
                    "num_documents": 400,
                    "mean_length": 60,
                    "weight": 0.7,
                },
                "short": {
                    "kind": "synthetic",
                    "num_documents": 400,
                    "mean_length": 12,
                    "seed": 1,
                    "weight": 0.3,
                },
            },
            "eval": {"held_out": {"kind": "synthetic", "num_documents": 20, "seed": 2}},
            "global_batch_size": 8,
            "eval_global_batch_size": 8,
            "max_target_length": 32,
            "rampup": [[0, 0.5], [10, 1.0]],
        }
    )
    return config
