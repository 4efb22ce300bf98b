"""A multi-host layout: tensor parallelism (tp=2) next to data parallelism.

Processes whose devices form one tp group load identical rows; the batch is
split over the dp x fsdp axes only. Launch one process per host with
`--coordinator`, `--num_processes` and `--process_id` (or JAX's environment).
It needs at least 2 devices in all (tp=2): on one CPU host, `--cpu_devices=4`.
"""

from ml_collections import config_dict

from trainer_hooks.config import default_config


def get_config() -> config_dict.ConfigDict:
    config = default_config()
    config.num_train_steps = 200
    config.mesh.axis_dims = "dp:1,fsdp:-1,tp:2,sp:1"

    data = config.data
    data.train = config_dict.ConfigDict(
        {"synthetic": {"kind": "synthetic", "num_documents": 50_000, "mean_length": 300.0}}
    )
    data.eval = config_dict.ConfigDict(
        {"synthetic_eval": {"kind": "synthetic", "num_documents": 128, "seed": 5}}
    )
    data.global_batch_size = 16
    data.max_target_length = 256
    data.data_shuffle_seed = 3
    data.rampup = [[0, 0.5], [50, 1.0]]
    return config
