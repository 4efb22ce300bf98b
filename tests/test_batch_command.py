"""`xlstm-data batch` lists exactly what the iterator yields, on 1 and on 2 processes."""

from __future__ import annotations

import json

import ml_collections
import numpy as np
import pytest

import xlstm_data as xd
from tests.multiprocess import REPO, run_processes
from xlstm_data.cli.batch_contents import run_batch
from xlstm_data.cli.inspect_config import load_config
from xlstm_data.cli.main import main
from xlstm_data.from_config import open_train_plan

#: A ramp-up 12 -> 24 rows at step 10, a mixture stage change at 5, best_fit packing.
CONFIG = str(REPO / "tests" / "train_config.py")
#: 5 steps chosen at random over the 30-step run (seeded: the same in every run).
STEPS = sorted(int(s) for s in np.random.default_rng(3).choice(30, 5, replace=False))


def test_the_chosen_steps_straddle_the_stage_change_and_the_rampup():
    assert min(STEPS) < 5 and any(5 <= s < 10 for s in STEPS) and max(STEPS) >= 10, STEPS


@pytest.fixture(scope="module")
def listing(tmp_path_factory):
    """`batch --processes=2 --jsonl` over the run's first 30 steps, by (step, row)."""
    path = tmp_path_factory.mktemp("batch") / "rows.jsonl"
    assert (
        main(["batch", f"--config={CONFIG}", "--steps=0:30", "--processes=2", f"--jsonl={path}"])
        == 0
    )
    records = [json.loads(line) for line in path.read_text().splitlines()]
    return {(r["step"], r["row"]): r for r in records}


@pytest.fixture(scope="module")
def opened():
    return open_train_plan(load_config(CONFIG).data)


def _expected_inputs(record, opened) -> np.ndarray:
    eod = opened.config.eod_token_id
    length = opened.config.max_target_length
    parts = []
    for piece in record["documents"]:
        tokens = opened.sources[piece["source"]][piece["document"]]["tokens"]
        stream = np.concatenate([tokens, [eod]])  # shift_target: tokens, then EOD
        parts.append(stream[piece["start"] : piece["stop"]])
    row = np.zeros(length, np.int32)
    flat = np.concatenate(parts) if parts else np.zeros(0, np.int32)
    row[: len(flat)] = flat
    return row


def test_listed_documents_equal_the_yielded_rows_token_for_token(listing, opened):
    config = load_config(CONFIG)
    train, evals = xd.iterators_from_config(config.data, xd.create_mesh())
    try:
        batches = {}
        for step in range(max(STEPS) + 1):
            batch = next(train)
            if step in STEPS:
                batches[step] = np.asarray(batch.inputs)
    finally:
        for iterator in (train, *evals.values()):
            iterator.close()
    for step in STEPS:
        rows = [listing[(step, row)] for row in range(batches[step].shape[0])]
        assert (step, batches[step].shape[0]) not in listing  # no row more than yielded
        for row, record in enumerate(rows):
            np.testing.assert_array_equal(
                batches[step][row], _expected_inputs(record, opened), err_msg=f"{step}/{row}"
            )


def test_on_2_processes_each_listed_row_is_read_by_the_listed_process(listing, opened, tmp_path):
    results = run_processes("planned_rows", 2, tmp_path, {"config": CONFIG, "steps": STEPS})
    for step in STEPS:
        held = {}
        for process, result in enumerate(results):
            for row, values in result[str(step)].items():
                held[int(row)] = (process, np.asarray(values))
        assert sorted(held) == sorted(row for s, row in listing if s == step)
        for row, (process, values) in held.items():
            record = listing[(step, row)]
            assert record["process"] == process, (step, row)
            np.testing.assert_array_equal(values, _expected_inputs(record, opened))


def test_skipped_steps_list_the_data_step_behind_each_step(listing, capsys):
    assert (
        main(["batch", f"--config={CONFIG}", "--config.data.skip_steps=[[3,9]]", "--step=4"]) == 0
    )
    out = capsys.readouterr().out
    assert "step 4 (trained by update 5, data step 10): 24 rows" in out


def test_decode_prints_the_documents_text(tmp_path, capsys):
    lines = [f"line number {i} says hello" for i in range(30)]
    (tmp_path / "a.txt").write_text("\n".join(lines) + "\n")
    config = ml_collections.ConfigDict(
        {
            "data": {
                "train": {"text": {"kind": "text", "path": str(tmp_path / "a.txt")}},
                "global_batch_size": 4,
                "max_target_length": 16,
            }
        }
    )
    path = tmp_path / "rows.jsonl"
    rows = run_batch(
        config, None, range(2), decode=True, jsonl=str(path), out=None, err=None, chars=0
    )
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(records) == len(rows) == 8
    printed = capsys.readouterr().out
    whole = 0
    for record in records:
        for piece in record["documents"]:
            line = lines[piece["document"]]
            first, last = piece["start"], min(piece["stop"], len(line))
            assert piece["text"] == line[first:last]
            assert f"text#{piece['document']}: {json.dumps(line[first:last])}" in printed
            whole += piece["start"] == 0 and piece["stop"] == 16
    assert whole  # a row that starts with a document's first 16 characters


@pytest.mark.parametrize(
    "args, words",
    [
        (["--step=30"], ["--step=30"]),  # endless run: fine, listed below
        (["--steps=4:2"], ["--steps='4:2'", "A:B"]),
        (["--step=3", "--processes=5"], ["--processes=5", "valid: [1, 2, 3, 4, 6, 12]"]),
        (["--step=3", "--steps=1:2"], ["exactly one of --step=N and --steps=A:B"]),
    ],
)
def test_bad_arguments_are_named(args, words, capsys):
    status = main(["batch", f"--config={CONFIG}", *args])
    err = capsys.readouterr().err
    if args == ["--step=30"]:
        assert status == 0
        return
    assert status == 2
    for word in words:
        assert word in err


def test_a_step_past_a_finite_runs_end_is_refused(tmp_path, capsys):
    config = ml_collections.ConfigDict(
        {
            "data": {
                "train": {"one": {"kind": "synthetic", "num_documents": 50, "mean_length": 20}},
                "global_batch_size": 4,
                "max_target_length": 16,
                "num_epochs": 1,
            }
        }
    )
    train = xd.iterators_from_config(config.data, xd.create_mesh())[0]
    total = train.iterator_length
    train.close()
    with pytest.raises(xd.DataConfigError) as error:
        run_batch(config, None, range(total, total + 1), out=None, err=None)
    message = str(error.value)
    assert f"step {total} (--step/--steps)" in message
    assert f"valid steps: 0..{total - 1}" in message


def test_a_workdir_without_a_checkpoint_is_named(tmp_path, capsys):
    assert main(["batch", f"--workdir={tmp_path}", "--step=1"]) == 2
    assert f"--workdir='{tmp_path}' has no checkpoint" in capsys.readouterr().err


def test_a_workdir_whose_checkpoint_holds_no_data_state_is_named(tmp_path, capsys):
    (tmp_path / "checkpoints" / "5").mkdir(parents=True)
    assert main(["batch", f"--workdir={tmp_path}", "--step=1"]) == 2
    err = capsys.readouterr().err
    assert f"--workdir='{tmp_path}'" in err and "holds no data state" in err
