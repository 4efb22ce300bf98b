"""Small utilities shared by the in-process tests."""

from __future__ import annotations

import numpy as np

from xlstm_data.batch import LLM_BATCH_FIELDS


def unique_token_docs(lengths, first_token: int = 10) -> list[dict]:
    """Documents whose tokens are globally unique (consecutive integers)."""
    docs, start = [], first_token
    for n in lengths:
        docs.append({"tokens": np.arange(start, start + n, dtype=np.int32)})
        start += n
    return docs


def to_numpy(batch) -> dict[str, np.ndarray]:
    """A batch (LLMBatch or dict of arrays) as a dict of host numpy arrays."""
    if not isinstance(batch, dict):
        batch = {name: getattr(batch, name) for name in LLM_BATCH_FIELDS}
    return {k: np.asarray(v) for k, v in batch.items()}


def assert_batches_equal(a, b) -> None:
    a, b = to_numpy(a), to_numpy(b)
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)
