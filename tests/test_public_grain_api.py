"""Fails if the package reaches into grain's private modules (they broke the reference)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("xlstm_data", "trainer_hooks", "bench", "configs")


def _python_files():
    for package in PACKAGES:
        yield from sorted((ROOT / package).rglob("*.py"))


def _private_grain_references(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Attribute):
            names = [ast.unparse(node)]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names = [node.value]  # importlib.import_module("grain._src...")
        else:
            continue
        found += [n for n in names if n.startswith("grain.") and "._" in n[len("grain") :]]
    return found


def test_package_uses_only_public_grain_api():
    files = list(_python_files())
    assert files, "no package files found"
    offenders = {}
    for path in files:
        refs = _private_grain_references(ast.parse(path.read_text(), str(path)))
        if refs:
            offenders[str(path.relative_to(ROOT))] = refs
    assert not offenders, f"private grain modules used: {offenders}"


@pytest.mark.parametrize(
    "code", ["import grain._src.python", "from grain._src import x", "grain._src.core.foo"]
)
def test_the_check_catches_private_use(code):
    assert _private_grain_references(ast.parse(code))
