"""The shape of attention/: the two layer faces stay thin adapters and no function grows long.

The limits are the ones the package is held to (docs/attention.md, "The two faces"): a face maps
Flax's conventions onto `attention.multihead` and holds no attention logic of its own, so a
face past 200 lines or a function past 60 is a sign that logic is gathering in the wrong place.
"""

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "attention"
FACES = ("layer.py", "nnx.py")
MAX_FACE_LINES = 200
MAX_FUNCTION_LINES = 60


def function_lengths(path: pathlib.Path) -> dict[str, int]:
    """`{"file:line name": lines}` for every function and method in `path` (decorators not counted)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return {
        f"{path.name}:{node.lineno} {node.name}": node.end_lineno - node.lineno + 1
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    }


@pytest.mark.parametrize("face", FACES)
def test_each_face_is_at_most_200_lines(face):
    lines = len((PACKAGE / face).read_text().splitlines())
    assert lines <= MAX_FACE_LINES, f"attention/{face} has {lines} lines; a face is at most {MAX_FACE_LINES}"


def test_no_function_in_attention_is_over_60_lines():
    lengths = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        lengths.update({f"{path.parent.relative_to(PACKAGE.parent)}/{k}": n for k, n in function_lengths(path).items()})
    assert len(lengths) > 100  # the walk found the package's functions, not an empty folder
    long = {name: n for name, n in lengths.items() if n > MAX_FUNCTION_LINES}
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_function_lengths_counts_a_known_function(tmp_path):
    """The measure itself: `outer` spans 4 lines, the nested `inner` 2, each counted on its own."""
    path = tmp_path / "m.py"
    path.write_text("def outer():\n    def inner():\n        return 1\n    return inner\n")
    assert function_lengths(path) == {"m.py:1 outer": 4, "m.py:2 inner": 2}
