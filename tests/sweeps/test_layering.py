"""The experiment driver sits on top: sweeps/ imports training/, and nothing in training/ imports sweeps/."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def test_training_never_imports_sweeps():
    offenders = {
        str(p.relative_to(ROOT)): sorted(m for m in imported_modules(p) if m == "sweeps" or m.startswith("sweeps."))
        for p in (ROOT / "training").rglob("*.py")
    }
    assert {p: m for p, m in offenders.items() if m} == {}
    assert any(
        m.startswith("training") for m in imported_modules(ROOT / "sweeps" / "point_run.py")
    )  # the scan sees imports
