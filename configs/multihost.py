"""A multi-host layout: tensor parallelism (tp=2) next to data parallelism.

Processes whose devices form one tp group load identical rows; the batch is
split over the dp x fsdp axes only. Launch one process per host with
`--coordinator`, `--num_processes` and `--process_id` (or JAX's environment).
"""

from ml_collections import config_dict


def get_config() -> config_dict.ConfigDict:
    config = config_dict.ConfigDict()
    config.seed = 0
    config.num_train_steps = 200

    config.mesh = config_dict.ConfigDict()
    config.mesh.axis_dims = "dp:1,fsdp:-1,tp:2,sp:1"

    data = config_dict.ConfigDict()
    data.train = config_dict.ConfigDict(
        {"synthetic": {"kind": "synthetic", "num_documents": 50_000, "mean_length": 300.0}}
    )
    data.eval = config_dict.ConfigDict(
        {"synthetic_eval": {"kind": "synthetic", "num_documents": 128, "seed": 5}}
    )
    data.global_batch_size = 16
    data.eval_global_batch_size = config_dict.placeholder(int)
    data.max_target_length = 256
    data.packing = True
    data.eod_token_id = 1
    data.data_shuffle_seed = 3
    data.num_epochs = config_dict.placeholder(int)
    data.worker_count = 0
    data.rampup = [[0, 0.5], [50, 1.0]]
    config.data = data
    return config
