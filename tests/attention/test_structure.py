"""The shape of attention/: each layer face reads top to bottom, calls the core once, projects out.

`bench.face_trace` follows one eager softmax GQA call of each face through the project's files: it
calls out of its own file a few times (a check, the core) and passes through at most 5 files (the
face, the settings checks, `attend`, the masks, the one-head formula; docs/layout.md draws the path).
Function size is held by ruff's complexity rules (C901, PLR0915), not here.
"""

import sys
import types

import pytest

from bench import face_trace

MAX_CALLS_OUT = 5
MAX_FILES = 5


@pytest.mark.parametrize(
    "make, face", [(face_trace.linen_run, "attention/layer.py"), (face_trace.nnx_run, "attention/nnx.py")]
)
def test_a_face_calls_out_at_most_5_times_through_at_most_5_files(make, face):
    result = face_trace.trace(make(), face)
    assert result["hops"] > 0 and "attention/core.py" in result["files"]  # the trace saw the call reach the core
    assert result["calls_out"] <= MAX_CALLS_OUT, f"{face} calls out {result['calls_out']} times: {result['by_callee']}"
    assert len(result["files"]) <= MAX_FILES, f"{face}'s call passes through {result['files']}"


def _module(tmp_path, name, source):
    """A module named `name` from `source`, its file under tmp_path (what `face_trace.project_file` is told is
    the project)."""
    path = tmp_path / "attention" / f"{name}.py"
    path.parent.mkdir(exist_ok=True)
    path.write_text(source)
    module = types.ModuleType(f"_structure_{name}")
    module.__file__ = str(path)
    exec(compile(source, str(path), "exec"), module.__dict__)
    sys.modules[module.__name__] = module
    return module


def test_the_trace_counts_calls_out_and_hops_of_a_known_example(tmp_path, monkeypatch):
    """face calls other.f twice and other.g once (g calls face.h back and other.k within its file):
    3 calls out of the face; hops face->other 3 and other->face 1; the call within a file is none."""
    monkeypatch.setattr(face_trace, "ROOT", tmp_path)
    other = _module(
        tmp_path, "other", "def k():\n    return 1\ndef f():\n    return 1\ndef g(cb):\n    return cb() + k()\n"
    )
    face = _module(tmp_path, "face", "def h():\n    return 2\ndef run(o):\n    return o.f() + o.f() + o.g(h)\n")
    result = face_trace.trace(lambda: face.run(other), "attention/face.py")
    assert result["calls_out"] == 3
    assert result["by_callee"] == {"attention/other.py:f": 2, "attention/other.py:g": 1}
    assert result["hops"] == 4
    assert result["files"] == ["attention/face.py", "attention/other.py"]
