"""Training on a corpus written by `xlstm-data prepare`: pass its directory after a colon.

    xlstm-data prepare "fineweb/*.parquet" --output=/data/fineweb --num_shards=64 \\
        --validation_fraction=0.001
    python -m trainer_hooks.train --config=configs/prepared.py:/data/fineweb --workdir=run

The shards' `index.json` gives the tokenizer (and its end-of-document id)
and every document's length, so nothing is tokenized or counted at launch.
The held-out split `prepare` wrote to DIR/validation becomes the eval set
when it is there. Every key can still be overridden on the command line,
e.g. `--config.data.max_target_length=2048`.
"""

import os

from ml_collections import config_dict

from trainer_hooks.config import default_config


def get_config(directory: str | None = None) -> config_dict.ConfigDict:
    if not directory:
        raise ValueError(
            "configs/prepared.py needs the directory `xlstm-data prepare` wrote, after a colon: "
            "--config=configs/prepared.py:/data/corpus"
        )
    config = default_config()
    config.num_train_steps = 1000
    config.eval_every_steps = 0  # evaluates once at the end, when there is a held-out split
    data = config.data
    data.train = config_dict.ConfigDict(
        # The directory: its index.json says which shards and layout (flat or ArrayRecord).
        {"corpus": {"kind": "array_record", "path": directory}}
    )
    validation = os.path.join(directory, "validation")
    if os.path.exists(os.path.join(validation, "index.json")):
        data.eval = config_dict.ConfigDict(
            {
                "held_out": {
                    "kind": "array_record",
                    "path": validation,
                }
            }
        )
    data.global_batch_size = 32
    data.max_target_length = 256
    data.rampup = [[0, 0.5], [100, 1.0]]
    return config
