"""Sharded training on 8 fake CPU devices (in a subprocess) against the plain one-device step; the rules and checks."""

import json
import os
import subprocess
import sys
from pathlib import Path

import ml_collections
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from configs import default
from training import config as config_lib
from training.parallel import distributed, sharding

ROOT = Path(__file__).resolve().parents[3]
TOL = 1e-5


# The checks run 7 trainings (2 one-device references, 4 meshes, pmap) on 8 fake devices in a subprocess:
# seven trainings' compiles, so the tests that read them are end-to-end runs, marked slow (`pytest -m slow`).
slow = pytest.mark.slow


@pytest.fixture(scope="module")
def checks():
    # LLVM's -O0 halves the compile time of these tiny programs; the reference runs under the same flags.
    flags = "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0"
    env = dict(os.environ, XLA_FLAGS=flags, PYTHONPATH=str(ROOT))
    run = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("sharding_checks.py"))],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout)


@slow
@pytest.mark.parametrize("run", ["mha_4x2", "mha_2x4", "gqa_4x2", "gqa_2x4"])
def test_sharded_step_equals_the_one_device_step(checks, run):
    assert checks["devices"] == 8
    diff = checks["equal"][run]
    assert diff["init"] == 0.0  # sharded init draws the same parameters
    assert diff["loss"] < TOL and diff["grads"] < TOL and diff["params"] < TOL, diff


# Hand-derived for d_model 32, 4 heads of 8, 2 KV heads, MLP 64, vocab 64: (spec, one device's shard shape).
EXPECTED = {
    "gqa_4x2": {  # model=2: both KV heads split; embeddings replicated
        "encoder/layer_0/self_attention/query/kernel": ([None, "model", None], [32, 2, 8]),
        "encoder/layer_0/self_attention/key/kernel": ([None, "model", None], [32, 1, 8]),
        "decoder/layer_0/cross_attention/value/bias": (["model", None], [1, 8]),
        "decoder/layer_0/self_attention/out/kernel": (["model", None, None], [2, 8, 32]),
        "decoder/layer_0/mlp/wi/kernel": ([None, "model"], [32, 32]),
        "decoder/layer_0/mlp/wi/bias": (["model"], [32]),
        "decoder/layer_0/mlp/wo/kernel": (["model", None], [32, 32]),
        "embed/embedding": ([], [64, 32]),
        "encoder/layer_0/ln_self/scale": ([], [32]),
    },
    "gqa_2x4": {  # model=4: 2 KV heads cannot split four ways, so K/V are replicated; embeddings split by vocab
        "encoder/layer_0/self_attention/query/kernel": ([None, "model", None], [32, 1, 8]),
        "encoder/layer_0/self_attention/key/kernel": ([], [32, 2, 8]),
        "decoder/layer_0/cross_attention/value/bias": ([], [2, 8]),
        "decoder/layer_0/self_attention/out/kernel": (["model", None, None], [1, 8, 32]),
        "decoder/layer_0/mlp/wi/kernel": ([None, "model"], [32, 16]),
        "decoder/layer_0/mlp/wi/bias": (["model"], [16]),
        "decoder/layer_0/mlp/wo/kernel": (["model", None], [16, 32]),
        "embed/embedding": (["model", None], [16, 32]),
        "encoder/layer_0/ln_self/scale": ([], [32]),
    },
}


@slow
@pytest.mark.parametrize("run", sorted(EXPECTED))
def test_parameters_and_adam_moments_are_sharded_by_the_rules(checks, run):
    for name, (spec, shard_shape) in EXPECTED[run].items():
        got = checks["sharding"][run][name]
        assert got["spec"] == spec, name
        assert got["shard_shape"] == shard_shape and got["mu_shard_shape"] == shard_shape, name


@slow
def test_pmap_matches_jit_on_the_same_global_batch(checks):
    pmap = checks["pmap"]
    np.testing.assert_allclose(pmap["losses"], pmap["jit_4x2_losses"], rtol=0, atol=TOL)
    assert pmap["loss"] < TOL and pmap["grads"] < TOL and pmap["params"] < TOL, pmap


@slow
def test_a_checkpoint_written_on_one_mesh_restores_on_another(checks):
    restore = checks["restore"]
    assert restore["step"] == 2 and restore["max_diff"] == 0.0
    assert restore["saved_query_shard_shape"] == [32, 2, 8]  # written with model=2
    assert restore["query_shard_shape"] == [32, 1, 8] and restore["query_spec"] == [
        None,
        "model",
        None,
    ]  # read with model=4


@slow
def test_bad_meshes_fail_before_compiling(checks):
    errors = checks["errors"]
    assert "3 * 2 = 6" in errors["product"] and "8" in errors["product"]
    assert "do not split" in errors["rest"]
    assert "num_heads (4)" in errors["heads"]


@pytest.mark.parametrize("data, model, devices, expected", [(-1, 2, 8, (4, 2)), (2, -1, 8, (2, 4)), (1, 1, 1, (1, 1))])
def test_mesh_shape_resolves_the_rest(data, model, devices, expected):
    assert sharding.mesh_shape(data, model, devices) == expected


@pytest.mark.parametrize("data, model, match", [(-1, -1, "both -1"), (0, 1, "mesh.data = 0"), (2, 2, "2 \\* 2 = 4")])
def test_mesh_shape_rejects(data, model, match):
    with pytest.raises(ValueError, match=match):
        sharding.mesh_shape(data, model, 8)


def test_param_spec_rules():
    spec = sharding.param_spec
    assert spec("params/decoder/layer_0/cross_attention/query/kernel", (512, 8, 64), 4, False) == P(None, "model", None)
    assert spec("opt_state/1/0/mu/encoder/layer_1/self_attention/key/kernel", (512, 2, 64), 2, False) == P(
        None, "model", None
    )
    assert spec("encoder/layer_1/self_attention/key/kernel", (512, 2, 64), 4, False) == P()  # GQA: too few KV heads
    assert spec("encoder/layer_1/self_attention/out/bias", (512,), 4, False) == P()
    assert spec("embed/embedding", (8000, 512), 4, False) == P()
    assert spec("embed/embedding", (8000, 512), 4, True) == P("model", None)
    assert spec("decoder/logits/kernel", (512, 8000), 4, True) == P(None, "model")
    with pytest.raises(ValueError, match="shard_embeddings=False"):
        spec("embed/embedding", (8001, 512), 4, True)


def tiny(**mesh):
    config = default.get_config()
    config.mesh.update(mesh)
    return config


@pytest.mark.parametrize(
    "mesh, match",
    [
        (dict(model=8), "at most config.model.num_heads"),
        (dict(model=3), "divisor of config.model.num_heads"),
        (dict(data=0), "mesh.data"),
        (dict(model=-2), "mesh.model"),
    ],
)
def test_config_rejects_bad_meshes(mesh, match):
    with pytest.raises(ValueError, match=match):
        config_lib.validate(tiny(**mesh))


def test_config_rejects_pmap_with_model_shards_and_bad_distributed_fields():
    config = tiny(model=2)
    config.parallelism = "pmap"
    with pytest.raises(ValueError, match="config.mesh.model = 2"):
        config_lib.validate(config)
    config = tiny()
    config.distributed.initialize = "yes"
    with pytest.raises(ValueError, match="config.distributed.initialize"):
        config_lib.validate(config)


@pytest.mark.parametrize(
    "mode, address, environ, expected",
    [
        ("auto", "", {}, False),
        ("auto", "", {"SLURM_NTASKS": "1"}, False),
        ("auto", "", {"SLURM_NTASKS": "16"}, True),
        ("auto", "", {"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234"}, True),
        ("auto", "10.0.0.1:1234", {}, True),
        ("always", "", {}, True),
        ("never", "10.0.0.1:1234", {"SLURM_NTASKS": "16"}, False),
    ],
)
def test_when_jax_distributed_is_initialized(mode, address, environ, expected):
    settings = ml_collections.ConfigDict(
        dict(initialize=mode, coordinator_address=address, num_processes=0, process_id=-1)
    )
    assert distributed.requested(settings, environ) is expected
