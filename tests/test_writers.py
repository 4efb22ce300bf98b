"""`trainer_hooks.writers`: TensorBoard event files without TensorFlow, and `make_writer`.

Event files are read back by parsing their TFRecord framing and the Event
protos that tensorboardX ships, so the test needs neither TensorFlow nor the
tensorboard package.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from jax_loop_utils.metric_writers import MultiWriter
from tensorboardX.crc32c import crc32c
from tensorboardX.proto import event_pb2

import xlstm_data as xd
from trainer_hooks import DataMetricsHook
from trainer_hooks.writers import TensorBoardWriter, make_writer
from xlstm_data.errors import DataConfigError


def _masked_crc(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def read_events(logdir: Path) -> list[event_pb2.Event]:
    """Every event of every event file under `logdir` (checksums verified)."""
    events = []
    for path in sorted(logdir.rglob("events.out.tfevents.*")):
        data = path.read_bytes()
        offset = 0
        while offset < len(data):
            header = data[offset : offset + 8]
            (length,) = struct.unpack("<Q", header)
            (header_crc,) = struct.unpack("<I", data[offset + 8 : offset + 12])
            assert header_crc == _masked_crc(header), f"corrupt length in {path}"
            body = data[offset + 12 : offset + 12 + length]
            (body_crc,) = struct.unpack("<I", data[offset + 12 + length : offset + 16 + length])
            assert body_crc == _masked_crc(body), f"corrupt record in {path}"
            events.append(event_pb2.Event.FromString(body))
            offset += 16 + length
    return events


def scalars(logdir: Path) -> dict[str, dict[int, float]]:
    """`{tag: {step: value}}` of the scalar summaries under `logdir`."""
    found: dict[str, dict[int, float]] = {}
    for event in read_events(logdir):
        for value in event.summary.value:
            if value.WhichOneof("value") == "simple_value":
                found.setdefault(value.tag, {})[event.step] = value.simple_value
    return found


def test_tensorboard_writer_round_trips_every_kind_it_writes(tmp_path):
    writer = TensorBoardWriter(tmp_path / "tb")
    writer.write_scalars(3, {"train/loss": np.float32(2.5), "data/share/web": 0.75})
    writer.write_scalars(6, {"train/loss": 1.25})
    writer.write_texts(6, {"note": "hello"})
    writer.write_histograms(6, {"weights": np.arange(100.0)}, num_buckets={"weights": 10})
    writer.write_images(6, {"samples": np.random.default_rng(0).random((2, 4, 4, 3))})
    writer.write_hparams({"lr": 0.01, "model": {"layers": 2}, "mesh": (1, -1)})
    writer.close()

    assert scalars(tmp_path / "tb") == {
        "train/loss": {3: 2.5, 6: 1.25},
        "data/share/web": {3: 0.75},
    }
    events = read_events(tmp_path / "tb")
    kinds = {(v.tag, v.WhichOneof("value")) for e in events for v in e.summary.value}
    assert ("note/text_summary", "tensor") in kinds
    assert ("weights", "histo") in kinds
    assert ("samples", "image") in kinds
    hparams = [
        v for e in events for v in e.summary.value if v.tag == "_hparams_/session_start_info"
    ]
    assert hparams, "hparams were not written"


def test_data_metrics_hook_shares_land_in_tensorboard_and_jsonl(tmp_path):
    config = {
        "train": {
            "web": {"kind": "synthetic", "num_documents": 200, "mean_length": 20.0, "weight": 0.8},
            "code": {"kind": "synthetic", "num_documents": 200, "seed": 1, "weight": 0.2},
        },
        "global_batch_size": 8,
        "max_target_length": 32,
    }
    train_iter, _ = xd.iterators_from_config(config, xd.create_mesh("dp:1,fsdp:-1,tp:1,sp:1"))
    writer = make_writer("tensorboard", tmp_path, primary=True)
    hook = DataMetricsHook(writer, train_iter, every_steps=2)
    for step in range(1, 5):
        next(train_iter)
        hook(step)
    writer.flush()
    train_iter.close()

    written = scalars(tmp_path / "tensorboard")
    for name in ("web", "code"):
        shares = written[f"data/share/{name}"]
        assert set(shares) == {2, 4}
        assert shares[4] == pytest.approx(hook.latest[f"share/{name}"], rel=1e-6)
    assert written["data/share/web"][4] + written["data/share/code"][4] == pytest.approx(1.0)
    # The JSON-lines file is still written next to the event files.
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [2, 4]
    assert lines[-1]["data/share/web"] == pytest.approx(written["data/share/web"][4], rel=1e-6)
    writer.close()


def test_jsonl_kind_writes_no_event_files(tmp_path):
    writer = make_writer("jsonl", tmp_path, primary=True)
    writer.write_scalars(1, {"train/loss": 3.0})
    writer.close()
    assert json.loads((tmp_path / "metrics.jsonl").read_text())["train/loss"] == 3.0
    assert not (tmp_path / "tensorboard").exists()


@pytest.mark.parametrize("kind", ["jsonl", "tensorboard"])
def test_non_primary_processes_write_nothing(tmp_path, kind):
    writer = make_writer(kind, tmp_path, primary=False)
    assert isinstance(writer, MultiWriter)
    writer.write_scalars(1, {"train/loss": 3.0})
    writer.close()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("primary", [True, False])
def test_unknown_kind_names_the_flag_the_value_and_the_choices(tmp_path, primary):
    with pytest.raises(DataConfigError) as error:
        make_writer("tb", tmp_path, primary=primary)
    assert str(error.value) == "--writer='tb' is not a writer; valid: ['jsonl', 'tensorboard']"


def test_jsonl_writer_takes_a_config_dict_as_hparams(tmp_path):
    import json

    from trainer_hooks.config import default_config
    from trainer_hooks.jsonl_writer import JsonlWriter

    config = default_config()
    config.data.train = {"web": {"kind": "synthetic", "weight": 0.5}}
    path = tmp_path / "metrics.jsonl"
    writer = JsonlWriter(path)
    writer.write_hparams(config)
    writer.flush()
    (record,) = [json.loads(line) for line in path.read_text().splitlines()]
    hparams = record["hparams"]
    assert hparams["model"]["d_model"] == 32 and hparams["checkpoint"]["max_to_keep"] == 2
    assert hparams["data"]["train"]["web"]["weight"] == 0.5
