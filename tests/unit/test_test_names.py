"""The tests folder's shape. Test modules have unique names: pytest imports them by basename
(rootdir-relative), so two folders with the same file name fail the whole run at collection.
What tests share lives in the ``support`` package: beside the tests lie only conftest files,
which hold fixtures and hooks, and no test imports from one."""

from __future__ import annotations

import ast
import collections
import pathlib

TESTS = pathlib.Path(__file__).resolve().parents[1]


def test_no_two_test_modules_share_a_file_name() -> None:
    names = collections.Counter(path.name for path in TESTS.rglob("test_*.py"))
    assert [name for name, count in names.items() if count > 1] == []


def test_no_helper_module_lies_loose_beside_the_tests() -> None:
    loose = [
        str(path.relative_to(TESTS))
        for path in TESTS.rglob("*.py")
        if path.relative_to(TESTS).parts[0] != "support" and path.name != "conftest.py"
        if not path.name.startswith("test_")
    ]
    assert loose == [], "move shared helpers into tests/support/ (one module a concern)"


def imported_modules(node: ast.AST) -> list[str | None]:
    if isinstance(node, ast.ImportFrom):
        return [node.module]
    return [alias.name for alias in node.names] if isinstance(node, ast.Import) else []


def test_no_test_imports_from_a_conftest() -> None:
    importers = [
        str(path.relative_to(TESTS))
        for path in TESTS.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if "conftest" in imported_modules(node)
    ]
    assert importers == [], "import shared helpers from tests/support/, not from a conftest"
