"""Writes what the data pipeline delivered, as the training loop saw it.

Tokens/s, examples/s and padding say whether packing and throughput are as
expected; per-component token shares, next to the shares the plan's current
mixture stage asks for, say whether the mixture does what the config says;
the documents split across rows say what packing costs; the current batch
size follows the ramp-up; the share of wall time the loop waited for data
says whether the accelerator starved; and, when the loop hands it each
step's per-token loss (`record_loss`), the loss of each dataset.
Figures cover the interval since the previous report. On several processes
the counts are summed over data-loading hosts (replicas of one host are
counted once) and the wait is the slowest process's, so every process must
call the hook at the same steps (it is step-based only).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax_loop_utils.metric_writers.interface import MetricWriter

from trainer_hooks.periodic import StepAnchoredAction
from trainer_hooks.source_losses import SourceLossMeter, mean_losses

_BATCHES, _TOKENS, _SLOTS, _ROWS, _WAIT, _DOCUMENTS, _SPLIT = range(7)


class DataMetricsHook(StepAnchoredAction):
    """Reports data throughput, padding, mixture shares, batch size and wait time.

    Args:
      writer: Where the scalars go (a jax-loop-utils `MetricWriter`).
      iterator: The train `PlannedDataIterator`.
      every_steps: Report when the step is a multiple of this.
      on_steps: Also report at these steps.
      prefix: Prefix of the scalar names.
      start_step: Steps already done when the loop starts; the first
        interval runs from construction (so it includes compilation).
    """

    def __init__(
        self,
        writer: MetricWriter,
        iterator: Any,
        *,
        every_steps: int,
        on_steps: Iterable[int] | None = None,
        prefix: str = "data/",
        start_step: int = 0,
    ):
        super().__init__(every_steps=every_steps, on_steps=on_steps, start_step=start_step)
        self.writer = writer
        self.iterator = iterator
        self.prefix = prefix
        self._last_local = iterator.data_counters.as_vector()
        self._last_time = self._previous_time
        #: The scalars of the latest report (also written to `writer`).
        self.latest: dict[str, float] = {}
        self._losses: SourceLossMeter | None = None

    def record_loss(self, token_loss: jax.Array, source_ids: jax.Array) -> None:
        """Adds a step's per-token loss to the next report's `loss/<dataset>`.

        Call it every step, on every process, with the train step's per-token
        loss (any value on padding) and the batch's `source_ids`. Nothing is
        read back from the device until the report.
        """
        if self._losses is None:
            self._losses = SourceLossMeter(self.iterator.source_names, self.iterator.global_mesh)
        self._losses.add(token_loss, source_ids)

    def _over_hosts(self, *vectors: np.ndarray) -> list[np.ndarray]:
        """Each vector summed over data hosts, wait maxed over processes (a collective)."""
        if jax.process_count() == 1:
            return list(vectors)
        row = np.concatenate([[float(self.iterator.layout.host_index)], *vectors])
        # Sent as uint32 pairs so float64 counts survive without jax x64.
        table = np.asarray(multihost_utils.process_allgather(row.view(np.uint32)))
        table = table.reshape(jax.process_count(), -1).view(np.float64)
        _, first_of_host = np.unique(table[:, 0], return_index=True)
        out, offset = [], 1
        for vector in vectors:
            block = table[:, offset : offset + vector.size]
            combined = block[first_of_host].sum(axis=0)
            combined[_WAIT] = block[:, _WAIT].max()
            out.append(combined)
            offset += vector.size
        return out

    def tokens_seen(self) -> int:
        """Tokens handed out so far, over all data hosts (a collective: call it everywhere)."""
        (totals,) = self._over_hosts(self.iterator.data_counters.as_vector())
        return int(totals[_TOKENS])

    def _apply(self, step: int, t: float) -> None:
        local = self.iterator.data_counters.as_vector()
        delta, totals = self._over_hosts(local - self._last_local, local)
        elapsed = max(t - self._last_time, 1e-9)
        self._last_local, self._last_time = local, t
        tokens, slots = delta[_TOKENS], delta[_SLOTS]
        scalars = {
            "tokens_per_sec": tokens / elapsed,
            "examples_per_sec": delta[_ROWS] / elapsed,
            "padding_fraction": 1.0 - tokens / slots if slots else 0.0,
            "wait_fraction": min(delta[_WAIT] / elapsed, 1.0),
            "wait_secs_per_step": delta[_WAIT] / max(delta[_BATCHES], 1.0),
            "tokens_seen": totals[_TOKENS],
        }
        scalars["batch_size"] = self.iterator.last_batch_size()
        names = self.iterator.component_names or ("all",)
        for name, component_tokens in zip(names, delta[_SPLIT + 1 :], strict=False):
            scalars[f"share/{name}"] = component_tokens / tokens if tokens else 0.0
        # The plan's stage and planned shares, next to the served ones.
        last = max(self.iterator.step_counter - 1, 0)
        stage, planned = self.iterator.mixture_stage_at(last)
        scalars["mixture_stage"] = stage
        for name, share in planned.items():
            scalars[f"planned_share/{name}"] = share
        scalars["data_step"] = self.iterator.data_step_at(last)
        totals = None if self._losses is None else self._losses.take()
        if totals is not None:
            for name, loss in zip(self._losses.names, mean_losses(totals), strict=True):
                if np.isfinite(loss):
                    scalars[f"loss/{name}"] = loss
        if delta[_DOCUMENTS]:
            scalars["split_documents"] = delta[_SPLIT]
            # The share of row pieces that continue a document from an earlier
            # row: in [0, 1] however many rows a long document spans.
            scalars["split_fraction"] = delta[_SPLIT] / (delta[_DOCUMENTS] + delta[_SPLIT])
        self.latest = {k: float(v) for k, v in scalars.items()}
        self.writer.write_scalars(step, {self.prefix + k: v for k, v in self.latest.items()})
