"""bench/lib/: where the peer's example comes from (a folder, or a google/flax git dir), its import with
stubs for the imports it never calls, and the HLO dot reader, on hand-made inputs."""

import subprocess
import sys
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from bench import lib
from bench.lib import flax_example

ROOT = Path(__file__).resolve().parents[2]


def git(*args, cwd):
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture
def flax_git_dir(tmp_path):
    """A google/flax-like git repository whose examples/wmt holds one train.py; returns its .git folder."""
    repo = tmp_path / "flax"
    (repo / "examples" / "wmt").mkdir(parents=True)
    (repo / "examples" / "wmt" / "train.py").write_text("STEP = 'first'\n")
    git("init", "-q", cwd=repo)
    git("add", ".", cwd=repo)
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one", cwd=repo)
    return repo / ".git"


def test_the_example_folder_is_the_argument_else_flax_wmt_dir_else_extracted_from_flax_git_dir(
    flax_git_dir, tmp_path, monkeypatch
):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.delenv("FLAX_WMT_DIR", raising=False)
    monkeypatch.delenv("FLAX_GIT_DIR", raising=False)
    assert lib.flax_wmt_dir() == ""
    monkeypatch.setenv("FLAX_GIT_DIR", str(flax_git_dir))
    extracted = lib.flax_wmt_dir()
    assert Path(extracted).is_relative_to(tmp_path / "tmp")
    assert (Path(extracted) / "train.py").read_text() == "STEP = 'first'\n"
    assert lib.flax_wmt_dir() == extracted  # one extraction a commit
    monkeypatch.setenv("FLAX_WMT_DIR", "/some/wmt")
    assert lib.flax_wmt_dir() == "/some/wmt"
    assert lib.flax_wmt_dir("/given") == "/given"


@pytest.fixture
def clean_imports(monkeypatch):
    """sys.path and the modules imported inside the test restored afterwards."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        del sys.modules[name]


def test_the_example_imports_with_stubs_for_what_it_never_calls_and_never_from_elsewhere(
    tmp_path, monkeypatch, clean_imports
):
    monkeypatch.setattr(flax_example, "STUBBABLE", ("clu", "clu.metric_writers"))  # clu is not installed here
    (tmp_path / "wmt_example_train.py").write_text("from clu import metric_writers\nWRITER = metric_writers\n")
    (train,), stubbed = lib.import_flax_example(str(tmp_path), ("wmt_example_train",))
    assert train.WRITER is sys.modules["clu.metric_writers"] and "stub" in train.WRITER.__doc__
    assert [s.split()[0] for s in stubbed] == ["clu", "clu.metric_writers"]
    with pytest.raises(ImportError, match="'json' was imported from .*not from Flax's example"):
        lib.import_flax_example(str(tmp_path), ("json",))  # found outside the example's folder


def test_with_the_stub_switch_on_nothing_stubbable_is_imported(tmp_path, monkeypatch, clean_imports):
    monkeypatch.setenv(lib.STUB_ENV, "1")
    monkeypatch.setattr(flax_example, "STUBBABLE", ("json",))  # importable, yet stubbed
    monkeypatch.delitem(sys.modules, "json")
    (tmp_path / "wmt_example_uses_json.py").write_text("import json\nDOC = json.__doc__\n")
    (module,), stubbed = lib.import_flax_example(str(tmp_path), ("wmt_example_uses_json",))
    assert module.DOC.startswith("stub: real import failed with ImportError: not imported") and stubbed[0].startswith(
        "json "
    )


def test_hlo_dots_reads_each_dot_with_its_shapes_and_dimension_numbers():
    a, b = jnp.ones((2, 4, 3)), jnp.ones((2, 3, 5))
    hlo = jax.jit(lambda a, b: jnp.einsum("bij,bjk->bik", a, b)).lower(a, b).compile().as_text()  # as peer.py reads it
    if " dot(" not in hlo:  # XLA's compiled form is its own to change: a library fusion has no dot to read
        pytest.skip(
            f"XLA in jax {jax.__version__} compiles this einsum without an HLO dot; hlo_dots has nothing to read"
        )
    assert lib.hlo_dots(hlo) == [(((2, 4, 3), "f32"), ((2, 3, 5), "f32"), "f32", (((2,), (1,)), ((0,), (0,))))]


def test_the_library_imports_without_jax_or_the_project():
    """As bench/torch_sdpa.py needs it under a Python with torch and NumPy only."""
    blocked = ["jax", "jaxlib", "flax", "optax", "attention", "models", "training", "configs", "backends"]
    code = (
        "import sys\n"
        + "".join(f"sys.modules[{name!r}] = None\n" for name in blocked)
        + "from bench import lib\nprint(lib.median_ms(lambda: None, 3) >= 0, lib.cpu_description() != '')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["True", "True"]
