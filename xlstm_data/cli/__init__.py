"""The `xlstm-data` command line, apart from the data flow: prepare, inspect, bench.

`main` dispatches the subcommands; `prepare` writes tokenized ArrayRecord
shards with their lengths index; `inspect_config` shows what a config will do;
`common` holds what the subcommands share. The command line is built on the
library alone: it imports nothing of `trainer_hooks`.
"""
