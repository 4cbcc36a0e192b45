"""`sweep.py plan`: every point of a sweep compiled for a TPU target on this CPU, nothing trained.

Marked slow (two TPU compiles: 82 s on a shared core here). Skipped where the libtpu wheel (the `aot` extra) is absent.
"""

from pathlib import Path

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
