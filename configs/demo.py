"""Demo run: the Python standard library as a 2-component mixture, no download.

Code (the library's source files) and prose (their docstrings), byte
tokenizer, packed rows of 128 tokens, and a 3-stage batch-size ramp-up.
Every key not set here keeps its default from `default_config()` and can
still be overridden: `--config.data.worker_count=2`.
"""

from ml_collections import config_dict

from trainer_hooks.config import default_config


def get_config() -> config_dict.ConfigDict:
    config = default_config()
    config.num_train_steps = 300
    config.log_every_steps = 25
    config.eval_every_steps = 0  # evaluates once at the end
    config.checkpoint.every_steps = 50

    data = config.data
    data.train = config_dict.ConfigDict(
        {
            "code": {"kind": "python_stdlib", "part": "code", "weight": 0.7},
            "prose": {"kind": "python_stdlib", "part": "docstrings", "weight": 0.3},
        }
    )
    data.eval = config_dict.ConfigDict(
        {"prose_eval": {"kind": "python_stdlib", "part": "docstrings", "max_files": 8}}
    )
    # 8, 16, then 32 rows: every stage divides over a host of 8 devices.
    data.global_batch_size = 32
    data.max_target_length = 128
    data.data_shuffle_seed = 42
    # [step, factor] pairs: the factor of the largest step <= the current one applies.
    data.rampup = [[0, 0.25], [100, 0.5], [200, 1.0]]
    return config
