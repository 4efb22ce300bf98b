"""Config schema: JSON and flag round trips, the shipped configs, and every bad value."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import ml_collections
import numpy as np
import pytest

import xlstm_data as xd
from xlstm_data.config.data_config import validate_data_config
from xlstm_data.from_config import iterators_from_config

CONFIGS = Path(__file__).resolve().parent.parent / "configs"


def load_config(name: str) -> ml_collections.ConfigDict:
    spec = importlib.util.spec_from_file_location(name, CONFIGS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


def small_config() -> ml_collections.ConfigDict:
    config = load_config("mixture_rampup")
    for spec in config.data.train.values():
        spec.num_documents = 300
    config.data.global_batch_size = 8
    config.data.max_target_length = 32
    config.data.packing = "first_fit"
    config.data.rampup = [[0, 0.5], [4, 1.0]]
    return config


@pytest.mark.parametrize("name", ["demo", "mixture_rampup", "multihost"])
def test_shipped_configs_validate_and_survive_json(name):
    config = load_config(name)
    validated = validate_data_config(config.data)
    restored = ml_collections.ConfigDict(json.loads(config.to_json()))
    assert validate_data_config(restored.data) == validated
    assert validate_data_config(config) == validated  # whole config works too


def test_rampup_survives_json_in_every_form():
    config = small_config()
    for form in ({"0": 0.5, "4": 1.0}, {0: 0.5, 4: 1.0}, [[0, 0.5], [4, 1.0]]):
        data = config.data.to_dict()
        data["rampup"] = json.loads(json.dumps(form))
        assert validate_data_config(data).rampup == validate_data_config(config.data).rampup


_FLAGS_SCRIPT = """
import json, sys
from absl import flags
from ml_collections import config_flags
from xlstm_data.config.data_config import validate_data_config

config_flags.DEFINE_config_file("config")
flags.FLAGS(sys.argv)
print(json.dumps(validate_data_config(flags.FLAGS.config.data).to_json_dict()))
"""


def _run_with_flags(*overrides: str):
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-c", _FLAGS_SCRIPT, f"--config={CONFIGS / 'demo.py'}", *overrides],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_config_flags_overrides():
    overrides = (
        "--config.data.global_batch_size=64",
        "--config.data.train.code.weight=0.5",
        "--config.data.eval_global_batch_size=8",
    )
    out = _run_with_flags(*overrides, "--config.data.num_epochs=2")
    assert out.returncode != 0 and "data.num_epochs=2 cannot bound a mixture" in out.stderr
    out = _run_with_flags(*overrides)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout.strip().splitlines()[-1])
    assert data["global_batch_size"] == 64 and data["eval_global_batch_size"] == 8
    assert data["train"]["code"]["weight"] == 0.5


def _with(config, path: str, value):
    data = config.data.to_dict()
    node = data
    *parents, last = path.split(".")
    for key in parents:
        node = node[key]
    if value is _DELETE:
        del node[last]
    else:
        node[last] = value
    return data


_DELETE = object()


@pytest.mark.parametrize(
    "path,value,match",
    [
        ("train.web.weight", -1.0, r"data.train.web.weight=-1.0"),
        ("train.web.weight", "heavy", r"data.train.web.weight='heavy'"),
        ("train.web.kind", "parquet", r"data.train.web.kind='parquet' is not a known source kind"),
        ("train.web.num_documents", _DELETE, r"data.train.web.num_documents is missing"),
        ("train.web.colour", "red", r"data.train.web has unknown keys \['colour'\]"),
        ("rampup", [[0, 0.5], [-3, 1.0]], r"data.rampup"),
        ("rampup", [[0, 0.5], [4, 0.0]], r"data.rampup"),
        ("rampup", [[0, 0.5], [4, float("inf")]], r"data.rampup"),
        ("rampup", {"0": 0.5, "4": 1.0, "04": 0.75}, r"data.rampup"),
        ("rampup", [[5, 1.0]], r"data.rampup"),
        ("max_target_length", 1, r"data.max_target_length=1"),
        ("global_batch_size", 0, r"data.global_batch_size=0"),
        ("global_batch_sise", 8, r"data has unknown keys \['global_batch_sise'\]"),
        ("num_epochs", 2, r"data.num_epochs=2 cannot bound a mixture"),
        ("packing", "yes", r"data.packing='yes'"),
        ("read_threads", -1, r"data.read_threads=-1"),
        ("read_threads", 1.5, r"data.read_threads=1.5"),
        ("read_buffer_size", 64, r"data.read_buffer_size is no longer a data key.*read_threads"),
        ("packing_bin_count", 8, r"data.packing_bin_count is no longer a data key.*best_fit"),
        ("mixture_unit", "bytes", r"data.mixture_unit='bytes'"),
        ("logical_streams", 8, r"data.logical_streams=8: the plan has no logical streams"),
        ("block_documents", 0, r"data.block_documents=0"),
        ("mixture_schedule", [[0, {"web": -1.0}]], r"data.mixture_schedule"),
        ("mixture_schedule", [[0, {"forum": 1.0}]], r"data.mixture_schedule"),
    ],
)
def test_bad_values_name_their_key(path, value, match):
    with pytest.raises(xd.DataConfigError, match=match):
        validate_data_config(_with(small_config(), path, value))


def test_all_weights_zero():
    data = small_config().data.to_dict()
    for spec in data["train"].values():
        spec["weight"] = 0.0
    with pytest.raises(xd.DataConfigError, match="all weights are zero"):
        validate_data_config(data)


def test_missing_path_and_eval_name_collision(tmp_path):
    data = small_config().data.to_dict()
    data["train"]["files"] = {"kind": "jsonl", "path": str(tmp_path / "none*.jsonl")}
    with pytest.raises(xd.DataConfigError, match=r"data.train.files.path=.*matches no file"):
        validate_data_config(data)
    data = small_config().data.to_dict()
    data["eval"]["web"] = {"kind": "synthetic", "num_documents": 4}
    with pytest.raises(xd.DataConfigError, match=r"data.eval names \['web'\] collide"):
        validate_data_config(data)


def test_stage_that_does_not_divide_over_the_mesh_is_rejected_before_reading():
    data = small_config().data.to_dict()
    data["rampup"] = [[0, 0.25], [4, 1.0]]  # 8 * 0.25 = 2 rows over 4 data-parallel devices
    # The planned path names the stage batches and the data-parallel sizes that work.
    with pytest.raises(
        xd.DataConfigError,
        match=r"data.rampup: stage at step 0 has factor 0.25.* = 2, which is not divisible by "
        r"this mesh's data-parallel size 4.*\(\[2, 8\]\) divides over data-parallel sizes \[1, 2\]",
    ):
        iterators_from_config(data, xd.create_mesh())


def test_unknown_dataset_weight_in_the_factory():
    mesh = xd.create_mesh()
    rows = xd.make_grain_llm_dataset(0, 1, [{"tokens": np.arange(5)}], 4, 8, True, 0)
    with pytest.raises(xd.DataConfigError, match=r"unknown datasets \['b'\]"):
        xd.make_grain_multihost_iterator({"a": rows}, None, mesh, 4, dataset_weights={"b": 1.0})
    with pytest.raises(xd.DataConfigError, match=r"dataset_weights\[.a.\]=-1.0 is invalid"):
        xd.make_grain_multihost_iterator({"a": rows}, None, mesh, 4, dataset_weights={"a": -1})


def test_paths_accept_what_the_sources_accept(tmp_path, monkeypatch):
    nested = tmp_path / "corpus" / "2024" / "part-0.txt"
    nested.parent.mkdir(parents=True)
    nested.write_text("one document\n")
    monkeypatch.setenv("HOME", str(tmp_path))
    for path in ("~/corpus/**/*.txt", str(tmp_path / "corpus" / "**" / "*.txt")):
        config = {
            "train": {"web": {"kind": "text", "path": path}},
            "global_batch_size": 4,
            "max_target_length": 16,
        }
        (spec,) = validate_data_config(config).train
        assert len(spec.build()) == 1
    config["train"]["web"]["path"] = "~/corpus/*.txt"  # `*` does not recurse
    with pytest.raises(xd.DataConfigError, match=r"data.train.web.path='~/corpus/\*.txt'"):
        validate_data_config(config)
