"""Every file in configs/ trains through `python -m trainer_hooks.train`, as users run it.

Users run the shipped configs on hosts with 8 devices, override keys the
config file does not set, and launch the multi-host config on several real
processes; each of those is a subprocess here, so a new config or a broken
override cannot ship.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import MEGATRON_FIXTURES, shipped_config_argv
from tests.multiprocess import REPO, run_train

CONFIGS = sorted((REPO / "configs").glob("*.py"))


def train(workdir: Path, config: Path, *flags: str, expect: int = 0) -> str:
    """Runs train on `config` in `workdir`; its stdout (stderr when a failure is expected)."""
    result = run_train(f"--config={config}", f"--workdir={workdir}", *flags, expect=expect)
    return result.stderr if expect else result.stdout


def batch_log(workdir: Path) -> list[dict]:
    return [json.loads(line) for line in (workdir / "batches.jsonl").read_text().splitlines()]


def test_configs_are_found():
    assert {c.name for c in CONFIGS} >= {
        "demo.py",
        "mixture_rampup.py",
        "multihost.py",
        "prepared.py",
        "megatron.py",
    }


@pytest.mark.parametrize(
    "config", [c for c in CONFIGS if c.name != "multihost.py"], ids=lambda path: path.stem
)
def test_every_config_trains_on_an_8_device_host(tmp_path, config):
    """configs/multihost.py trains on 8 devices in the override test below."""
    config, small = shipped_config_argv(config, tmp_path)
    out = train(tmp_path / "run", config, "--config.num_train_steps=3", "--cpu_devices=8", *small)
    assert "final_step: 3" in out
    assert [row["step"] for row in batch_log(tmp_path / "run")] == [1, 2, 3]


def test_keys_the_config_does_not_set_can_be_overridden(tmp_path):
    # configs/multihost.py sets none of these keys; the rampup is a list here (a dict below).
    # It is also the 8-device run of multihost.py. Its multi-process runs: the README's
    # 4-process command (test_documented_commands); the README's one-machine flags
    # (2 processes x 2 devices) continue the demo in test_make_demo.
    out = train(
        tmp_path / "run",
        REPO / "configs" / "multihost.py",
        "--cpu_devices=8",
        "--config.num_train_steps=4",
        "--config.data.worker_count=2",
        "--config.data.read_threads=0",
        "--config.data.eod_token_id=1",
        "--config.data.rampup=[[0, 0.25], [2, 1.0]]",
        "--config.checkpoint.every_secs=600",
        "--config.checkpoint.max_to_keep=None",
        "--config.model.vocab_size=300",
        # A source option the file leaves out, and a typed key set back to unset.
        "--config.data.train.synthetic.mean_length=50.0",
        "--config.data.logical_streams=None",
        # The plan's keys, none of them in the file.
        "--config.data.packing=first_fit",
        "--config.data.block_documents=256",
        "--config.data.mixture_unit=documents",
        "--config.data.mixture_schedule=[[0, {'synthetic': 1.0}]]",
    )
    assert "final_step: 4" in out
    assert [row["batch_size"] for row in batch_log(tmp_path / "run")] == [4, 4, 16, 16]
    # The dict form of the ramp-up, through the same override parser (no second training run).
    from tests.test_cli import xlstm_data

    shown = xlstm_data(
        "inspect",
        f"--config={REPO / 'configs' / 'multihost.py'}",
        "--config.data.rampup={0: 0.5, 2: 1.0}",
        f"--png={tmp_path / 'plan.png'}",
        cwd=tmp_path,
    )
    assert shown.returncode == 0, shown.stderr[-3000:]
    stages = [line.split() for line in shown.stdout.splitlines() if "factor" in line]
    assert [(s[1], s[3], s[8]) for s in stages] == [("0", "2", "8"), ("2", "end", "16")]


def test_an_unknown_override_is_refused_by_name(tmp_path):
    error = train(tmp_path, REPO / "configs" / "demo.py", "--config.data.wroker_count=2", expect=1)
    assert "data has unknown keys ['wroker_count']; valid keys:" in error
    assert "worker_count" in error and "Traceback" not in error
    error = train(tmp_path, REPO / "configs" / "demo.py", "--config.num_train_step=2", expect=1)
    assert "config key num_train_step is unknown; valid keys here:" in error
    error = train(
        tmp_path, REPO / "configs" / "demo.py", "--config.chekpoint.every_steps=2", expect=2
    )
    assert "no section 'chekpoint'" in error and 'Did you mean "checkpoint"' in error
    assert "the config has sections: adaptive_mixture, checkpoint, data, mesh, model" in error
    error = train(
        tmp_path, REPO / "configs" / "demo.py", "--config.data.train.code.prat=code", expect=1
    )
    assert "data.train.code has unknown keys ['prat']" in error
    # A key of the streaming pipeline is named with what replaces it.
    error = train(
        tmp_path, REPO / "configs" / "demo.py", "--config.data.packing_bin_count=8", expect=1
    )
    assert "data.packing_bin_count is no longer a data key" in error
    assert "data.block_documents" in error and "Traceback" not in error


def test_train_writes_tensorboard_events_with_the_component_shares(tmp_path):
    from tests.test_writers import scalars

    train(
        tmp_path / "run",
        REPO / "tests" / "train_config.py",
        "--cpu_devices=2",
        "--config.num_train_steps=5",
        "--writer=tensorboard",
    )
    written = scalars(tmp_path / "run" / "tensorboard")
    assert {"data/share/long", "data/share/short", "train/loss"} <= set(written)
    assert 0.0 < written["data/share/long"][5] < 1.0
    assert (tmp_path / "run" / "metrics.jsonl").exists()


def test_a_mesh_without_dp_or_fsdp_trains_with_its_batch_axis_named(tmp_path):
    run = tmp_path / "run"
    out = train(
        run,
        REPO / "tests" / "train_config.py",
        "--cpu_devices=4",
        "--config.num_train_steps=2",
        "--config.mesh.axis_dims=data:-1",
        "--config.mesh.batch_axis_names=data",
    )
    assert "final_step: 2" in out
    error = train(
        tmp_path / "refused",
        REPO / "tests" / "train_config.py",
        "--cpu_devices=4",
        "--config.mesh.axis_dims=batch:-1",
        expect=1,
    )
    assert "batch_axis_names" in error


@pytest.mark.parametrize(
    ("argument", "expected"),
    [
        ("", "configs/megatron.py needs a Megatron corpus prefix after a colon"),
        (":/data/web_text_document,eod", "the end-of-document id after the comma must be"),
        ("", "configs/prepared.py needs the directory"),
    ],
)
def test_a_config_missing_its_argument_says_what_to_pass(tmp_path, argument, expected):
    name = "prepared.py" if "prepared" in expected else "megatron.py"
    error = train(tmp_path, f"{REPO / 'configs' / name}{argument}", expect=2)
    assert expected in error and "Traceback" not in error


def test_the_megatron_config_takes_a_corpus_without_a_stored_end_and_overrides(tmp_path):
    """Without `,EOD` the run's id comes from an override; the source option can be set too."""
    fixtures = MEGATRON_FIXTURES
    # The books corpus's 20 short documents fill 10 rows of 32 tokens an epoch.
    small = ["--config.data.global_batch_size=4", "--config.data.max_target_length=32"]
    steps = ["--config.num_train_steps=2", "--cpu_devices=2", *small]
    books = f"{REPO / 'configs' / 'megatron.py'}:{fixtures / 'books_text_document'}"
    error = train(tmp_path / "refused", books, *steps, expect=1)
    assert "error: data.eod_token_id is unset and data.train.corpus records no tokenizer" in error
    out = train(tmp_path / "books", books, *steps, "--config.data.eod_token_id=50256")
    assert "final_step: 2" in out
    web = f"{REPO / 'configs' / 'megatron.py'}:{fixtures / 'web_text_document'}"
    out = train(
        tmp_path / "web",
        web,
        *steps,
        "--config.data.train.corpus.end_of_document=50256",
        "--config.data.train.corpus.split=969,30,1",  # as the config's docstring says
    )
    assert "final_step: 2" in out
    # A --data-path blend, quoted as one argument, with a per-dataset override.
    prefix = fixtures / "web_text_document"
    blend = f"{REPO / 'configs' / 'megatron.py'}:0.7 {prefix} 0.3 {prefix},50256"
    out = train(
        tmp_path / "blend", blend, *steps, "--config.data.train.web_text_document_2.weight=0.5"
    )
    assert "final_step: 2" in out
