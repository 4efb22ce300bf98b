"""Three components with weights far apart and a three-stage batch-size ramp-up.

Synthetic documents (lognormal lengths) so the run needs no files; swap the
`kind` for `array_record`, `text` or `jsonl` with a `path` to use real data.
The mixture adapts every 50 steps to each dataset's loss (`adaptive_mixture`,
README "Online and adaptive mixing"); the configured weights are its prior.
"""

from ml_collections import config_dict

from trainer_hooks.config import default_config


def _synthetic(seed: int, mean_length: float, weight: float) -> dict:
    return {
        "kind": "synthetic",
        "num_documents": 20_000,
        "mean_length": mean_length,
        "sigma": 0.8,
        "seed": seed,
        "weight": weight,
    }


def get_config() -> config_dict.ConfigDict:
    config = default_config()
    config.num_train_steps = 1000

    data = config.data
    data.train = config_dict.ConfigDict(
        {
            "web": _synthetic(1, 400.0, 0.80),
            "books": _synthetic(2, 2000.0, 0.15),
            "code": _synthetic(3, 150.0, 0.05),
        }
    )
    data.eval = config_dict.ConfigDict(
        {"web_eval": {"kind": "synthetic", "num_documents": 64, "seed": 99}}
    )
    data.global_batch_size = 32
    data.max_target_length = 256
    data.data_shuffle_seed = 7
    data.rampup = [[0, 0.25], [200, 0.5], [500, 1.0]]
    config.adaptive_mixture.every_steps = 50
    config.adaptive_mixture.smoothing = 0.2
    return config
