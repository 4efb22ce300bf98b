"""Writes what the data pipeline delivered, as the training loop saw it.

Tokens/s, examples/s and padding say whether packing and throughput are as
expected; per-component token shares say whether the mixture does what the
config says; the current batch size follows the ramp-up; and the share of
wall time the loop waited for data says whether the accelerator starved.
Figures cover the interval since the previous report. On several processes
the counts are summed over data-loading hosts (replicas of one host are
counted once) and the wait is the slowest process's, so every process must
call the hook at the same steps (it is step-based only).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax_loop_utils import periodic_actions
from jax_loop_utils.metric_writers.interface import MetricWriter

_BATCHES, _TOKENS, _SLOTS, _ROWS, _WAIT = range(5)


class DataMetricsHook(periodic_actions.PeriodicAction):
    """Reports data throughput, padding, mixture shares, batch size and wait time.

    Args:
      writer: Where the scalars go (a jax-loop-utils `MetricWriter`).
      iterator: The train `MultiHostDataLoadIterator`.
      every_steps: Report when the step is a multiple of this.
      on_steps: Also report at these steps.
      prefix: Prefix of the scalar names.
    """

    def __init__(
        self,
        writer: MetricWriter,
        iterator: Any,
        *,
        every_steps: int,
        on_steps: Iterable[int] | None = None,
        prefix: str = "data/",
    ):
        super().__init__(every_steps=every_steps, on_steps=on_steps)
        self.writer = writer
        self.iterator = iterator
        self.prefix = prefix
        self._last_totals: np.ndarray | None = None
        self._last_time: float | None = None
        #: The scalars of the latest report (also written to `writer`).
        self.latest: dict[str, float] = {}

    def __call__(self, step: int, t: float | None = None) -> bool:
        t = time.monotonic() if t is None else t
        if self._last_totals is None:
            self._last_totals = self._totals()
            self._last_time = t
        return super().__call__(step, t)

    def _should_trigger(self, step: int, t: float) -> bool:
        return step != self._previous_step and super()._should_trigger(step, t)

    def _totals(self) -> np.ndarray:
        """Counter totals over all data hosts (a collective on several processes)."""
        local = self.iterator.data_counters.as_vector()
        if jax.process_count() == 1:
            return local
        host = np.float64(self.iterator.layout.host_index)
        row = np.concatenate([[host], local])
        # Sent as uint32 pairs so float64 counts survive without jax x64.
        table = np.asarray(multihost_utils.process_allgather(row.view(np.uint32)))
        table = table.reshape(jax.process_count(), -1).view(np.float64)
        _, first_of_host = np.unique(table[:, 0], return_index=True)
        totals = table[first_of_host, 1:].sum(axis=0)
        totals[_WAIT] = table[:, 1 + _WAIT].max()
        return totals

    def _apply(self, step: int, t: float) -> None:
        totals = self._totals()
        delta = totals - self._last_totals
        elapsed = max(t - self._last_time, 1e-9)
        self._last_totals, self._last_time = totals, t
        tokens, slots = delta[_TOKENS], delta[_SLOTS]
        scalars = {
            "tokens_per_sec": tokens / elapsed,
            "examples_per_sec": delta[_ROWS] / elapsed,
            "padding_fraction": 1.0 - tokens / slots if slots else 0.0,
            "wait_fraction": min(delta[_WAIT] / elapsed, 1.0),
            "wait_secs_per_step": delta[_WAIT] / max(delta[_BATCHES], 1.0),
            "tokens_seen": totals[_TOKENS],
        }
        if getattr(self.iterator, "batch_schedule", None) is not None:
            scalars["batch_size"] = self.iterator.batch_size_at(max(step - 1, 0))
        names = self.iterator.component_names or ("all",)
        for name, component_tokens in zip(names, delta[_WAIT + 1 :], strict=False):
            scalars[f"share/{name}"] = component_tokens / tokens if tokens else 0.0
        self.latest = {k: float(v) for k, v in scalars.items()}
        self.writer.write_scalars(step, {self.prefix + k: v for k, v in self.latest.items()})
