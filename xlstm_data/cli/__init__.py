"""The `xlstm-data` command line, apart from the data flow: prepare, inspect, bench.

`main` dispatches the subcommands; `prepare` writes tokenized ArrayRecord
shards with their lengths index; `inspect_config` shows what a config will do.
"""
