"""Step 1 of the flow: a run's data config, validated once into a frozen spec.

`data_config` checks every key and names the bad ones; `overrides` applies
`--config.KEY=VALUE` command-line overrides; `rampup` re-exports the
batch-size schedule, which lives in `xlstm_data.plan.schedule` (the plan
needs it, and the plan does not import the config); `end_of_document`
settles the end-of-document id against the sources' tokenizers;
`fingerprint` records what a checkpoint's data depends on; `run_config`
holds the keys of a whole run config besides `data`, which the command
line and `trainer_hooks.train` both check.
"""
