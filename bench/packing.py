"""Packing efficiency: the share of non-padding tokens per batch, first fit vs padding.

Two corpora: the demo's (configs/demo.py: the Python standard library's code
and docstrings, mixed 0.7/0.3, rows of 128) and the lognormal ArrayRecord
corpus (the `web` source of the throughput benchmark). For each, the train
iterator runs with first-fit packing and with one document chunk per padded
row; every batch's fraction of non-padding target tokens is recorded from the
iterator's `data_counters`. Repeats use different shuffle seeds. On the
lognormal corpus, the packed run is repeated with several packing bin counts
(the default is max(host batch size, 128)) to show how much the bin count decides.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
from absl import logging

import xlstm_data as xd
from bench import common
from xlstm_data.sources import ArrayRecordSource

NAME = "packing"
TARGET_PACKED = 0.97
EOD = 1


@dataclasses.dataclass(frozen=True)
class Sizes:
    demo_batches: int
    lognormal_seq_len: int
    lognormal_batch_size: int
    lognormal_batches: int
    seeds: tuple[int, ...]
    bin_counts: tuple[int, ...]


FULL = Sizes(500, 1024, 8, 300, (0, 1, 2), (8, 32, 128, 512))
TINY = Sizes(12, 128, 4, 12, (0,), (4, 16))


def _fractions(iterator: xd.MultiHostDataLoadIterator, batches: int) -> list[float]:
    """Per-batch non-padding share, from the iterator's own counters."""
    out = []
    try:
        for _ in range(batches):
            tokens, slots = iterator.data_counters.tokens, iterator.data_counters.slots
            next(iterator)
            out.append(
                (iterator.data_counters.tokens - tokens) / (iterator.data_counters.slots - slots)
            )
    finally:
        iterator.close()
    return out


def _demo_iterator(packed: bool, seed: int, mesh: Any) -> xd.MultiHostDataLoadIterator:
    data = common.load_config("demo").data.to_dict()
    data.update(packing=packed, data_shuffle_seed=seed, rampup=None, eval={})
    train, evals = xd.iterators_from_config(data, mesh)
    assert not evals
    return train


def _lognormal_iterator(
    files: list[str], packed: bool, seed: int, bins: int | None, sizes: Sizes, mesh: Any
) -> xd.MultiHostDataLoadIterator:
    return xd.make_grain_llm_iterator(
        None,
        None,
        mesh,
        ArrayRecordSource(files),
        sizes.lognormal_batch_size,
        sizes.lognormal_seq_len,
        shuffle=True,
        data_shuffle_seed=seed,
        grain_packing=packed,
        grain_packing_bin_count=bins,
        eod_token_id=EOD,
        worker_count=0,
    )


def _report(per_seed: list[list[float]]) -> dict[str, Any]:
    """Overall share per seed (summarized) and the per-batch distribution."""
    overall = [float(np.mean(f)) for f in per_seed]  # every batch has equal slots
    batches = np.concatenate([np.asarray(f) for f in per_seed])
    return {
        "non_padding_share": common.summarize(overall),
        "per_batch": {
            "median": float(np.median(batches)),
            "p5": float(np.percentile(batches, 5)),
            "min": float(batches.min()),
            "max": float(batches.max()),
            "batches": int(batches.size),
        },
        "_batches": batches.tolist(),
    }


def run(config: common.BenchConfig) -> dict[str, Any]:
    """Measures both corpora and writes packing.json and packing.png."""
    started = time.perf_counter()
    common.ensure_flags_parsed()
    sizes = TINY if config.tiny else FULL
    mesh = common.single_device_mesh()
    web = common.lognormal_corpus(config.tiny)["web"]
    files = common.prepare_corpus(web)
    corpora: dict[str, dict[str, Any]] = {"demo": {}, "lognormal": {}}
    for packed in (True, False):
        key = "first_fit" if packed else "padding_only"
        corpora["demo"][key] = _report(
            [
                _fractions(_demo_iterator(packed, seed, mesh), sizes.demo_batches)
                for seed in sizes.seeds
            ]
        )
        corpora["lognormal"][key] = _report(
            [
                _fractions(
                    _lognormal_iterator(files, packed, seed, None, sizes, mesh),
                    sizes.lognormal_batches,
                )
                for seed in sizes.seeds
            ]
        )
        logging.info(
            "bench packing %s: demo %.4f lognormal %.4f",
            key,
            corpora["demo"][key]["non_padding_share"]["median"],
            corpora["lognormal"][key]["non_padding_share"]["median"],
        )
    sweep = {}
    for bins in sizes.bin_counts:
        shares = _fractions(
            _lognormal_iterator(files, True, sizes.seeds[0], bins, sizes, mesh),
            sizes.lognormal_batches,
        )
        sweep[str(bins)] = float(np.mean(shares))
        logging.info("bench packing: %d bins -> %.4f", bins, sweep[str(bins)])
    png = _plot(config, corpora, sweep)
    for corpus in corpora.values():
        for report in corpus.values():
            report.pop("_batches")
    packed_share = corpora["lognormal"]["first_fit"]["non_padding_share"]["median"]
    payload = {
        "settings": {
            **dataclasses.asdict(sizes),
            "demo": "configs/demo.py data (python_stdlib code 0.7 + docstrings 0.3), "
            "max_target_length 128, global batch 16, no ramp-up",
            "lognormal_corpus": dataclasses.asdict(web),
            "default_packing_bins": "max(host batch size, 128)",
        },
        "corpora": corpora,
        "lognormal_first_fit_share_by_bins": sweep,
        "targets": [
            common.target(
                "lognormal.first_fit.non_padding_share",
                packed_share,
                ">=",
                TARGET_PACKED,
                f"packed batches >= {TARGET_PACKED:.0%} non-padding tokens (lognormal corpus)",
            )
        ],
        "png": png,
    }
    return common.write_result(config, NAME, payload, started)


def _plot(
    config: common.BenchConfig, corpora: Mapping[str, Any], sweep: Mapping[str, float]
) -> str:
    figure = common.new_figure(figsize=(12, 3.8))
    for i, (corpus, reports) in enumerate(corpora.items()):
        ax = figure.add_subplot(1, 3, i + 1)
        for key, report in reports.items():
            ax.hist(report["_batches"], bins=40, range=(0, 1), alpha=0.6, label=key)
        ax.set_title(f"{corpus} corpus")
        ax.set_xlabel("non-padding share per batch")
        ax.set_ylabel("batches")
        ax.legend(fontsize=8)
    ax = figure.add_subplot(1, 3, 3)
    bins = [int(b) for b in sweep]
    ax.plot(bins, list(sweep.values()), marker="o")
    ax.axhline(TARGET_PACKED, color="gray", linestyle="--", label="target")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("packing bins (default = max(host batch size, 128))")
    ax.set_ylabel("non-padding share")
    ax.set_title("lognormal, first fit")
    ax.legend(fontsize=8)
    return common.save_figure(config, NAME, figure)


def summary(result: Mapping[str, Any]) -> list[tuple[str, str, str, str]]:
    """Rows (figure, value, target, met) for the summary table."""
    rows = []
    met = result["targets"][0]["met"]
    for corpus, reports in result["corpora"].items():
        for key, report in reports.items():
            share = report["non_padding_share"]
            is_target = corpus == "lognormal" and key == "first_fit"
            rows.append(
                (
                    f"non-padding share {corpus} {key}",
                    f"{share['median']:.2%} ({share['min']:.2%}-{share['max']:.2%})",
                    f">= {TARGET_PACKED:.0%}" if is_target else "-",
                    ("yes" if met else "NO") if is_target else "-",
                )
            )
    sweep = result["lognormal_first_fit_share_by_bins"]
    rows.append(
        (
            "lognormal first_fit share by bins",
            ", ".join(f"{b}: {s:.2%}" for b, s in sweep.items()),
            "-",
            "-",
        )
    )
    return rows
