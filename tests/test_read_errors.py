"""Damaged data ends a real run in one `error:` line naming the file and record, no traceback.

Each test damages a prepared corpus in one exact way and runs what a user runs
(`python -m trainer_hooks.train`, or an `xlstm-data` command) as a fresh
process: the exit status is not 0, stderr has exactly one `error:` line that
names the damaged file (and the record where one is at fault), and nothing
prints a traceback, from the main process or a grain worker. `--debug` shows
the traceback instead.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.multiprocess import REPO, subprocess_env
from xlstm_data.prepare.corpus import prepare_corpus

PREPARED = REPO / "configs" / "prepared.py"
_SCRIPT = Path(sys.executable).parent / "xlstm-data"
XLSTM_DATA = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "xlstm_data.cli.main"]
#: A tiny model and batch on configs/prepared.py, so a run reaches its first batches fast.
SMALL = (
    "--config.num_train_steps=30",
    "--config.model.d_model=32",
    "--config.model.num_layers=1",
    "--config.model.num_heads=2",
    "--config.model.mlp_dim=64",
    "--config.data.global_batch_size=8",
    "--config.data.max_target_length=64",
)


@pytest.fixture(scope="module")
def corpora(tmp_path_factory) -> dict[str, Path]:
    """60 token documents (byte vocabulary) prepared in both layouts, 2 shards each."""
    root = tmp_path_factory.mktemp("read_errors")
    rng = np.random.default_rng(0)
    documents = [rng.integers(2, 258, int(n)).astype(np.int32) for n in rng.integers(5, 100, 60)]
    np.savez(root / "ids.npz", *documents)
    prepare_corpus([str(root / "ids.npz")], str(root / "flat"), num_shards=2)
    prepare_corpus([str(root / "ids.npz")], str(root / "ar"), num_shards=2, layout="array_record")
    return {"flat": root / "flat", "array_record": root / "ar"}


def _copy(corpora: dict[str, Path], layout: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(corpora[layout], tmp_path / layout))


def _garble(path: Path, at: int, count: int = 64) -> None:
    """Overwrites `count` bytes from `at` with fixed random bytes; the size stays."""
    data = bytearray(path.read_bytes())
    data[at : at + count] = np.random.default_rng(1).integers(0, 256, count, np.uint8).tobytes()
    path.write_bytes(bytes(data))


def _run(args: list[str], **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        args,
        cwd=REPO,
        env={**subprocess_env(), **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def _train(directory: Path, workdir: Path, *flags: str) -> subprocess.CompletedProcess:
    return _run(
        [
            sys.executable,
            "-m",
            "trainer_hooks.train",
            f"--config={PREPARED}:{directory}",
            f"--workdir={workdir}",
            "--cpu_devices=1",
            *SMALL,
            *flags,
        ]
    )


def _one_error_line(result: subprocess.CompletedProcess, *named: str) -> str:
    """The run's single `error:` line (an `xlstm-data <cmd>: ` prefix allowed), checked."""
    assert result.returncode != 0, result.stdout[-2000:] + result.stderr[-3000:]
    output = result.stdout + result.stderr
    assert "Traceback" not in output, output[-4000:]
    lines = [
        line
        for line in result.stderr.splitlines()
        if line.startswith("error: ") or (line.startswith("xlstm-data") and ": error: " in line)
    ]
    assert len(lines) == 1, result.stderr[-4000:]
    for name in named:
        assert name in lines[0], lines[0]
    return lines[0]


def _trained_steps(workdir: Path) -> int:
    path = workdir / "batches.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


@pytest.mark.parametrize("workers", [0, 2])
def test_a_token_id_outside_the_vocabulary(corpora, tmp_path, workers):
    flat = _copy(corpora, "flat", tmp_path)
    offsets = np.load(flat / "shard-00001-of-00002.offsets.npy")
    tokens = np.load(flat / "shard-00001-of-00002.tokens.npy", mmap_mode="r+")
    tokens[offsets[3] + 1] = 1000  # same file size; a byte vocabulary has 258 ids
    tokens.flush()
    del tokens
    result = _train(flat, tmp_path / "run", f"--config.data.worker_count={workers}")
    _one_error_line(
        result, "shard-00001-of-00002.tokens.npy", "document 3 of", "token id 1000", "258"
    )


def test_garbage_in_a_flat_shards_header_is_refused_before_training(corpora, tmp_path):
    flat = _copy(corpora, "flat", tmp_path)
    _garble(flat / "shard-00001-of-00002.offsets.npy", 0)
    workdir = tmp_path / "run"
    result = _train(flat, workdir)
    _one_error_line(result, "shard-00001-of-00002.offsets.npy", "damaged", "xlstm-data prepare")
    assert _trained_steps(workdir) == 0  # found while the sources were opened


def test_garbage_at_the_end_of_flat_offsets_is_refused_before_training(corpora, tmp_path):
    flat = _copy(corpora, "flat", tmp_path)
    path = flat / "shard-00000-of-00002.offsets.npy"
    _garble(path, path.stat().st_size - 16, 16)
    result = _run([*XLSTM_DATA, "batch", f"--config={PREPARED}:{flat}", "--step=0", *SMALL])
    _one_error_line(result, "shard-00000-of-00002.offsets.npy", "offsets run from 0 to")


def test_garbage_among_a_flat_shards_tokens_names_the_document(corpora, tmp_path):
    flat = _copy(corpora, "flat", tmp_path)
    _garble(flat / "shard-00000-of-00002.tokens.npy", 1000)
    result = _run([*XLSTM_DATA, "inspect", f"--config={PREPARED}:{flat}", *SMALL])
    _one_error_line(result, "shard-00000-of-00002.tokens.npy", "document ", "token id")


def test_garbage_in_an_array_record_shard_names_the_record(corpora, tmp_path):
    shards = _copy(corpora, "array_record", tmp_path)
    _garble(shards / "shard-00000-of-00002.array_record", 1000)
    result = _train(shards, tmp_path / "run", "--config.data.worker_count=2")
    _one_error_line(result, "shard-00000-of-00002.array_record", "record ", "Corrupted", "damaged")


def test_an_edited_index_json(corpora, tmp_path):
    flat = _copy(corpora, "flat", tmp_path)
    index = json.loads((flat / "index.json").read_text())
    index["shards"][0]["documents"] += 1  # a document moved between shards: totals agree
    index["shards"][1]["documents"] -= 1
    (flat / "index.json").write_text(json.dumps(index))
    result = _run([*XLSTM_DATA, "inspect", f"--config={PREPARED}:{flat}", *SMALL])
    _one_error_line(result, "shard-00000-of-00002", "index says")


def test_a_json_line_without_the_text_field(tmp_path):
    lines = ['{"text": "one"}', '{"content": "two"}', '{"text": "three"}']
    (tmp_path / "a.jsonl").write_text("\n".join(lines) + "\n")
    result = _run(
        [*XLSTM_DATA, "prepare", str(tmp_path / "a.jsonl"), f"--output={tmp_path / 'out'}"]
    )
    _one_error_line(result, "line 2", "a.jsonl", "'text'")


def test_debug_shows_the_traceback(corpora, tmp_path):
    flat = _copy(corpora, "flat", tmp_path)
    _garble(flat / "shard-00001-of-00002.offsets.npy", 0)
    command = [*XLSTM_DATA, "inspect", f"--config={PREPARED}:{flat}", *SMALL]
    for result in (_run([*command, "--debug"]), _run(command, XLSTM_DATA_DEBUG="1")):
        assert result.returncode != 0
        assert "Traceback" in result.stderr and "DataReadError" in result.stderr, result.stderr
