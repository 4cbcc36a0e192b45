"""bench/ and experiments/ as the scripts-over-one-library shape they promise: every module imports the
project's packages and the two libraries (the package bench/lib/, the module experiments/lib.py), never
another script and never a private (_underscore) name."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("bench", "experiments")
LIBRARIES = {"bench.lib", "experiments.lib"}


def is_library(module: str) -> bool:
    return any(module == library or module.startswith(f"{library}.") for library in LIBRARIES)


def is_private(name: str) -> bool:
    return any(part.startswith("_") and not (part.startswith("__") and part.endswith("__")) for part in name.split("."))


def import_problems(source: str, package: str) -> list[str]:
    """What `source` (a module of `package`, dotted) imports that it should not: other scripts of bench/ or
    experiments/, or names beginning with an underscore."""
    problems = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [(alias.name, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:  # relative: from the package itself
                module = f"{package}.{module}".rstrip(".")
            # `from bench import peer` imports the module bench.peer; `from bench.lib import x`, the name x
            targets = [
                (f"{module}.{alias.name}" if module in PACKAGES else module, f"{module}.{alias.name}")
                for alias in node.names
            ]
        else:
            continue
        for module, name in targets:
            if module.split(".")[0] in PACKAGES and module not in PACKAGES and not is_library(module):
                problems.append(f"line {node.lineno}: imports the script {module}")
            if is_private(name):
                problems.append(f"line {node.lineno}: imports the private name {name}")
    return problems


def test_no_script_imports_another_script_or_a_private_name():
    files = [path for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))]
    assert len(files) > 20 and ROOT / "bench" / "lib" / "__init__.py" in files  # both folders read, the library too
    found = {
        f"{path.relative_to(ROOT)} {problem}"
        for path in files
        for problem in import_problems(path.read_text(), ".".join(path.parent.relative_to(ROOT).parts))
    }
    assert not found, "\n".join(sorted(found))


def test_the_check_catches_each_kind_of_import():
    bad = """
from __future__ import annotations
import bench.peer
from bench import peer, lib
from bench.train_step import SIZES
from experiments.masked_lm import mask_rows
from . import decode
from .lib import _helper
from models.decoding import _gather_cache
import training._private
"""
    assert import_problems(bad, "bench") == [
        "line 3: imports the script bench.peer",
        "line 4: imports the script bench.peer",
        "line 5: imports the script bench.train_step",
        "line 6: imports the script experiments.masked_lm",
        "line 7: imports the script bench.decode",
        "line 8: imports the private name bench.lib._helper",
        "line 9: imports the private name models.decoding._gather_cache",
        "line 10: imports the private name training._private",
    ]
    good = (
        "import bench.lib\nfrom bench import lib\nfrom bench.lib import SIZES\nfrom experiments.lib import fit\n"
        "from bench.lib.timing import median_ms\nimport jax\n"
    )
    assert import_problems(good, "experiments") == []
