"""training/ is layered top to bottom: the run's orchestration on top, the utilities everything uses at the bottom.

Every package (or top-level module) of training/ has a layer in `LAYERS`. A module imports its own
package or a lower layer, never a higher one (a back-arrow), so a utility never reaches up into the
code that uses it; and the modules' import graph has no cycle. A new package must be given a layer.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Top to bottom; the units of one layer do not import each other.
LAYERS = (
    # loop.py: one training run, top to bottom, on its helpers (workdir, divergence, stopping, window); aot/: its
    # programs compiled for a target; nothing in training/ imports them
    ("run",),
    ("evaluation",),  # a trained run read back: dev loss and BLEU, eval.py's work, decoding
    # the validated config and the model it implies; saved train states; the training split prepared once
    ("config", "checkpoints", "prepared"),
    ("parallel",),  # the step on the devices: jit / pmap trainers, mesh and sharding rules, multi-process
    ("core",),  # the step and optimizer, compute dtype, compile cache, workdir files, locks, errors, logs
    ("data",),  # corpora, vocabulary, batches
)


def module_paths(package: str = "training") -> dict[str, Path]:
    """Dotted module name -> file, for every module of `package` (a package by its __init__.py)."""
    modules = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules among `modules` it imports (at the top or inside a function)."""

    def known(name):  # the longest prefix of `name` that is one of `modules` ('' if none)
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    graph = {}
    for name, path in modules.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets.update(known(alias.name) for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the module's package, up level - 1 more
                    package = name.split(".")[: len(name.split(".")) - node.level + (path.name == "__init__.py")]
                    base = ".".join(package + ([base] if base else []))
                for alias in node.names:  # `from pkg import module` names a module, `from module import f` does not
                    targets.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else known(base))
        graph[name] = targets - {"", name}
    return graph


def unit(module: str) -> str:
    """training.X.Y -> X: the package (or top-level module) a layer holds."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def layer_of(module: str, layers=LAYERS) -> int | None:
    return next((i for i, units in enumerate(layers) if unit(module) in units), None)


def back_arrows(graph: dict[str, set[str]], layers=LAYERS) -> list[str]:
    """Imports of a module in another unit of the same or a higher layer (the package's __init__ aside)."""
    return sorted(
        f"{a} -> {b}"
        for a, targets in graph.items()
        for b in targets
        if unit(a) and unit(b) and unit(a) != unit(b) and layer_of(b, layers) <= layer_of(a, layers)
    )


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each module that lies on one (depth-first search), as [m, ..., m]."""
    found, done = [], set()

    def visit(node, stack):
        if node in stack:
            found.append(stack[stack.index(node) :] + [node])
            return
        if node in done:
            return
        for target in sorted(graph.get(node, ())):
            visit(target, stack + [node])
        done.add(node)

    for node in sorted(graph):
        visit(node, [])
    return found


def test_every_training_package_has_a_layer():
    modules = module_paths()
    assert {m: unit(m) for m in modules if unit(m) and layer_of(m) is None} == {}
    assert {u for units in LAYERS for u in units} == {unit(m) for m in modules if unit(m)}  # no stale layer either


def test_no_back_arrows_and_no_cycles_inside_training():
    graph = import_graph(module_paths())
    assert back_arrows(graph) == []
    assert cycles(graph) == []
    # the scan sees the imports: the loop reaches every layer below it, and its helpers beside it in run/ (which,
    # by the cycle check, never import it)
    assert {layer_of(m) for m in graph["training.run.loop"]} == set(range(len(LAYERS)))


def test_no_import_cycle_in_any_package():
    # the attention library included: its core imports the implementations' table, which must not import it back
    modules = {}
    for package in ("attention", "models", "backends", "training", "sweeps", "analysis", "bench"):
        modules.update(module_paths(package))
    graph = import_graph(modules)
    assert "attention.impl" in graph["attention.core"]  # the scan sees the edge a cycle would close
    assert cycles(graph) == []


def test_the_checks_find_a_back_arrow_and_a_cycle():
    # a hand-made graph: the step reaching up into the loop, and two utilities importing each other
    graph = {
        "training.run.loop": {"training.core.step"},
        "training.core.step": {"training.run.loop"},
        "training.core.files": {"training.core.lock"},
        "training.core.lock": {"training.core.files"},
        "training.data.batching": set(),
    }
    assert back_arrows(graph) == ["training.core.step -> training.run.loop"]
    assert cycles(graph) == [
        ["training.core.files", "training.core.lock", "training.core.files"],
        ["training.core.step", "training.run.loop", "training.core.step"],
    ]
    assert back_arrows({"training.config": {"training.checkpoints"}}) == ["training.config -> training.checkpoints"]
