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


# sweeps/tables/, top to bottom: a module imports only modules of lower layers (so no cycle), never the package
# itself (its __init__ imports every module); the units of one layer do not import each other.
TABLES_LAYERS = (
    ("collect",),  # a sweep's page, CSV and plots put together
    ("sensitivity",),
    ("comparisons", "aggregate", "dev_curves", "plots"),
    ("batches",),
    ("cells", "paper", "prose"),
)


def test_the_tables_package_is_layered():
    folder = ROOT / "sweeps" / "tables"
    layer = {name: i for i, names in enumerate(TABLES_LAYERS) for name in names}
    assert {p.stem for p in folder.glob("*.py")} - {"__init__"} == set(layer)  # a new module needs a layer
    wrong = []
    for name in layer:
        tree = ast.parse((folder / f"{name}.py").read_text(encoding="utf-8"))
        relative = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level]
        wrong += [f"{name}: a relative import on line {line}" for line in relative]
        for module in imported_modules(folder / f"{name}.py"):
            if module == "sweeps.tables" or module.startswith("sweeps.tables."):
                target = module.removeprefix("sweeps.tables").removeprefix(".")
                if target not in layer or layer[target] <= layer[name]:
                    wrong.append(f"{name} -> {module}")
    assert wrong == []
