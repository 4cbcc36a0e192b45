"""Two processes on localhost (jax.distributed, gloo on CPU) train like one process with the same global batch."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

import multiprocess_checks
import sharding_checks
from training import checkpoints

pytestmark = pytest.mark.slow  # two jax.distributed processes and a reference run: `pytest -m slow`
ROOT = Path(__file__).resolve().parents[3]
HERE = Path(__file__).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def two_process_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("two_processes")
    port = free_port()
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{HERE}", XLA_FLAGS="--xla_backend_optimization_level=0")
    env.pop("JAX_COORDINATOR_ADDRESS", None)
    procs = [
        subprocess.Popen(
            [sys.executable, str(HERE / "multiprocess_checks.py"), str(i), "2", str(port), str(workdir)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    outputs = [p.communicate(timeout=900)[0] for p in procs]
    for p, output in zip(procs, outputs):
        assert p.returncode == 0, output[-3000:]
    return workdir


@pytest.fixture(scope="module")
def one_process_run():
    """The same 5 steps on one device with a plain jit of the train step: the reference."""
    return sharding_checks.run(sharding_checks.make_config(4, 0.1), steps=multiprocess_checks.STEPS)


def test_two_processes_give_the_losses_of_one(two_process_run, one_process_run):
    records = [json.loads(line) for line in (two_process_run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5]  # written once, by process 0
    np.testing.assert_allclose([r["loss"] for r in records], one_process_run[0]["losses"], rtol=0, atol=1e-5)


def test_each_process_gathers_the_full_parameters(two_process_run, one_process_run):
    for i in range(2):
        np.testing.assert_allclose(
            np.load(two_process_run / f"params_{i}.npy"), one_process_run[0]["params"], rtol=0, atol=1e-5
        )


def test_the_checkpoint_both_processes_wrote_restores_in_one(two_process_run, one_process_run):
    _, reference_state = one_process_run
    ckpts = checkpoints.Checkpoints(two_process_run, 1)
    restored, step = ckpts.restore_latest(reference_state)
    ckpts.close()
    assert step == multiprocess_checks.STEPS
    for got, want in zip(jax.tree.leaves(restored.params), jax.tree.leaves(reference_state.params)):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
