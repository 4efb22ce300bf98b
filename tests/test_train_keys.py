"""Training keys, flag values and absurd sizes are refused by name, before any data is read.

Each value here used to fail late or not at all: a ZeroDivisionError after
step 1, an AssertionError in the model, NaN losses, "training finished" for
-5 steps, no checkpoint kept with max_to_keep=0 (and a silent restart),
hours spinning in the plan for a batch of 10^12 rows, an OverflowError in
the model for rows of 10^11 tokens, and absl tracebacks for overrides of the
wrong type.
"""

from __future__ import annotations

import pytest

import xlstm_data as xd
from tests.multiprocess import REPO, run_train
from trainer_hooks.config import default_config, with_defaults

CONFIG = str(REPO / "tests" / "train_config.py")


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("log_every_steps", 0, "log_every_steps=0 is invalid; expected an integer >= 1"),
        ("checkpoint.every_steps", 0, "checkpoint.every_steps=0 is invalid"),
        ("checkpoint.max_to_keep", 0, "checkpoint.max_to_keep=0 is invalid"),
        ("checkpoint.every_secs", -1.0, "checkpoint.every_secs=-1.0 is invalid"),
        ("model.num_heads", 3, "model.num_heads=3 does not divide model.d_model=32"),
        ("model.d_model", 0, "model.d_model=0 is invalid; expected an integer >= 1"),
        ("model.vocab_size", 1, "model.vocab_size=1 is invalid; expected an integer >= 2"),
        ("model.mlp_dim", 10**9, "model.mlp_dim=1000000000 is invalid; expected an integer <="),
        ("learning_rate", float("nan"), "learning_rate=nan is invalid"),
        ("learning_rate", 0.0, "learning_rate=0.0 is invalid"),
        ("num_train_steps", -5, "num_train_steps=-5 is invalid; expected an integer >= 1"),
        ("warmup_steps", -5, "warmup_steps=-5 is invalid; expected an integer >= 0"),
        ("eval_every_steps", -1, "eval_every_steps=-1 is invalid"),
        ("adaptive_mixture.every_steps", -1, "adaptive_mixture.every_steps=-1 is invalid"),
    ],
)
def test_a_bad_training_key_is_refused_by_name(key, value, message):
    config = default_config().to_dict()
    section, *rest = key.split(".")
    if rest:
        config[section][rest[0]] = value
    else:
        config[section] = value
    with pytest.raises(xd.DataConfigError) as error:
        with_defaults(config)
    assert message in str(error.value)


def _data(**overrides):
    data = {
        "train": {"a": {"kind": "synthetic", "num_documents": 50, "mean_length": 30}},
        "global_batch_size": 4,
        "max_target_length": 32,
    }
    data.update(overrides)
    return data


def test_a_batch_larger_than_the_corpus_is_refused_before_planning():
    with pytest.raises(xd.DataConfigError) as error:
        xd.iterators_from_config(_data(global_batch_size=10**12), xd.create_mesh())
    message = str(error.value)
    assert "data.global_batch_size=1000000000000 rows is more than the whole train corpus" in (
        message
    )
    assert "use at most" in message


def test_a_row_longer_than_any_model_can_embed_is_refused():
    with pytest.raises(xd.DataConfigError, match=r"data.max_target_length=100000000000 is"):
        xd.iterators_from_config(_data(max_target_length=10**11), xd.create_mesh())


@pytest.mark.parametrize(
    ("flag", "message", "status"),
    [
        (
            "--config.data.global_batch_size=abc",
            "error: flag --config.data.global_batch_size=abc is invalid; expected an integer",
            2,
        ),
        (
            "--config.data.global_batch_size=12.5",
            "error: flag --config.data.global_batch_size=12.5 is invalid; expected an integer",
            2,
        ),
        (
            "--config.data.train.long.weight=heavy",
            "error: flag --config.data.train.long.weight=heavy is invalid; expected a number",
            2,
        ),
        ("--cpu_devices=0", "error: flag --cpu_devices=0: 0 is not a positive integer", 2),
        ("--config.checkpoint.max_to_keep=0", "error: checkpoint.max_to_keep=0 is invalid", 1),
    ],
)
def test_a_bad_flag_is_one_error_line(tmp_path, flag, message, status):
    result = run_train(
        f"--config={CONFIG}", f"--workdir={tmp_path / 'run'}", flag, expect=status, timeout=120
    )
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith(message), result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()


def _prepared(tmp_path):
    import numpy as np

    from xlstm_data.prepare.corpus import prepare_corpus

    rng = np.random.default_rng(0)
    rows = rng.integers(2, 250, size=(300, 40)).astype(np.int32)
    np.save(tmp_path / "ids.npy", rows)
    out = tmp_path / "corpus"
    prepare_corpus([str(tmp_path / "ids.npy")], str(out), vocab_size=258)
    return out


def test_lengths_edited_after_prepare_are_one_error_line_naming_what_to_rerun(tmp_path):
    import numpy as np

    corpus = _prepared(tmp_path)
    lengths = np.load(corpus / "lengths.npy")
    lengths[0::2] += 3  # every document off, the shard's total right: the index check
    lengths[1::2] -= 3  # cannot see it, only reading can
    np.save(corpus / "lengths.npy", lengths)
    config = f"{REPO / 'configs' / 'prepared.py'}:{corpus}"
    flags = (
        f"--config={config}",
        f"--workdir={tmp_path / 'run'}",
        "--config.num_train_steps=3",
        "--config.data.max_target_length=64",
        "--config.data.global_batch_size=4",
    )
    result = run_train(*flags, expect=1, timeout=180)
    last = [line for line in result.stderr.splitlines() if line.strip()][-1]
    assert last.startswith("error: data.train.corpus: document "), last
    assert "rerun `xlstm-data index`" in last, last
    assert "Traceback" not in result.stderr
    debug = run_train(*flags, "--debug", expect=1, timeout=180)
    assert "Traceback" in debug.stderr and "DataReadError" in debug.stderr


@pytest.mark.parametrize(
    ("flag", "message", "status"),
    [
        ("--config.data.wroker_count=2", "error: data has unknown keys ['wroker_count']", 1),
        ("--config.num_train_step=2", "error: config key num_train_step is unknown", 1),
        ("--config.chekpoint.every_steps=2", "error: --config: the config has no section", 2),
        ("--config.data.global_batch_size=abc", "error: flag --config.data.global_batch_size", 2),
        ("--config.checkpoint.max_to_keep=0", "error: checkpoint.max_to_keep=0 is invalid", 1),
        ("--config=/nowhere/run.py", "error: --config='/nowhere/run.py' is not a file", 2),
    ],
)
def test_a_bad_config_is_refused_before_the_training_imports(flag, message, status, capsys):
    """`trainer_hooks.train` checks `--config` first, with the statuses of its full run."""
    from trainer_hooks.early_config_check import exit_if_config_is_bad

    with pytest.raises(SystemExit) as exited:
        exit_if_config_is_bad([f"--config={CONFIG}", "--workdir", "/nowhere", flag])
    assert exited.value.code == status
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(message)


def test_an_unreadable_corpus_index_is_one_line_before_the_training_imports(tmp_path, capsys):
    from trainer_hooks.early_config_check import exit_if_config_is_bad

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "index.json").write_text("{not json")
    config = tmp_path / "run.py"
    config.write_text(
        "import ml_collections\n"
        "def get_config():\n"
        "    return ml_collections.ConfigDict({'data': {\n"
        f"        'train': {{'c': {{'kind': 'array_record', 'path': {str(corpus)!r}}}}},\n"
        "        'global_batch_size': 8, 'max_target_length': 16}})\n"
    )
    with pytest.raises(SystemExit) as exited:
        exit_if_config_is_bad([f"--config={config}"])
    assert exited.value.code == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("error: ") and "index.json" in line and "(--debug shows where)" in line


def test_a_good_config_other_flags_help_and_debug_pass_the_early_check(capsys):
    from trainer_hooks.early_config_check import exit_if_config_is_bad

    # Flags it does not know are left to the full parse, which names a bad one.
    assert exit_if_config_is_bad([f"--config={CONFIG}", "--cpu_devices=0", "--workdir=x"]) is None
    assert exit_if_config_is_bad(["--workdir=x"]) is None  # no --config: the full run says so
    bad = "--config.data.wroker_count=2"
    assert exit_if_config_is_bad([f"--config={CONFIG}", bad, "--debug"]) is None
    assert exit_if_config_is_bad(["--config=/nowhere/run.py", "--help"]) is None  # help first
    assert capsys.readouterr().err == ""
