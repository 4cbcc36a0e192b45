"""Import Flax examples/wmt's modules where its data-side dependencies are missing.

The example's `train.py` imports `tensorflow` and `clu` (metric writers, periodic actions) and its
`input_pipeline.py` imports `tensorflow_datasets`, `tensorflow_text` and clu's `deterministic_data`;
the train step, `predict_step` and beam search never call any of them. Where one cannot be
imported (an image without TensorFlow, a GPU image for instance), an empty module stands in for it,
and the stubs are listed in the scripts' JSON lines. With `STUB_ENV` set to 1 in the environment they
stand in without an import being tried (bench/gpu_report.py: importing TensorFlow costs seconds a
process, and on a GPU it would take GPU memory the step needs). Standard library only.
"""

from __future__ import annotations

import importlib
import os
import sys
import types

STUBBABLE = ("tensorflow", "clu", "clu.metric_writers", "clu.periodic_actions", "input_pipeline")
STUB_ENV = "FLAX_WMT_STUB_DATA"  # "1": stub every STUBBABLE module, importing none of them


def import_example(wmt_dir: str, names: tuple[str, ...]) -> tuple[list, list[str]]:
    """(the example's modules `names`, e.g. ("train", "models"), the stubs that stood in for missing imports)."""
    sys.path.insert(0, os.path.abspath(wmt_dir))
    stubbed = []
    forced = os.environ.get(STUB_ENV) == "1"
    for name in STUBBABLE:
        try:
            if forced:
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
    return [importlib.import_module(m) for m in names], stubbed


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
