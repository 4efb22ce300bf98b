"""Step 4 of the flow: the iterator a training loop pulls, on every process.

`host_layout` derives which rows each process loads from the `mesh`;
`planned_iterator` hands out the plan's batches as global `jax.Array`s
(`global_arrays`), prepared ahead (`prefetch`) or in grain worker processes
(`workers`), with `data_stats` for the metrics. `iterator` is the base class,
shared with the streaming path.
"""
