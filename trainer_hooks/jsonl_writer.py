"""A metric writer that appends one JSON line per write, without TensorFlow.

jax-loop-utils has no TensorFlow-free summary writer that leaves a file
behind; a JSON-lines file is easy to read back in tests, notebooks and the
`inspect`/bench tools, and survives a SIGKILL up to the last flushed line.
Every run writes one, TensorBoard or not (`trainer_hooks.writers.make_writer`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
from etils import epath
from jax_loop_utils.metric_writers.interface import MetricWriter


class JsonlWriter(MetricWriter):
    """Appends `{"step": .., "time": .., name: value, ...}` lines to `path`."""

    def __init__(self, path: epath.PathLike):
        self.path = epath.Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a")

    def _write(self, step: int, values: Mapping[str, Any]) -> None:
        record = {"step": int(step), "time": time.time()}
        record.update({k: _plain(v) for k, v in values.items()})
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
        self._write(step, scalars)

    def write_texts(self, step: int, texts: Mapping[str, str]) -> None:
        self._write(step, texts)

    def write_hparams(self, hparams: Mapping[str, Any]) -> None:
        """Writes the hyper-parameters (a dict or an `ml_collections.ConfigDict`, nested)."""
        self._write(0, {"hparams": _plain(hparams)})

    def write_images(self, step: int, images: Mapping[str, Any]) -> None:
        del step, images  # not representable as a line; ignored

    def write_videos(self, step: int, videos: Mapping[str, Any]) -> None:
        del step, videos

    def write_audios(self, step: int, audios: Mapping[str, Any], *, sample_rate: int) -> None:
        del step, audios, sample_rate

    def write_histograms(self, step: int, arrays: Mapping[str, Any], num_buckets: Any = None):
        del step, arrays, num_buckets

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def _plain(value: Any) -> Any:
    """JSON-able: arrays as numbers or lists, config sections and mappings as dicts."""
    if hasattr(value, "to_dict") and not hasattr(
        value, "__array__"
    ):  # ConfigDict, FrozenConfigDict
        value = value.to_dict()
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, np.ndarray | np.generic) or hasattr(value, "__array__"):
        array = np.asarray(value)
        return array.item() if array.size == 1 else array.tolist()
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return repr(value)
