"""The `xlstm-data` command line, run as a real process: help, prepare, inspect, bench.

Each test runs the installed console script (or `python -m xlstm_data.cli.main`
where it is missing) with a timeout, on a small synthetic config, so what is
checked is what a user typing the command gets.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_SCRIPT = Path(sys.executable).parent / "xlstm-data"
XLSTM_DATA = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "xlstm_data.cli.main"]

CONFIG = """
from ml_collections import config_dict


def get_config():
    config = config_dict.ConfigDict()
    config.num_train_steps = 20
    config.data = config_dict.ConfigDict(
        {
            "train": {
                "web": {"kind": "synthetic", "num_documents": 300, "mean_length": 40.0,
                        "weight": 0.75},
                "code": {"kind": "synthetic", "num_documents": 300, "seed": 1, "weight": 0.25},
            },
            "global_batch_size": 8,
            "max_target_length": 64,
        }
    )
    return config
"""


def run(args: list[str], cwd: Path, timeout: float = 180, **env: str):
    return subprocess.run(
        args,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "JAX_PLATFORMS": "cpu", **env},
    )


def xlstm_data(*args: str, cwd: Path, timeout: float = 180, **env: str):
    return run([*XLSTM_DATA, *args], cwd, timeout, **env)


@pytest.fixture
def config(tmp_path) -> Path:
    path = tmp_path / "small.py"
    path.write_text(CONFIG)
    return path


# ----------------------------------------------------------------------------
# Dispatch and prepare.
# ----------------------------------------------------------------------------


def test_top_level_help_and_unknown_command(tmp_path):
    result = xlstm_data("--help", cwd=tmp_path)
    assert result.returncode == 0
    for name in ("prepare", "index", "inspect", "bench"):
        assert f"  {name} " in result.stdout
    result = xlstm_data("prepair", cwd=tmp_path)
    assert result.returncode == 2
    valid = "['prepare', 'index', 'inspect', 'batch', 'bench']"
    assert f"unknown command 'prepair'; valid: {valid}" in result.stderr


def test_prepare_help_shows_every_flag_with_its_default(tmp_path):
    result = xlstm_data("prepare", "--help", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())  # undo the wrapping
    assert "usage: xlstm-data prepare INPUT... --output=DIR" in text
    assert "--output: output directory or URI (required)" in text
    expected = {
        "format": "'auto'",
        "field": "'text'",
        "unit": "'line'",
        "tokenizer": "'byte'",
        "workers": "'1'",
    }
    for name, default in expected.items():
        entry = text.split(f"--{name}:", 1)[1].split(" --", 1)[0]
        assert f"(default: {default})" in entry, (name, entry)


def test_prepare_runs_with_either_flag_syntax(tmp_path):
    (tmp_path / "a.txt").write_text("first document\nsecond one\n")
    (tmp_path / "b.txt").write_text("third\n")
    result = xlstm_data(
        "prepare", "a.txt", "--output", "out", "b.txt", "--workers=2", "--unit=line", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert "prepared 3 documents" in result.stdout
    # stderr is a pipe here, not a terminal: plain lines, no carriage returns.
    assert "shards: 2/2\n" in result.stderr and "\r" not in result.stderr
    assert json.loads((tmp_path / "out" / "index.json").read_text())["documents"] == 3


def test_prepare_vocab_size_admits_token_ids_beyond_the_tokenizer(tmp_path):
    import numpy as np

    np.save(tmp_path / "ids.npy", np.arange(600, dtype=np.int32).reshape(3, 200))
    refused = xlstm_data("prepare", "ids.npy", "--output=out", cwd=tmp_path)
    assert refused.returncode != 0
    assert "vocab_size" in refused.stderr
    result = xlstm_data("prepare", "ids.npy", "--output=out", "--vocab_size=1024", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "out" / "index.json").read_text())["vocab_size"] == 1024


def test_prepare_errors_name_the_argument(tmp_path):
    result = xlstm_data("prepare", "a.txt", "--wrokers=2", "--output=o", cwd=tmp_path)
    assert result.returncode == 2
    assert "unknown flag --wrokers=2; valid flags:" in result.stderr
    assert "--workers" in result.stderr


# ----------------------------------------------------------------------------
# inspect: config_flags overrides, as for `python -m trainer_hooks.train`.
# ----------------------------------------------------------------------------


@pytest.mark.parametrize(("override", "batch"), [(None, 8), ("32", 32)])
def test_inspect_override_changes_the_plan(tmp_path, config, override, batch):
    args = ["inspect", f"--config={config}", "--png=plan.png", "--steps=2"]
    if override:
        args.append(f"--config.data.global_batch_size={override}")
    result = xlstm_data(*args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    stage = [line for line in result.stdout.splitlines() if "global batch" in line]
    assert len(stage) == 1 and f"global batch {batch:>5} ({batch} per host)" in stage[0]
    assert f"{batch * 64:,} token slots per step" in stage[0]
    assert (tmp_path / "plan.png").read_bytes().startswith(b"\x89PNG")


def test_inspect_refuses_an_unknown_override_key(tmp_path, config):
    result = xlstm_data(
        "inspect", f"--config={config}", "--config.data.global_batch_sise=32", cwd=tmp_path
    )
    assert result.returncode == 2
    assert result.stdout == ""
    first = result.stderr.strip().splitlines()[0]
    assert first.startswith(
        "xlstm-data inspect: error: data has unknown keys ['global_batch_sise']; valid keys: ["
    )
    assert "'global_batch_size'" in first and "'train'" in first
    result = xlstm_data("inspect", f"--config={config}", "--config.dta.x=1", cwd=tmp_path)
    assert result.returncode == 2
    assert "dta" in result.stderr and 'Did you mean "data"' in result.stderr
    result = xlstm_data("inspect", f"--config={config}", "--config.num_steps=1", cwd=tmp_path)
    assert result.returncode == 2
    assert "config key num_steps is unknown; valid keys here:" in result.stderr


def test_inspect_bad_override_value_and_missing_config(tmp_path, config):
    result = xlstm_data(
        "inspect", f"--config={config}", "--config.data.global_batch_size=many", cwd=tmp_path
    )
    assert result.returncode == 2
    assert "--config.data.global_batch_size=many" in result.stderr
    result = xlstm_data("inspect", "--config=nothing.py", cwd=tmp_path)
    assert result.returncode == 2
    assert "--config='nothing.py' is not a file" in result.stderr
    # Loaded from Python (not through a command line): the same one message.
    from xlstm_data.config.overrides import config_file_error, load_config
    from xlstm_data.errors import DataConfigError

    missing = str(tmp_path / "nothing.py") + ":/data/web,50256"
    with pytest.raises(DataConfigError) as raised:
        load_config(missing)
    assert str(raised.value) == config_file_error([f"--config={missing}"])
    assert str(raised.value).startswith(f"--config={missing!r} is not a file")


# ----------------------------------------------------------------------------
# bench
# ----------------------------------------------------------------------------


def test_bench_tiny_through_the_console_script(tmp_path):
    out = tmp_path / "results"
    result = xlstm_data(
        "bench",
        "resume",
        "--tiny",
        "--out",
        str(out),
        cwd=tmp_path,
        timeout=300,
        XLSTM_DATA_BENCH_CACHE=str(tmp_path / "cache"),
    )
    assert result.returncode == 0, result.stderr
    saved = json.loads((out / "resume.json").read_text())
    assert saved["mode"] == "tiny" and saved["command"].endswith(f"resume --tiny --out {out}")
    assert (out / "resume.png").exists()
    assert "resume at step" in result.stdout  # the summary table


def test_bench_config_measures_the_pipeline_the_same_from_both_entry_points(tmp_path, config):
    args = [f"--config={config}", "--config.data.global_batch_size=16", "--tiny", "--steps=10"]
    results = {}
    for name, command in {
        "console": [*XLSTM_DATA, "bench"],
        "module": [sys.executable, "-m", "bench.run"],
    }.items():
        out = tmp_path / name
        # bench.run is found from the repository root, as `python -m bench.run` is used.
        result = run([*command, *args, f"--out={out}"], ROOT)
        assert result.returncode == 0, result.stderr
        assert "tokens/s (non-padding)" in result.stdout and "loop wait" in result.stdout
        results[name] = json.loads((out / "pipeline_small.json").read_text())
    for saved in results.values():
        assert saved["benchmark"] == "pipeline_small"
        assert saved["met"] is None and saved["targets"] == []
        assert saved["settings"]["overrides"] == {"data.global_batch_size": 16}
        assert saved["settings"]["steps"] == 10 and saved["settings"]["rounds"] == 5
        for key in ("tokens_per_sec", "batches_per_sec", "examples_per_sec"):
            assert all(v > 0 for v in saved[key]["values"])
        # 16 rows a batch: the override reached the pipeline.
        assert sum(r["rows"] for r in saved["rounds"]) == 16 * 10
        assert 0 <= saved["wait_share"]["median"] <= 1
        assert 0 <= saved["padding_fraction"] < 0.2
        assert sum(saved["component_share"].values()) == pytest.approx(1.0)
    assert results["console"]["settings"] == results["module"]["settings"]


def test_bench_refuses_unknown_names_and_override_keys(tmp_path, config):
    result = xlstm_data("bench", "thruput", "--tiny", cwd=tmp_path)
    assert result.returncode == 2
    assert "unknown benchmark(s) ['thruput']; choose from ['throughput'," in result.stderr
    result = xlstm_data("bench", f"--config={config}", "--config.data.nokey=1", cwd=tmp_path)
    assert result.returncode == 2
    assert "data has unknown keys ['nokey']" in result.stderr


def test_console_script_is_installed():
    # The tests above fall back to `python -m xlstm_data.cli.main`; the README uses the script.
    assert _SCRIPT.exists() or shutil.which("xlstm-data"), "pip install -e . installs xlstm-data"
