"""`sweep.py plan`: every point of a sweep compiled for a TPU target on this CPU, nothing trained.

Marked slow (two TPU compiles: 82 s on a shared core here). Skipped where the libtpu wheel (the `aot` extra) is absent.
"""

import io
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from sweeps import plan, schema
from training.run import aot

TINY = Path(__file__).with_name("tiny_sweep.py")


@pytest.mark.slow
@pytest.mark.skipif(
    not aot.has_libtpu(), reason="the libtpu wheel is absent: pip install -c requirements.lock -e '.[aot]'"
)
def test_plan_compiles_each_point_for_the_target():
    module, target = schema.load_module(TINY), aot.parse_target("tpu:v5e")
    rows = plan.plan(module, target)
    assert [r["point"] for r in rows] == ["h=1", "h=2"]
    for r in rows:
        assert r["refused"] is None and r["needs_bytes"] > 0 and r["flops"] > 0
        assert r["points_per_device"] == int(0.95 * 16 * aot.GIB // r["needs_bytes"]) > 1
    text = plan.table(rows, target)
    assert text.count("\n| h=") == 2 and "tpu:v5e:1x1 (16 GiB a device)" in text


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_the_plan_counts_its_compiles_on_a_bar(monkeypatch):
    # Fake compiles (a real one takes minutes for a large model): h=2 does not fit; each notes the bar as drawn.
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    seen = []

    def compile_programs(config, target, data, model, programs, devices):
        seen.append(terminal.getvalue().split("\r")[-1])
        if config == "h=2":
            raise aot.DoesNotFit("the train step needs 20.0 GiB a device; a v5e has 16")
        report = {"memory_bytes": {"needed": aot.GIB}, "hbm_share": 1 / 16, "flops": 1e9, "compile_s": 1.0}
        return {"train": {**report, "hbm_gib": 16, "target": "tpu:v5e:1x1"}}

    monkeypatch.setattr(aot, "compile_programs", compile_programs)
    module = SimpleNamespace(SWEEP_KEY="h", SWEEP_VALUES=(1, 2, 4), get_config=lambda point: point)
    rows = plan.plan(module, aot.parse_target("tpu:v5e"), devices=[])
    assert [(r["point"], r["points_per_device"]) for r in rows] == [("h=1", 15), ("h=2", 0), ("h=4", 15)]
    assert [s.split("|")[-1].split(", ")[-1] for s in seen] == [
        "h=1; 0 refused so far]",
        "h=2; 0 refused so far]",
        "h=4; 1 refused so far]",
    ]
    assert [s.split("|")[2].split()[0] for s in seen] == ["0/3", "1/3", "2/3"]
    assert terminal.getvalue().split("\r")[-1].startswith("[plan] compiling: 100%")
