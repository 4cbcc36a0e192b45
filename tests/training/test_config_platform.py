"""The target platform reaches the model: a program compiled for a TPU or GPU on this CPU gets that target's hooks.

`training.config.model_config(..., platform=)` passes the platform to `backends.model_hooks`, resolves
`model.dtype = "auto"` for it (bfloat16 without measuring this host, for an accelerator), and the
Table 3 preset's `model.matmul = "auto"` is the row-major product on the CPU and XLA's dots off it. Lowered for
"tpu" and "cuda" (`jax.export`, no accelerator needed) the train step's StableHLO holds no XLA:CPU hook: no
optimisation barrier (cache writes, row-major transposes), dense dots in the compute dtype.
"""

import re

import jax
import jax.numpy as jnp
import pytest

from attention.impl import jax_nn
from backends import xla_cpu, xla_cpu_bf16
from configs import default, table3_preset
from models import Transformer
from training import config as config_lib
from training.core import precision

VOCAB = 64
DOT = re.compile(r"stablehlo\.dot_general .*?: \((tensor<[^>]*>), (tensor<[^>]*>)\) -> (tensor<[^>]*>)")


def _preset(dtype="bfloat16"):
    """The Table 3 preset at a tiny size, dtype as given."""
    config = table3_preset.apply(default.get_config())
    config.model.update(d_model=32, num_heads=4, mlp_dim=64, max_len=16)
    config.model.dtype = dtype
    config.data.vocab_size = VOCAB
    return config


def _no_measuring(*args, **kwargs):
    raise AssertionError("model.dtype 'auto' measured the host for another target")


def _train_hlo(model_config, platform):
    """StableHLO, lowered for `platform`, of the cross-entropy's gradient with dropout on."""
    model = Transformer(model_config)
    tokens = jax.ShapeDtypeStruct((2, 8), jnp.int32)
    params = jax.eval_shape(lambda s, t: model.init(jax.random.key(0), s, t)["params"], tokens, tokens)

    def loss(params, src, tgt, key):
        logits = model.apply({"params": params}, src, tgt, train=True, rngs={"dropout": key})
        return -jnp.take_along_axis(jax.nn.log_softmax(logits.astype(jnp.float32)), tgt[..., None], -1).mean()

    key = jax.ShapeDtypeStruct((2,), jnp.uint32)
    return jax.export.export(jax.jit(jax.grad(loss)), platforms=(platform,))(params, tokens, tokens, key).mlir_module()


@pytest.mark.parametrize("platform", ["tpu", "cuda"])
def test_the_preset_compiled_for_an_accelerator_carries_no_cpu_hook(monkeypatch, platform):
    monkeypatch.setattr(precision, "machine_choice", _no_measuring)
    model_config = config_lib.model_config(_preset("auto"), VOCAB, platform=platform)
    assert model_config.dtype == jnp.bfloat16  # 'auto' for an accelerator: bfloat16, this host unmeasured
    assert model_config.dot_general is None and model_config.dropout_keep is None  # XLA's dots taken
    assert model_config.formulation.platform == platform and not isinstance(
        model_config.formulation, xla_cpu.XlaCpuFormulation
    )
    hlo = _train_hlo(model_config, platform)
    assert "optimization_barrier" not in hlo
    dense = [
        d for d in DOT.findall(hlo) if d[0].count("x") < 5 and d[1].count("x") < 5
    ]  # not attention's grouped products
    assert dense and all(t.endswith("xbf16>") for d in dense for t in d), dense  # bf16 operands and results


def test_cpu_runs_keep_the_preset_row_major_product():
    cpu = config_lib.model_config(_preset(), VOCAB, platform="cpu")
    assert cpu.dot_general is xla_cpu_bf16.row_major_dot_general and cpu.dropout_keep is xla_cpu.dropout_keep
    assert "optimization_barrier" in _train_hlo(cpu, "tpu")  # the check above can fail: CPU hooks show


def test_auto_dtype_measures_the_host_for_a_cpu_target(monkeypatch, tmp_path):
    measured = []
    monkeypatch.setattr(precision, "machine_choice", lambda *a, **k: measured.append(1) or {"dtype": "float32"})
    assert precision.resolve("auto", tmp_path, platform="cpu") == "float32" and measured
    assert precision.resolve("auto", tmp_path, platform="tpu") == "bfloat16" and len(measured) == 1
    assert precision.resolve("float32", tmp_path, platform="tpu") == "float32"  # a pinned dtype is kept


def test_cudnn_head_dim_limit_for_a_named_target_reads_no_device(monkeypatch):
    if jax.default_backend() == "gpu":
        pytest.skip("on a GPU the named target is this process's device, which is read")
    monkeypatch.setattr(jax, "devices", lambda *a: (_ for _ in ()).throw(AssertionError("jax.devices() read")))
    assert jax_nn.cudnn_max_head_dim("cuda") == 128
