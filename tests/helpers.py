"""Small utilities shared by the in-process tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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


def prepared_corpus(tmp_path: Path) -> Path:
    """A small Parquet corpus with a held-out split, prepared through the CLI."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from xlstm_data.cli.main import main as cli_main

    texts = [f"document {i}: " + "lorem ipsum " * (i % 40) for i in range(400)]
    (tmp_path / "raw").mkdir()
    pq.write_table(pa.table({"text": texts}), tmp_path / "raw" / "part-0.parquet")
    out = tmp_path / "prepared"
    argv = ["prepare", str(tmp_path / "raw" / "*.parquet"), f"--output={out}"]
    assert cli_main([*argv, "--num_shards=2", "--validation_fraction=0.05"]) == 0
    return out


#: The Megatron-LM corpora megatron-core wrote for the tests (`make_fixture.py` there).
MEGATRON_FIXTURES = Path(__file__).resolve().parent / "fixtures" / "megatron"
#: The one of them with a stored end-of-document id (50256) after each document.
MEGATRON_WEB = MEGATRON_FIXTURES / "web_text_document"


def shipped_config_argv(config: Path, tmp_path: Path) -> tuple[str, list[str]]:
    """`--config`'s value for a shipped config, and the overrides its test data needs.

    `prepared.py` takes a directory `prepare` wrote, `megatron.py` a Megatron
    prefix and its end-of-document id; that corpus's 60 short documents fill
    39 rows of 32 tokens an epoch, less than the config's batch of 32 x 256.
    """
    if config.name == "prepared.py":
        return f"{config}:{prepared_corpus(tmp_path)}", []
    if config.name == "megatron.py":
        small = ["--config.data.global_batch_size=16", "--config.data.max_target_length=32"]
        return f"{config}:{MEGATRON_WEB},50256", small
    return str(config), []


def plan_spec(weights: dict[str, float], **overrides) -> Any:
    """A plan spec of one stage over `weights`' sources, rows of 128, best fit, batch 64."""
    from xlstm_data.config.rampup import BatchSizeSchedule
    from xlstm_data.plan.mixture import parse_mixture_schedule
    from xlstm_data.plan.spec import PlanSpec

    names = tuple(weights)
    fields = dict(
        names=names,
        mixture=parse_mixture_schedule(None, names, weights),
        mixture_unit="tokens",
        row_length=128,
        packing="best_fit",
        shift=True,
        shift_target=True,
        seed=0,
        shuffle=True,
        batch=BatchSizeSchedule(64, None),
    )
    return PlanSpec(**{**fields, **overrides})
