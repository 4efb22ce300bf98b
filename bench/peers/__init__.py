"""Side-by-side with the loaders people pick instead: Megatron-core, OLMo-core, mosaicml-streaming.

The same documents (lognormal lengths, mean 512; ids < 65536) are written
for each system in its own format (`corpus`), and each system's loop runs in
a subprocess of its own virtual environment (`run_ours` in the project's,
`run_megatron`, `run_olmo`, `run_streaming` in `.venv-peers`, made by
`make bench-peers`), so the peers never become the project's dependencies.
`harness` alternates the systems within one run and reports per-round
ratios ours/peer, median (min-max), against issue 23's targets.

    python -m bench.peers [--tiny] [--rounds N] [--docs N] [--out DIR] [--cold_10m]
        [--cold_100m] [--profile]

Not part of `make test` (tests/test_bench_peers.py tests the harness
without the peers).
"""
