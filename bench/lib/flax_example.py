"""The peer: Flax's examples/wmt, found (a folder, or extracted from a google/flax git dir) and imported
unmodified, with empty stubs for the imports its train step and beam search never call.
"""

from __future__ import annotations

import importlib
import io
import os
import subprocess
import sys
import tarfile
import tempfile
import types
from pathlib import Path

# The example's imports that its train step, predict_step and beam search never call (metric writers,
# periodic actions, the TensorFlow input pipeline): an empty module stands in where one cannot be imported.
STUBBABLE = ("tensorflow", "clu", "clu.metric_writers", "clu.periodic_actions", "input_pipeline")
# "1" in the environment: stub every STUBBABLE module without trying its import (importing TensorFlow
# costs seconds a process, and on a GPU it would take memory the step needs)
STUB_ENV = "FLAX_WMT_STUB_DATA"


def add_peer_arguments(parser) -> None:
    """The Flax examples/wmt comparisons' shared options: --peer_python and --wmt_dir (`flax_wmt_dir`)."""
    parser.add_argument(
        "--peer_python", default=sys.executable, help="an interpreter with the peer's packages (default: this one)"
    )
    parser.add_argument(
        "--wmt_dir",
        default="",
        help="a snapshot of Flax's examples/wmt (default: $FLAX_WMT_DIR, "
        "else extracted from the google/flax git dir $FLAX_GIT_DIR)",
    )


def flax_wmt_dir(wmt_dir: str = "") -> str:
    """Flax's examples/wmt: `wmt_dir`, else $FLAX_WMT_DIR, else extracted from the google/flax git dir
    $FLAX_GIT_DIR (a bare repository or a clone's .git, as tests/attention/test_flax_dropin.py takes it)
    at $FLAX_GIT_REF (default HEAD) into a temporary folder named for the commit; "" when none is set."""
    wmt_dir = wmt_dir or os.environ.get("FLAX_WMT_DIR", "")
    git_dir = os.environ.get("FLAX_GIT_DIR", "")
    if wmt_dir or not git_dir:
        return wmt_dir
    git = ["git", f"--git-dir={git_dir}"]
    commit = subprocess.run(
        [*git, "rev-parse", os.environ.get("FLAX_GIT_REF", "HEAD")], check=True, capture_output=True, text=True
    ).stdout.strip()
    dest = Path(tempfile.gettempdir()) / f"flax-{commit[:12]}"
    if not (dest / "examples" / "wmt" / "train.py").exists():
        archive = subprocess.run([*git, "archive", commit, "examples/wmt"], check=True, capture_output=True).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(dest, filter="data")
    return str(dest / "examples" / "wmt")


def import_flax_example(wmt_dir: str, names: tuple[str, ...]) -> tuple[list, list[str]]:
    """(the example's modules `names`, e.g. ("train", "models"), the stubs that stood in for missing imports).

    The example's folder goes first on sys.path; a module found elsewhere (this repository's
    `models` package, say) is refused rather than timed as the peer's.
    """
    folder = Path(wmt_dir).resolve()
    sys.path.insert(0, str(folder))
    stubbed = []
    for name in STUBBABLE:
        try:
            if os.environ.get(STUB_ENV) == "1":
                raise ImportError(f"not imported: {STUB_ENV}=1")
            importlib.import_module(name)
        except Exception as e:  # missing, or broken (tensorflow_text against another TF)
            if name == "tensorflow":
                _import_flax_io_without_tensorflow()
            stub = _stub(name, f"stub: real import failed with {type(e).__name__}: {e}")
            sys.modules[name] = stub
            parent, _, child = name.rpartition(".")
            if parent:
                setattr(sys.modules[parent], child, stub)
            stubbed.append(f"{name} ({type(e).__name__}: {str(e)[:120]})")
    modules = [importlib.import_module(name) for name in names]
    for name, module in zip(names, modules):
        if not Path(module.__file__).resolve().is_relative_to(folder):
            raise ImportError(f"{name!r} was imported from {module.__file__}, not from Flax's example in {folder}")
    return modules, stubbed


def _import_flax_io_without_tensorflow() -> None:
    """Import `flax.io` (which the example's train.py reaches through flax.training.checkpoints) before
    TensorFlow's stub exists: it probes for TensorFlow with `importlib.util.find_spec`, which raises on
    a stub module (no spec). A None entry in sys.modules makes the probe answer "absent", installed or not."""
    absent = object()
    saved = sys.modules.get("tensorflow", absent)
    sys.modules["tensorflow"] = None
    try:
        importlib.import_module("flax.io")
    finally:
        if saved is absent:
            del sys.modules["tensorflow"]
        else:
            sys.modules["tensorflow"] = saved


def _stub(name: str, doc: str = "stub") -> types.ModuleType:
    """An empty module whose every public attribute is another stub: the example's module-level uses
    (annotations such as `tf.data.Dataset`) resolve, and nothing is ever called."""
    stub = types.ModuleType(name, doc)

    def attribute(attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        value = _stub(f"{name}.{attr}")
        setattr(stub, attr, value)
        return value

    stub.__getattr__ = attribute
    return stub
