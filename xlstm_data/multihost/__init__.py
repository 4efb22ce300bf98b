"""Step 4 of the flow: the iterator a training loop pulls, on every process.

`host_layout` derives which rows each process loads from the `mesh`;
`iterator` hands out the plan's batches as global `jax.Array`s
(`global_arrays`), prepared ahead (`prefetch`) or in grain worker processes
(`workers`, `worker_handover`; their chunks arrive through reused
`shared_slots`), with `data_stats` for the metrics;
`plan_state` is its saved position and `resources` what it must release.
"""
