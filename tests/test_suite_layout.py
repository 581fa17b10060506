"""The suite's own layout rule (docs/contributing.md, "Test helpers"): a test module imports its
helpers from tests/support or a folder's plain helper module, never from another test module or
a conftest.py, whose fixtures pytest injects and whose import would run it twice."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def imported_modules(path: Path) -> list[str]:
    package = ".".join(path.relative_to(TESTS.parent).parent.parts)
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1]
            module = node.module or ""
            full = module if node.level == 0 else ".".join([*base, *filter(None, [module])])
            found.append(full)
            found.extend(f"{full}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
    return found


def forbidden(module: str) -> bool:
    parts = module.split(".")
    return parts[0] == "tests" and (
        parts[-1] == "conftest" or any(p.startswith("test_") for p in parts)
    )


def test_no_test_module_imports_another_test_module_or_a_conftest() -> None:
    offenders = {
        str(path.relative_to(TESTS.parent)): bad
        for path in sorted(TESTS.rglob("*.py"))
        if (bad := sorted({m for m in imported_modules(path) if forbidden(m)}))
    }
    assert not offenders, offenders


def test_the_rule_catches_both_forms() -> None:
    assert forbidden("tests.services.gateway.conftest")
    assert forbidden("tests.model.test_model.HELD_OUT")
    assert not forbidden("tests.support.waiting")
    assert not forbidden("hpc_ds1.eventlog.bus")
