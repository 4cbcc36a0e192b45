"""Import Flax examples/wmt's modules where its data-side dependencies are missing.

The example's `train.py` imports `tensorflow` and `clu` (metric writers, periodic actions) and its
`input_pipeline.py` imports `tensorflow_datasets`, `tensorflow_text` and clu's `deterministic_data`;
the train step, `predict_step` and beam search never call any of them. Where one cannot be
imported (an image without TensorFlow, a GPU image for instance), an empty module stands in for it,
and the stubs are listed in the scripts' JSON lines. Standard library only.
"""

from __future__ import annotations

import importlib
import os
import sys
import types

STUBBABLE = ("tensorflow", "clu", "clu.metric_writers", "clu.periodic_actions", "input_pipeline")


def import_example(wmt_dir: str, names: tuple[str, ...]) -> tuple[list, list[str]]:
    """(the example's modules `names`, e.g. ("train", "models"), the stubs that stood in for missing imports)."""
    sys.path.insert(0, os.path.abspath(wmt_dir))
    stubbed = []
    for name in STUBBABLE:
        try:
            importlib.import_module(name)
        except Exception as e:  # missing, or broken (tensorflow_text against another TF)
            stub = types.ModuleType(name)
            stub.__doc__ = f"stub: real import failed with {type(e).__name__}: {e}"
            sys.modules[name] = stub
            parent, _, child = name.rpartition(".")
            if parent:
                setattr(sys.modules[parent], child, stub)
            stubbed.append(f"{name} ({type(e).__name__}: {str(e)[:120]})")
    return [importlib.import_module(m) for m in names], stubbed
