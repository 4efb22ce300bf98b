"""ProgressHook's line reaches stderr without any logging set-up by the user.

Each case runs a real Python process, because whether an INFO line shows
depends on the process's logging state (absl flags parsed or not, handlers
on the root logger), which pytest's own capture would change.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

LOOP = """
from trainer_hooks.progress import ProgressHook

hook = ProgressHook(4, every_steps=2, every_secs=None, metrics=lambda: {"loss": 2.5})
for step in range(1, 5):
    hook(step)
"""

SCRIPTS = {
    # A plain script: no absl.app, no --verbosity, no logging config.
    "plain": LOOP,
    # An absl app with its default flags.
    "absl_app": "from absl import app\n\ndef main(argv):\n"
    + textwrap.indent(LOOP, "    ")
    + "\napp.run(main)\n",
    # The documented way to silence it.
    "muted": "import logging\n"
    'logging.getLogger("trainer_hooks.progress").setLevel(logging.WARNING)\n' + LOOP,
}


def _run(script: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "JAX_PLATFORMS": "cpu"},
    )


@pytest.mark.parametrize("case", ["plain", "absl_app"])
def test_progress_line_reaches_stderr_by_default(case):
    result = _run(SCRIPTS[case])
    assert result.returncode == 0, result.stderr
    assert "step 2/4 (50%)" in result.stderr and "loss 2.5" in result.stderr
    assert "step 4/4 (100%)" in result.stderr
    assert "step" not in result.stdout  # logged, not printed


def test_progress_logger_level_set_by_the_user_wins():
    result = _run(SCRIPTS["muted"])
    assert result.returncode == 0, result.stderr
    assert "step 2/4" not in result.stderr
