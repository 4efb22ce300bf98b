"""Demo run: the Python standard library as a 2-component mixture, no download.

Code (the library's source files) and prose (their docstrings), byte
tokenizer, packed rows of 128 tokens, and a 3-stage batch-size ramp-up.
"""

from ml_collections import config_dict


def get_config() -> config_dict.ConfigDict:
    config = config_dict.ConfigDict()
    config.seed = 0
    config.num_train_steps = 300
    config.learning_rate = 3e-3
    config.warmup_steps = 20
    config.log_every_steps = 25
    config.eval_every_steps = 0  # evaluates once at the end

    config.model = config_dict.ConfigDict(
        {"vocab_size": 258, "d_model": 64, "num_layers": 2, "num_heads": 4, "mlp_dim": 256}
    )
    config.checkpoint = config_dict.ConfigDict(
        {"every_steps": 50, "every_secs": config_dict.placeholder(float), "max_to_keep": 2}
    )

    config.mesh = config_dict.ConfigDict()
    config.mesh.axis_dims = "dp:1,fsdp:-1,tp:1,sp:1"

    data = config_dict.ConfigDict()
    data.train = config_dict.ConfigDict(
        {
            "code": {"kind": "python_stdlib", "part": "code", "weight": 0.7},
            "prose": {"kind": "python_stdlib", "part": "docstrings", "weight": 0.3},
        }
    )
    data.eval = config_dict.ConfigDict(
        {"prose_eval": {"kind": "python_stdlib", "part": "docstrings", "max_files": 8}}
    )
    data.global_batch_size = 16
    data.eval_global_batch_size = config_dict.placeholder(int)
    data.max_target_length = 128
    data.packing = True
    data.packing_bin_count = config_dict.placeholder(int)
    data.shift = True
    data.shift_target = True
    data.eod_token_id = 1  # the byte tokenizer's EOD
    data.shuffle = True
    data.data_shuffle_seed = 42
    data.num_epochs = config_dict.placeholder(int)
    data.worker_count = 0
    data.worker_buffer_size = 1
    data.drop_remainder = True
    # [step, factor] pairs: the factor of the largest step <= the current one applies.
    data.rampup = [[0, 0.25], [100, 0.5], [200, 1.0]]
    data.prefetch = 2
    config.data = data
    return config
