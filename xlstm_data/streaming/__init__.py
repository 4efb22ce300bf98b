"""The streaming path of the reference factories, for pipelines without known lengths.

`factories` builds `make_grain_llm_dataset` and friends from grain operations:
documents are sharded per host (`host_sharding`), read ahead
(`read_ahead`, `source_dataset`), chunked (`chunking`), packed on the fly
(`packing`), mixed (`mixing`) and batched (`batching`). Its position is grain's
iterator state, bound to the host count; the config path uses the plan instead.
"""
