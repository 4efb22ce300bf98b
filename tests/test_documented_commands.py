"""Every command line the docs show is executed by a test, as written.

The docs' shell blocks are read here; each command must be listed in
`COVERED_BY` with the test that runs it. A new documented command without a
test fails `test_every_documented_command_is_covered`. The commands that no
other test runs are run here, with only their placeholders (paths, the
coordinator's address, the rank) replaced.
"""

from __future__ import annotations

import importlib
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.multiprocess import REPO, free_port, run_train_processes, subprocess_env

DOCS = ("README.md", "configs/README.md", "bench/README.md")

PREPARE = 'xlstm-data prepare "raw/*.jsonl" "raw/*.txt" --output=/data/corpus --workers=8'
INSPECT = (
    "xlstm-data inspect --config=configs/mixture_rampup.py "
    "--config.data.global_batch_size=64 --png=plan.png"
)
BENCH_CONFIG = "xlstm-data bench --config=configs/mixture_rampup.py --steps=50 --out=bench_out"
MULTIHOST = (
    "python -m trainer_hooks.train --config=configs/multihost.py --workdir=/shared/run1 "
    "--coordinator=10.0.0.1:1234 --num_processes=4 --process_id=$RANK"
)

PREPARE_PARQUET = (
    'xlstm-data prepare "fineweb/*.parquet" --output=/data/fineweb --num_shards=64 '
    "--validation_fraction=0.001 --workers=8"
)
TRAIN_PREPARED = (
    "python -m trainer_hooks.train --config=configs/prepared.py:/data/fineweb --workdir=fineweb_run"
)
INDEX = 'xlstm-data index "/data/shards/*.array_record" --workers=8'
PREPARE_BEAM = 'xlstm-data prepare "raw/*.jsonl.zst" --output=/data/corpus --runner=beam'

ELASTIC = (
    "python -m trainer_hooks.train --config=configs/demo.py --workdir=demo_workdir "
    "--cpu_devices=2 --config.num_train_steps=320 --coordinator=127.0.0.1:1234 "
    "--num_processes=2 --process_id=$RANK"
)

#: The README's "after a loss spike" commands, in order, on the demo run continued by ELASTIC.
SPIKE_BATCHES = (
    "xlstm-data batch --workdir=demo_workdir --steps=310:318 --processes=2 --decode --chars=60"
)
SPIKE_MOVE = "mv demo_workdir/checkpoints/320 demo_workdir/spiked_320"
SPIKE_RESUME = (
    "python -m trainer_hooks.train --config=configs/demo.py --workdir=demo_workdir "
    "--cpu_devices=2 --config.num_train_steps=340 --config.data.skip_steps='[[300,320]]'"
)
SPIKE_STEP = "xlstm-data batch --workdir=demo_workdir --step=330"

ADAPTIVE_TRAIN = (
    "python -m trainer_hooks.train --config=configs/mixture_rampup.py --workdir=/tmp/adaptive "
    "--cpu_devices=2 --config.num_train_steps=120 "
    "--config.adaptive_mixture.reference_loss=\"{'web': 5.0, 'books': 5.2, 'code': 4.8}\""
)

#: Documented command -> "tests.module::test" that runs it.
COVERED_BY = {
    ELASTIC: "tests.test_make_demo::test_make_demo",
    SPIKE_BATCHES: "tests.test_make_demo::test_make_demo",
    SPIKE_MOVE: "tests.test_make_demo::test_make_demo",
    SPIKE_RESUME: "tests.test_make_demo::test_make_demo",
    SPIKE_STEP: "tests.test_make_demo::test_make_demo",
    "make demo": "tests.test_make_demo::test_make_demo",
    "make test": ".ci/run (CI runs the suite with it)",
    PREPARE: "tests.test_documented_commands::test_readme_prepare_command",
    PREPARE_PARQUET: "tests.test_documented_commands::test_readme_parquet_corpus_to_training",
    TRAIN_PREPARED: "tests.test_documented_commands::test_readme_parquet_corpus_to_training",
    INDEX: "tests.test_documented_commands::test_readme_index_and_beam_commands",
    PREPARE_BEAM: "tests.test_documented_commands::test_readme_index_and_beam_commands",
    INSPECT: "tests.test_documented_commands::test_readme_inspect_and_bench_commands",
    BENCH_CONFIG: "tests.test_documented_commands::test_readme_inspect_and_bench_commands",
    MULTIHOST: "tests.test_documented_commands::test_readme_multihost_command_on_4_processes",
    ADAPTIVE_TRAIN: "tests.test_documented_commands::test_readme_adaptive_mixture_command",
    # Installing the peers takes 2 GB and the network: CI checks the recipe (make -n).
    "make bench-peers": "tests.test_documented_commands::test_make_bench_peers_recipe",
    (
        ".venv/bin/python -m bench.peers [--tiny] [--rounds N] [--docs N] [--out DIR] "
        "[--cold_10m] [--cold_100m] [--profile]"
    ): "tests.test_bench_peers::test_missing_peers_are_reported_and_ours_still_runs",
    "python -m bench.run [NAME ...] [--tiny] [--out=DIR]": (
        "tests.test_cli::test_bench_tiny_through_the_console_script"
    ),
    (
        "xlstm-data bench --config=my_run.py [--config.data.worker_count=2 ...] [--steps=200] "
        "[--step_secs=0.05] [--out=DIR]"
    ): "tests.test_cli::test_bench_config_measures_the_pipeline_the_same_from_both_entry_points",
}


def documented_commands() -> list[str]:
    commands = []
    for doc in DOCS:
        text = (REPO / doc).read_text()
        for block in re.findall(r"```(?:bash|sh|console)\n(.*?)```", text, re.S):
            for line in block.replace("\\\n", " ").splitlines():
                command = re.sub(r"\s+", " ", line.split("  #")[0]).strip()
                if command:
                    commands.append(command)
    return commands


def shell(command: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """Runs a documented command line with bash, the venv's commands first on PATH."""
    environment = subprocess_env()
    environment["PATH"] = f"{Path(sys.executable).parent}:{environment['PATH']}"
    result = subprocess.run(
        ["bash", "-c", command],
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, f"{command}\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    return result


def test_every_documented_command_is_covered():
    commands = documented_commands()
    assert PREPARE in commands and MULTIHOST in commands
    missing = [command for command in commands if command not in COVERED_BY]
    assert not missing, f"documented commands no test runs: {missing}"
    for covered_by in COVERED_BY.values():
        if "::" in covered_by:
            module, test = covered_by.split("::")
            assert hasattr(importlib.import_module(module), test), covered_by


def test_make_bench_peers_recipe():
    """`make bench-peers` installs the pinned peers into their own venv, never the project's."""
    recipe = subprocess.run(
        ["make", "-n", "bench-peers"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    for pinned in ("torch==2.13.0", "megatron-core==0.16.1", "ai2-olmo-core", "mosaicml-streaming"):
        assert pinned in recipe, recipe
    assert ".venv-peers/bin/pip install" in recipe and ".venv/bin/pip" not in recipe


def test_readme_prepare_command(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "web.jsonl").write_text('{"text": "one web page"}\n{"text": "another page"}\n')
    (raw / "notes.txt").write_text("a line of text\nand a second one\n")
    result = shell(PREPARE.replace("/data/corpus", str(tmp_path / "corpus")), tmp_path)
    assert "prepared 4 documents" in result.stdout
    index = json.loads((tmp_path / "corpus" / "index.json").read_text())
    assert index["documents"] == 4 and len(index["shards"]) == 2


def test_readme_parquet_corpus_to_training(tmp_path):
    """A directory of Parquet files to a training run, with the README's two commands."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "fineweb").mkdir()
    rng = np.random.default_rng(0)
    for number in range(3):
        texts = [
            f"page {number}-{i}: " + " ".join(["words"] * int(rng.integers(5, 200)))
            for i in range(3000)
        ]
        table = pa.table({"id": list(range(len(texts))), "text": texts})
        pq.write_table(table, tmp_path / "fineweb" / f"{number:03d}.parquet", row_group_size=700)
    data = tmp_path / "data" / "fineweb"
    prepared = shell(PREPARE_PARQUET.replace("/data/fineweb", str(data)), tmp_path)
    assert "prepared 8,991 documents" in prepared.stdout
    assert "held out 9 documents" in prepared.stdout
    assert len(list(data.glob("*.tokens.npy"))) == 64
    command = TRAIN_PREPARED.replace("/data/fineweb", str(data)).replace(
        "fineweb_run", str(tmp_path / "run")
    )
    trained = shell(f"{command} --config.num_train_steps=4", REPO)
    assert "final_step: 4" in trained.stdout
    metrics = (tmp_path / "run" / "metrics.jsonl").read_text()
    assert "eval" in metrics  # the held-out split is the eval set


def test_readme_index_and_beam_commands(tmp_path):
    import zstandard

    from xlstm_data.sources import ArrayRecordSource, open_shards, write_array_record

    shards = tmp_path / "data" / "shards"
    rng = np.random.default_rng(1)
    documents = [rng.integers(2, 258, int(n)).astype(np.int32) for n in rng.integers(1, 90, 60)]
    for k in range(3):
        write_array_record(shards / f"part-{k}.array_record", documents[k * 20 : (k + 1) * 20])
    indexed = shell(INDEX.replace("/data/shards", str(shards)), tmp_path)
    assert "60 documents" in indexed.stdout.replace(",", "")
    source = ArrayRecordSource(str(shards / "*.array_record"))
    assert source.lengths().tolist() == [len(d) for d in documents]

    (tmp_path / "raw").mkdir()
    lines = "".join(json.dumps({"text": f"document {i}"}) + "\n" for i in range(50))
    (tmp_path / "raw" / "a.jsonl.zst").write_bytes(
        zstandard.ZstdCompressor().compress(lines.encode())
    )
    corpus = tmp_path / "data" / "corpus"
    result = shell(PREPARE_BEAM.replace("/data/corpus", str(corpus)), tmp_path)
    assert "prepared 50 documents" in result.stdout
    assert len(open_shards(str(corpus))) == 50


def test_readme_inspect_and_bench_commands(tmp_path):
    result = shell(INSPECT.replace("plan.png", str(tmp_path / "plan.png")), REPO)
    assert (tmp_path / "plan.png").read_bytes().startswith(b"\x89PNG")
    assert "64" in result.stdout
    shell(BENCH_CONFIG.replace("bench_out", str(tmp_path / "bench_out")), REPO)
    (written,) = (tmp_path / "bench_out").glob("pipeline_*.json")
    assert json.loads(written.read_text())


def test_readme_multihost_command_on_4_processes(tmp_path):
    # 4 processes of 1 CPU device each: tp=2 over process pairs, fsdp=2.
    command = MULTIHOST.replace("/shared/run1", str(tmp_path / "run1")).replace(
        "10.0.0.1:1234", f"127.0.0.1:{free_port()}"
    )
    outputs = run_train_processes(
        4, *shlex.split(command)[3:], "--config.num_train_steps=3", "--cpu_devices=1"
    )
    assert "final_step: 3" in outputs[0]
    data = tmp_path / "run1" / "checkpoints" / "3" / "data"
    assert sorted(p.name for p in data.glob("*.json")) == [
        f"process_{i}-of-4.json" for i in range(4)
    ]


@pytest.mark.timeout(600)  # the demo, its 2-process continuation and the loss-spike steps
def test_readme_adaptive_mixture_command(tmp_path):
    workdir = tmp_path / "adaptive"
    result = shell(ADAPTIVE_TRAIN.replace("/tmp/adaptive", str(workdir)), REPO)
    assert "final_step: 120" in result.stdout
    state = json.loads(
        (workdir / "checkpoints" / "120" / "data" / "process_0-of-1.json").read_text()
    )
    updates = state["state"]["mixture_updates"]
    assert [step for step, _ in updates] == [50, 100]  # every 50 steps, from the next batch
    for _, weights in updates:
        assert set(weights) == {"web", "books", "code"}
        assert abs(sum(weights.values()) - 1) < 1e-5
    metrics = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert any("data/loss/code" in m for m in metrics)
