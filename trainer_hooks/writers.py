"""Metric writers for the training loop: a TensorBoard writer and a factory by name.

jax-loop-utils' TensorBoard writers need TensorFlow (`metric_writers.tf`) or
torch (`metric_writers.torch`), which this project does not install (a
training loop on JAX should not pull in either). tensorboardX writes the same
event files with only protobuf, so `TensorBoardWriter` wraps it behind the
`MetricWriter` interface. `make_writer` is the one place that turns a
`--writer` value into the writers a run uses, so a run, a notebook and the
tests get the same files.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
from absl import logging
from etils import epath
from jax_loop_utils.metric_writers import LoggingWriter, MultiWriter
from jax_loop_utils.metric_writers.interface import MetricWriter

from trainer_hooks.jsonl_writer import JsonlWriter
from xlstm_data.errors import DataConfigError

#: `--writer` values accepted by `make_writer`.
WRITER_KINDS = ("jsonl", "tensorboard")
#: File and directory names inside the workdir.
METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"


class TensorBoardWriter(MetricWriter):
    """Writes TensorBoard event files with tensorboardX (no TensorFlow, no torch).

    Events are written synchronously and flushed after every call, like
    `JsonlWriter`: tensorboardX's `SummaryWriter` queues events for a
    background thread and its `flush()` does not wait for the queue, so a
    `flush()` before reading (or a SIGKILL) could miss the latest values.
    Scalars, texts, histograms, images and hparams are written; audio and
    video need extra packages (soundfile, moviepy) and are skipped with a
    warning.

    Args:
      logdir: Directory of the event files (created if missing). Each writer
        opens its own file (named with the process id and a random part, so a
        resumed run in the same second does not overwrite the last one).
    """

    def __init__(self, logdir: epath.PathLike):
        # Imported here: only runs that ask for TensorBoard need tensorboardX.
        from tensorboardX import summary
        from tensorboardX.event_file_writer import EventsWriter
        from tensorboardX.proto.event_pb2 import Event

        self._summary = summary
        self._event = Event
        self.logdir = epath.Path(logdir)
        self.logdir.mkdir(parents=True, exist_ok=True)
        suffix = f".{os.getpid()}.{uuid.uuid4().hex[:8]}"
        self._events = EventsWriter(os.fspath(self.logdir / "events"), filename_suffix=suffix)

    def _write(self, step: int, summaries: Iterable[Any]) -> None:
        now = time.time()
        for summary in summaries:
            self._events.write_event(self._event(wall_time=now, step=int(step), summary=summary))
        self._events.flush()

    def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
        self._write(step, [self._summary.scalar(tag, np.asarray(v)) for tag, v in scalars.items()])

    def write_texts(self, step: int, texts: Mapping[str, str]) -> None:
        self._write(step, [self._summary.text(tag, text) for tag, text in texts.items()])

    def write_histograms(
        self,
        step: int,
        arrays: Mapping[str, Any],
        num_buckets: Mapping[str, int] | None = None,
    ) -> None:
        buckets = num_buckets or {}
        self._write(
            step,
            [
                self._summary.histogram(tag, np.asarray(values), bins=buckets.get(tag) or "auto")
                for tag, values in arrays.items()
            ],
        )

    def write_images(self, step: int, images: Mapping[str, Any]) -> None:
        summaries = []
        for tag, image in images.items():
            image = np.asarray(image)
            layout = "NHWC" if image.ndim == 4 else "HWC"
            summaries.append(self._summary.image(tag, image, dataformats=layout))
        self._write(step, summaries)

    def write_videos(self, step: int, videos: Mapping[str, Any]) -> None:
        del step
        if videos:
            logging.log_first_n(
                logging.WARNING,
                "TensorBoardWriter skips videos %s (needs moviepy)",
                1,
                list(videos),
            )

    def write_audios(self, step: int, audios: Mapping[str, Any], *, sample_rate: int) -> None:
        del step, sample_rate
        if audios:
            logging.log_first_n(
                logging.WARNING,
                "TensorBoardWriter skips audios %s (needs soundfile)",
                1,
                list(audios),
            )

    def write_hparams(self, hparams: Mapping[str, Any]) -> None:
        # The hparams plugin takes bool/str/int/float; other values are shown as text.
        flat = {
            key: value if isinstance(value, bool | str | int | float) else str(value)
            for key, value in _flatten(hparams).items()
        }
        self._write(0, self._summary.hparams(flat, {}))

    def flush(self) -> None:
        self._events.flush()

    def close(self) -> None:
        self._events.close()


def _flatten(values: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, Mapping):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def make_writer(kind: str, workdir: epath.PathLike, *, primary: bool) -> MetricWriter:
    """The metric writers of a run, by the `--writer` name.

    Every kind keeps `WORKDIR/metrics.jsonl` (tests, `inspect` and notebooks
    read it) and logs each write; "tensorboard" also writes event files to
    `WORKDIR/tensorboard`. Only the primary process writes: the others get
    an empty `MultiWriter`, so every process can call the same hooks.

    Args:
      kind: One of `WRITER_KINDS` ("jsonl", "tensorboard").
      workdir: The run's work directory.
      primary: Whether this process writes (process 0).

    Returns:
      A `MetricWriter` (a `MultiWriter` of the writers above).

    Raises:
      DataConfigError: `kind` is not one of `WRITER_KINDS` (checked on every
        process, so a typo fails everywhere, not only on process 0).
    """
    if kind not in WRITER_KINDS:
        raise DataConfigError(f"--writer={kind!r} is not a writer; valid: {list(WRITER_KINDS)}")
    if not primary:
        return MultiWriter([])
    workdir = epath.Path(workdir)
    writers: list[MetricWriter] = [JsonlWriter(workdir / METRICS_FILE), LoggingWriter()]
    if kind == "tensorboard":
        writers.insert(0, TensorBoardWriter(workdir / TENSORBOARD_DIR))
    return MultiWriter(writers)
