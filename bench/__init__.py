"""Benchmarks of xlstm-data: figures measured against a baseline in the same process.

Each benchmark module (`throughput`, `resume`, `loop_wait`,
`memory`, `plan`, `plan_throughput`, `cold_start`, `plan_packing`,
`plan_mixture`, `device_overlap`) has
`run(config) -> dict`, which measures, writes
`<out>/<name>.json` (and a PNG where a picture helps) and returns the JSON
payload, and `summary(result)`, the rows of the summary table. `bench.run`
is the command line (`python -m bench.run`, `xlstm-data bench`). Results are
figures, not pass/fail: each JSON states its targets with a boolean `met`.
"""

BENCHMARKS = (
    "throughput",
    "resume",
    "loop_wait",
    "memory",
    "plan",
    "plan_throughput",
    "cold_start",
    "plan_packing",
    "plan_mixture",
    "device_overlap",
)
