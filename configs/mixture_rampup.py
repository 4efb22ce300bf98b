"""Three components with weights far apart and a three-stage batch-size ramp-up.

Synthetic documents (lognormal lengths) so the run needs no files; swap the
`kind` for `array_record`, `text` or `jsonl` with a `path` to use real data.
"""

from ml_collections import config_dict


def get_config() -> config_dict.ConfigDict:
    config = config_dict.ConfigDict()
    config.seed = 0
    config.num_train_steps = 1000

    config.mesh = config_dict.ConfigDict()
    config.mesh.axis_dims = "dp:1,fsdp:-1,tp:1,sp:1"

    def synthetic(seed: int, mean_length: float, weight: float) -> dict:
        return {
            "kind": "synthetic",
            "num_documents": 20_000,
            "mean_length": mean_length,
            "sigma": 0.8,
            "seed": seed,
            "weight": weight,
        }

    data = config_dict.ConfigDict()
    data.train = config_dict.ConfigDict(
        {
            "web": synthetic(1, 400.0, 0.80),
            "books": synthetic(2, 2000.0, 0.15),
            "code": synthetic(3, 150.0, 0.05),
        }
    )
    data.eval = config_dict.ConfigDict(
        {"web_eval": {"kind": "synthetic", "num_documents": 64, "seed": 99}}
    )
    data.global_batch_size = 32
    data.eval_global_batch_size = config_dict.placeholder(int)
    data.max_target_length = 256
    data.packing = True
    data.packing_bin_count = 64
    data.eod_token_id = 1
    data.shuffle = True
    data.data_shuffle_seed = 7
    data.num_epochs = config_dict.placeholder(int)
    data.worker_count = 0
    data.drop_remainder = True
    data.rampup = [[0, 0.25], [200, 0.5], [500, 1.0]]
    config.data = data
    return config
