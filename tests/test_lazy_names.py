"""The packages' public names load on first use, and each names what it says.

`import xlstm_data` and the command line's parser must not load JAX or grain:
a mistyped flag is then refused in a fraction of a second (`lazy_names`).
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from tests.multiprocess import REPO, subprocess_env

_LAZY_PACKAGES = ("xlstm_data", "xlstm_data.sources", "trainer_hooks")


@pytest.mark.parametrize("package", _LAZY_PACKAGES)
def test_every_public_name_resolves_from_the_module_it_is_mapped_to(package: str) -> None:
    module = importlib.import_module(package)
    for name, source in module._EXPORTS.items():
        value = getattr(module, name)
        origin = importlib.import_module(source)
        assert value is (origin if source.endswith(f".{name}") else getattr(origin, name))
        assert name in dir(module)
    assert sorted(module.__all__) == sorted(module._EXPORTS)
    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        module.not_a_name  # noqa: B018


@pytest.mark.parametrize("package", ["xlstm_data", "xlstm_data.sources"])
def test_the_type_checking_imports_list_the_same_names(package: str) -> None:
    """What a type checker sees (the `TYPE_CHECKING` block) is what runs."""
    module = importlib.import_module(package)
    tree = ast.parse(Path(module.__file__).read_text(encoding="utf-8"))
    (block,) = [
        node
        for node in tree.body
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING"
    ]
    seen = {}
    for node in block.body:
        assert isinstance(node, ast.ImportFrom)
        for alias in node.names:
            seen[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    expected = {
        name: source if source.endswith(f".{name}") else f"{source}.{name}"
        for name, source in module._EXPORTS.items()
    }
    assert seen == expected


def _run_fresh(script: str) -> subprocess.CompletedProcess:
    """`script` in a fresh interpreter (nothing imported yet), from the repository."""
    return subprocess.run(
        [sys.executable, "-c", script],
        env=subprocess_env(),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )


def test_the_packages_and_the_command_lines_checks_load_no_jax_or_grain() -> None:
    """Importing them, and refusing a bad key of a shipped config, loads none of them."""
    script = (
        "import sys, xlstm_data, xlstm_data.sources, xlstm_data.cli.main, trainer_hooks\n"
        "from trainer_hooks.early_config_check import exit_if_config_is_bad\n"
        "try:\n"
        "    exit_if_config_is_bad(['--config=configs/demo.py', '--config.data.wroker_count=2'])\n"
        "except SystemExit as exited:\n"
        "    print('exit', exited.code)\n"
        "print(sorted(m for m in ('jax', 'grain', 'orbax', 'flax') if m in sys.modules))"
    )
    result = _run_fresh(script)
    assert result.stdout.split("\n")[:2] == ["exit 1", "[]"], result.stderr
    assert "data has unknown keys ['wroker_count']" in result.stderr


def test_a_prepared_source_is_built_without_the_other_kinds_modules(tmp_path) -> None:
    """Opening prepared shards imports neither the text nor the synthetic source module.

    A start on prepared shards paid for importing both (4-5 ms of its first
    batch where no bytecode cache is written).
    """
    from tests.helpers import prepared_corpus

    corpus = prepared_corpus(tmp_path)
    data = {
        "train": {"web": {"kind": "array_record", "path": str(corpus)}},
        "global_batch_size": 2,
        "max_target_length": 32,
    }
    script = (
        "import sys\n"
        "from xlstm_data.config.data_config import validate_data_config\n"
        f"source = validate_data_config({data!r}).train[0].build()\n"
        "print(len(source), sorted(m for m in ('xlstm_data.sources.text_files',"
        " 'xlstm_data.sources.synthetic') if m in sys.modules))"
    )
    result = _run_fresh(script)
    documents, modules = result.stdout.split(" ", 1)
    assert int(documents) > 0 and modules.strip() == "[]", result.stderr
