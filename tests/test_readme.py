"""The README's Python example runs as written."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_example_runs(capsys):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert blocks, "README has no python example"
    namespace: dict = {}
    exec(compile(blocks[0], str(README), "exec"), namespace)  # noqa: S102
    assert namespace["batch"].inputs.shape == (32, 512)
    assert namespace["state"]["step"] == 1
    assert "(32, 512)" in capsys.readouterr().out


def test_readme_hooks_example_runs(capsys):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    hooks_example = next(block for block in blocks if "CheckpointHook" in block)
    namespace: dict = {}
    exec(compile(hooks_example, str(README), "exec"), namespace)  # noqa: S102
    assert namespace["manager"].all_steps() == [5, 10]
    share = namespace["writer"].scalars[10]["data/share/web"]
    assert 0.6 < share < 1.0
    assert "[5, 10]" in capsys.readouterr().out
    namespace["train_iter"].close()
    namespace["manager"].close()


def test_readme_documents_both_setup_commands():
    text = README.read_text()
    assert "make demo" in text and "make test" in text
