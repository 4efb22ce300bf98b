"""`xlstm-data inspect` on every shipped config, and its errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import shipped_config_argv
from xlstm_data.cli.inspect_config import inspect_config, load_config
from xlstm_data.cli.main import main as cli_main
from xlstm_data.config.data_config import validate_data_config

CONFIGS = sorted((Path(__file__).resolve().parent.parent / "configs").glob("*.py"))


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.stem)
def test_inspect_runs_on_every_config_and_writes_its_png(config, tmp_path, capsys):
    png = tmp_path / "plan.png"
    config, small = shipped_config_argv(config, tmp_path)
    # 4 CPU devices, as conftest.py gives every in-process test.
    argv = ["inspect", f"--config={config}", f"--png={png}", "--steps=12", "--cpu_devices=4"]
    argv += small
    code = cli_main(argv)
    captured = capsys.readouterr()
    out = captured.out
    assert code == 0, captured.err
    assert png.read_bytes().startswith(b"\x89PNG")
    for expected in ("train sources:", "expected share", "ramp-up", "epoch length", "sample row"):
        assert expected in out


def test_plan_matches_the_config(tmp_path):
    import io

    config = load_config(str(CONFIGS[[p.stem for p in CONFIGS].index("demo")]))
    config.data.train.code.max_files = 10
    config.data.train.prose.max_files = 10
    plan = inspect_config(
        config,
        png=str(tmp_path / "p.png"),
        plot_steps=8,
        out=io.StringIO(),
    )
    assert [s["name"] for s in plan["sources"]] == ["code", "prose"]
    assert [round(s["expected_share"], 3) for s in plan["sources"]] == [0.7, 0.3]
    assert [s["vocab_size"] for s in plan["sources"]] == [258, 258]
    _assert_counts_are_the_documents(plan, config)
    assert plan["eod_token_id"] == 1  # the byte tokenizer's, as the sources' own
    assert [s["global_batch_size"] for s in plan["stages"]] == [8, 16, 32]
    assert plan["stages"][0]["tokens_per_step"] == 8 * 128
    assert 0 <= plan["padding_fraction"] < 0.2
    assert sum(plan["measured_shares"].values()) == pytest.approx(1.0)
    # Mixture weights are token-weighted: the measured token shares follow them.
    assert plan["measured_shares"] == pytest.approx({"code": 0.7, "prose": 0.3}, abs=0.03)
    assert plan["mixture_schedule"] == [[0, pytest.approx({"code": 0.7, "prose": 0.3})]]


def test_a_source_of_weight_0_is_counted_from_its_documents(tmp_path):
    """It is not in the plan, whose sums count the others."""
    import io

    config = load_config(str(CONFIGS[[p.stem for p in CONFIGS].index("demo")]))
    config.data.train.code.max_files = 10
    config.data.train.prose.max_files = 10
    config.data.train.code.weight = 0.0
    plan = inspect_config(config, png=str(tmp_path / "p.png"), plot_steps=2, out=io.StringIO())
    assert [s["expected_share"] for s in plan["sources"]] == [0.0, 1.0]
    _assert_counts_are_the_documents(plan, config)


def test_plan_shows_the_mixture_schedule_not_the_static_weights(tmp_path):
    import io

    config = load_config(str(CONFIGS[[p.stem for p in CONFIGS].index("demo")]))
    config.data.train.code.max_files = 10
    config.data.train.prose.max_files = 10
    config.data.mixture_schedule = [[0, {"code": 1, "prose": 1}], [50, {"prose": 1}]]
    out = io.StringIO()
    plan = inspect_config(config, png=str(tmp_path / "p.png"), plot_steps=2, out=out)
    assert [s["expected_share"] for s in plan["sources"]] == [0.5, 0.5]
    assert plan["mixture_schedule"] == [
        [0, {"code": 0.5, "prose": 0.5}],
        [50, {"code": 0.0, "prose": 1.0}],
    ]
    assert "stage 1 from step      50: code 0.0%, prose 100.0%" in out.getvalue()
    assert "packing: best_fit" in out.getvalue()
    # One pass over each dataset at the planned shares: code is off from step 50.
    assert plan["one_pass_steps"]["code"] is None
    assert "one pass over code: never" in out.getvalue()
    assert 0 < plan["one_pass_steps"]["prose"] < 50  # 10 small files


def test_one_pass_follows_the_rampup_and_the_stages():
    from xlstm_data.cli.inspect_config import one_pass_steps
    from xlstm_data.from_config import open_train_plan

    data = {
        "train": {"a": {"kind": "synthetic", "num_documents": 10, "mean_length": 8}},
        "global_batch_size": 4,
        "max_target_length": 16,
        "rampup": [[0, 0.5], [10, 1.0]],
    }
    plan = open_train_plan(data).plan
    # 10 steps of 2 x 16 tokens, then 4 x 16: 1000 tokens take 10 + ceil(680 / 64) steps.
    assert one_pass_steps(plan, {"a": 1000}) == {"a": 21}


def test_inspect_warns_when_the_data_behind_a_workdir_changed(tmp_path):
    import io

    import orbax.checkpoint as ocp

    import xlstm_data as xd
    from tests.test_checkpoint import save

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"line {i} of the corpus\n" for i in range(500)))
    config = load_config(str(CONFIGS[[p.stem for p in CONFIGS].index("demo")]))
    config.data.train = {"text": {"kind": "text", "path": str(corpus)}}
    config.data.eval = {}
    train, _ = xd.iterators_from_config(config.data, xd.create_mesh())
    next(train)
    manager = ocp.CheckpointManager(tmp_path / "run" / "checkpoints")
    save(manager, 1, {"w": 1.0}, train)
    manager.wait_until_finished()
    train.close()

    def warnings() -> str:
        err = io.StringIO()
        inspect_config(
            config,
            png=str(tmp_path / "p.png"),
            plot_steps=1,
            workdir=str(tmp_path / "run"),
            out=io.StringIO(),
            err=err,
        )
        return err.getvalue()

    assert warnings() == ""
    corpus.write_text(corpus.read_text() + "one more line\n")
    assert f"warning:   {corpus} (data.train.text) changed: size" in warnings()


def test_bad_override_and_missing_config_are_named(tmp_path, capsys):
    assert cli_main(["inspect", f"--config={tmp_path / 'none.py'}"]) == 2
    assert "none.py" in capsys.readouterr().err
    config = CONFIGS[0]
    assert cli_main(["inspect", f"--config={config}", "--config.nokey.deeper=1"]) == 2
    error = capsys.readouterr().err
    assert "the config has no section 'nokey'" in error


def _assert_counts_are_the_documents(plan, config):
    """Each source's documents and tokens as printed equal its documents, read one by one."""
    sources = {s.name: s.build() for s in validate_data_config(config).train}
    for entry in plan["sources"]:
        source = sources[entry["name"]]
        assert entry["documents"] == len(source)
        assert entry["tokens"] == sum(len(source[i]["tokens"]) for i in range(len(source)))
        assert entry["tokens_exact"]
