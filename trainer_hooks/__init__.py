"""CLU-style periodic actions that save and restore the data position with the model.

The hooks (`CheckpointHook`, `DataMetricsHook`) and the reference training loop
are built on `xlstm_data`; this package is filled in by the checkpointing work.
"""
