"""bench/gpu_report.py: its dry run (every part at toy sizes), the trace reader, and benches on a backend
whose `compiled.cost_analysis()` is None (as seen on a GPU)."""

import gzip
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bench import gpu_report, lib, train_step

ROOT = Path(__file__).resolve().parents[2]


def test_compiled_flops_counts_and_is_nan_without_a_cost_analysis(monkeypatch):
    lowered = jax.jit(lambda a: a @ a).lower(jnp.ones((8, 8)))
    assert lib.compiled_flops(lowered) == pytest.approx(2 * 8**3, rel=0.1)
    assert lib.compiled_flops(type("C", (), {"cost_analysis": lambda self: [{"flops": 3.0}]})()) == 3.0
    monkeypatch.setattr(jax.stages.Compiled, "cost_analysis", lambda self: None)  # as a GPU backend answered
    assert math.isnan(lib.compiled_flops(lowered))


def test_bench_train_step_survives_a_backend_without_cost_analysis(monkeypatch):
    monkeypatch.setattr(jax.stages.Compiled, "cost_analysis", lambda self: None)
    monkeypatch.setitem(train_step.SIZES, "toy", (dict(d_model=16, num_heads=2, num_layers=1, mlp_dim=32), 2, 8, 1.0))
    n_params, rows, length, seconds, flops, _ = train_step.bench("toy", "float32", reps=1)
    assert math.isnan(flops) and seconds > 0 and n_params > 0 and (rows, length) == (2, 8)


def test_top_kernels_reads_device_events_and_skips_the_python_tracer(tmp_path):
    trace = {
        "traceEvents": [
            {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/device:GPU:0"}},
            {"ph": "M", "name": "process_name", "pid": 2, "args": {"name": "/host:CPU"}},
            {"ph": "X", "pid": 1, "name": "gemm", "dur": 300.0},
            {"ph": "X", "pid": 1, "name": "gemm", "dur": 100.0},
            {"ph": "X", "pid": 1, "name": "softmax", "dur": 50.0},
            {"ph": "X", "pid": 2, "name": "host_op", "dur": 9e6},
        ]
    }
    folder = tmp_path / "plugins" / "profile" / "run"
    folder.mkdir(parents=True)
    (folder / "host.trace.json.gz").write_bytes(gzip.compress(json.dumps(trace).encode()))
    assert gpu_report.top_kernels(tmp_path) == [("gemm", 0.4, 2), ("softmax", 0.05, 1)]
    assert gpu_report.top_kernels(tmp_path / "missing") == []


def test_device_us_is_the_mean_of_queued_calls():
    calls = []
    us = gpu_report.device_us(lambda x: calls.append(1) or x + 1, (np.zeros(3),), calls=5)
    assert len(calls) == 6 and us > 0  # one warm-up, five timed


def test_wall_split_of_a_hand_worked_run():
    """Two dev evaluations, compiles in the first step, in an evaluation and elsewhere; times in seconds."""
    log = [
        (0.0, "persistent compilation cache: x"),
        (10.0, "model parameters: 123"),
        (14.0, "first step done 14.0s after the start"),
        (20.0, "step 2/4 loss 9"),
        (23.0, "dev {'step': 2}"),
        (30.0, "step 4/4 loss 8"),
        (31.5, "dev {'step': 4}"),
    ]
    compiles = [
        (9.0, 2.0),
        (13.0, 3.0),
        (22.0, 1.0),
        (25.0, 0.5),
    ]  # (end time, seconds): init, the step, eval, elsewhere
    records = [{"step": 2, "step_time_s": 3.0}, {"step": 2, "split": "val"}, {"step": 4, "step_time_s": 1.0}]
    split = gpu_report.wall_split(log, compiles, records, train_s=40.0)
    assert split["evaluations"] == [(20.0, 23.0), (30.0, 31.5)]
    assert split["compile_s"] == pytest.approx(6.5)
    assert split["eval_s"] == pytest.approx((3.0 - 1.0) + 1.5)  # the evaluation's own compile counted as compiling
    assert split["steps_s"] == pytest.approx(2 * 3.0 + 2 * 1.0 - 3.0)  # the first step's compile counted as compiling
    assert split["rest_s"] == pytest.approx(40.0 - 6.5 - 5.0 - 3.5)


# an image without TensorFlow or clu (the GPU image): every import of them fails, as where they are not installed
WITHOUT_TENSORFLOW = """import sys
for name in ("tensorflow", "tensorflow_datasets", "tensorflow_text", "clu"):
    sys.modules[name] = None
"""


@pytest.mark.slow
def test_dry_run_writes_every_part(tmp_path):
    """Every part at toy sizes on this backend, without TensorFlow or clu importable; the peer's parts need
    FLAX_WMT_DIR and say so without it."""
    if not os.environ.get("MULTI30K_DIR"):
        pytest.skip("MULTI30K_DIR is not set (.ci/run sets it to the shared offline copy)")
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(WITHOUT_TENSORFLOW)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), *filter(None, [os.environ.get("PYTHONPATH")])]),
    }
    out = tmp_path / "gpu.md"
    done = subprocess.run(
        [sys.executable, "-m", "bench.gpu_report", "--dry_run", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = out.read_text()
    for part in gpu_report.PARTS:
        assert re.search(rf"^## {part} \(\d+ s; \d+ s CPU\)$", report, re.M), part
    assert "Failed:" not in report, report
    assert re.search(r"^    \d+ passed", report, re.M)  # the suite's summary line
    for row in ("of it compiling (XLA)", "of it steps", "of it dev evaluation", "test split, beam 4"):
        assert row in report
    assert "programs compiled in" in report  # the preset run's own line
    if os.environ.get("FLAX_WMT_DIR"):
        assert report.count("(3 traced steps") == 2  # ours and the peer's top kernels
        assert "ours / peer" in report and "vs peer" in report
    else:
        assert report.count("Skipped: no snapshot of Flax's examples/wmt") == 2


def test_attention_family_plans_survive_a_backend_without_memory_analysis(monkeypatch):
    from bench import attention_family

    step = jax.jit(lambda q, k, v, params: q @ k.T @ v)
    x = jnp.ones((8, 8))
    assert (
        8 * 8 * 4 / 2**30 <= attention_family.planned_gib(step, None, x, x, x) < 2**-16
    )  # at least the output, far below a MiB
    monkeypatch.setattr(jax.stages.Compiled, "memory_analysis", lambda self: None)
    assert math.isnan(attention_family.planned_gib(step, None, x, x, x))
