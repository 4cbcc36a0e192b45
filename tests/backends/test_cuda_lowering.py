"""What a GPU would run: the Transformer's training step and a decode step lowered for CUDA on this machine.

`jax.export(..., platforms=("cuda",))` lowers without a GPU. With the hooks `backends.model_hooks`
picks for "cuda", the StableHLO must carry nothing tuned for XLA:CPU (no `optimization_barrier`, no
row-major product with its copied transposes, no float32 multiply-and-sum in place of a dot), take
its dots in the dtype the config asks for, and hold exactly the `dot_general`s of the plain
formulation (the config with no hooks at all). The CPU's hooks, lowered the same way, fail these
checks: the checks can fail.
"""

import collections
import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attention
import backends
from attention.impl import IMPLEMENTATIONS
from models import Transformer, TransformerConfig

VOCAB, BATCH, LENGTH = 32, 2, 8
# the default config's model at tiny sizes (dropout on, tied embeddings, pre-LN, vmap attention)
TINY = dict(vocab_size=VOCAB, d_model=32, num_heads=4, num_layers=2, mlp_dim=64, max_len=16)
DOT = re.compile(r"stablehlo\.dot_general .*?: \((tensor<[^>]*>), (tensor<[^>]*>)\) -> (tensor<[^>]*>)")


def _config(dtype, platform):
    """The default model config at `dtype`, with the hooks chosen for `platform` (None: no hooks, the plain
    formulation)."""
    config = TransformerConfig(**TINY, dtype=dtype)
    if platform is None:
        return config
    return dataclasses.replace(config, **backends.model_hooks("auto", dtype, platform))


def _train_step_hlo(config):
    """StableHLO (for CUDA) of forward + backward of the cross-entropy of a batch, dropout on."""
    model = Transformer(config)
    tokens = jax.ShapeDtypeStruct((BATCH, LENGTH), jnp.int32)
    params = jax.eval_shape(lambda s, t: model.init(jax.random.key(0), s, t)["params"], tokens, tokens)

    def loss(params, src, tgt_in, tgt_out, key):
        logits = model.apply({"params": params}, src, tgt_in, train=True, rngs={"dropout": key})
        logp = jax.nn.log_softmax(logits.astype(jnp.float32))
        return -jnp.take_along_axis(logp, tgt_out[..., None], axis=-1).mean()

    key = jax.ShapeDtypeStruct((2,), jnp.uint32)  # a raw threefry key
    exported = jax.export.export(jax.jit(jax.value_and_grad(loss)), platforms=("cuda",))(
        params, tokens, tokens, tokens, key
    )
    return exported.mlir_module()


def _decode_step_hlo(config):
    """StableHLO (for CUDA) of one decode step: one new token per row against the self-attention cache."""
    model = Transformer(config)
    src = jax.ShapeDtypeStruct((BATCH, LENGTH), jnp.int32)
    token = jax.ShapeDtypeStruct((BATCH, 1), jnp.int32)
    params = jax.eval_shape(lambda s: model.init(jax.random.key(0), s, s)["params"], src)
    encoded = jax.eval_shape(lambda p, s: model.apply({"params": p}, s, method="encode"), params, src)

    def fill(params, encoded, src):  # the first decode call sizes the cache (as models.init_cache)
        tgt = jnp.zeros((BATCH, LENGTH), jnp.int32)
        return model.apply({"params": params}, encoded, src, tgt, method="decode", decode=True, mutable=["cache"])[1][
            "cache"
        ]

    cache = jax.eval_shape(fill, params, encoded, src)

    def step(params, cache, encoded, src, token):
        logits, variables = model.apply(
            {"params": params, "cache": cache}, encoded, src, token, method="decode", decode=True, mutable=["cache"]
        )
        return logits, variables["cache"]

    exported = jax.export.export(jax.jit(step, donate_argnums=1), platforms=("cuda",))(
        params, cache, encoded, src, token
    )
    return exported.mlir_module()


def _dots(hlo):
    """(lhs, rhs, result) tensor types of every stablehlo.dot_general."""
    return DOT.findall(hlo)


def _rank(tensor_type):
    return tensor_type.count("x")


def _element(tensor_type):
    return tensor_type.rstrip(">").split("x")[-1]


STEPS = {"train": _train_step_hlo, "decode": _decode_step_hlo}


@pytest.fixture(scope="module")
def lowered():
    """{(step, dtype name, platform): StableHLO text}, lowered once per module."""
    cache = {}

    def get(step, dtype, platform):
        key = (step, jnp.dtype(dtype).name, platform)
        if key not in cache:
            cache[key] = STEPS[step](_config(dtype, platform))
        return cache[key]

    return get


@pytest.mark.parametrize("step", sorted(STEPS))
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_cuda_lowering_is_the_plain_formulation(lowered, step, dtype):
    cuda, plain = lowered(step, dtype, "cuda"), lowered(step, dtype, None)
    assert "optimization_barrier" not in cuda
    dots = _dots(cuda)
    assert dots and len(dots) == len(_dots(plain)) == cuda.count("stablehlo.dot_general")
    want = {"float32": "f32", "bfloat16": "bf16"}[jnp.dtype(dtype).name]
    for lhs, rhs, out in dots:
        if _rank(lhs) < 5 and _rank(rhs) < 5:  # dense layers and tied logits: in the compute dtype
            assert (_element(lhs), _element(rhs), _element(out)) == (want, want, want), (lhs, rhs, out)
        else:  # attention's products (grouped layout): float32 logits and sums, as attention.head asks
            assert _element(out) == "f32", (lhs, rhs, out)
            if step == "decode":  # forward only: operands in the compute dtype
                assert (_element(lhs), _element(rhs)) == (want, want), (lhs, rhs)
    types = lambda hlo: sorted(_dots(hlo))
    assert types(cuda) == types(plain)
    # the same program as the plain formulation's, op for op (locations aside)
    assert _ops(cuda) == _ops(plain)


def _ops(hlo):
    """The multiset of StableHLO op names in `hlo`."""
    names = re.findall(r"= (stablehlo\.[a-z_]+|chlo\.[a-z_]+|func\.call)", hlo)
    return sorted(names)


@pytest.mark.parametrize("step", sorted(STEPS))
def test_the_checks_catch_the_cpu_hooks(lowered, step):
    """The CPU's hooks lowered for CUDA: barriers (cache writes, row-major transposes) or other dots than plain."""
    cpu, plain = lowered(step, jnp.bfloat16, "cpu"), lowered(step, jnp.bfloat16, None)
    assert "optimization_barrier" in cpu
    dot_types = lambda hlo: sorted(tuple(map(_element, d)) for d in _dots(hlo))
    assert dot_types(cpu) != dot_types(plain) or _ops(cpu) != _ops(plain)


def test_model_hooks_by_platform():
    cpu, cuda, tpu = (backends.model_hooks("auto", jnp.float32, p) for p in ("cpu", "cuda", "tpu"))
    # off the CPU: no hooks but the plain formulation, naming the platform it was chosen for
    for platform, hooks in (("cuda", cuda), ("tpu", tpu)):
        assert hooks == {"dot_general": None, "formulation": attention.Formulation(platform), "dropout_keep": None}
        assert type(hooks["formulation"]) is attention.Formulation and hooks["formulation"].platform == platform
    assert (
        cpu["dot_general"] is None and cpu["formulation"] is not None and cpu["dropout_keep"] is not None
    )  # float32: XLA's dots
    assert backends.model_hooks("auto", jnp.bfloat16, "cpu")["dot_general"] is not None
    assert cpu["formulation"].platform == "cpu"
    np.testing.assert_equal(
        backends.model_hooks("row_major", jnp.float32, "cuda")["formulation"], attention.Formulation("cuda")
    )
    # None: this process's default backend, decided here rather than while tracing
    assert backends.model_hooks("auto", jnp.float32)["formulation"].platform == jax.default_backend()


# --- impl="auto": chosen for the platform the program is for, not the backend that traces it ------------------


def test_choose_impl_takes_the_platform_it_is_given():
    args = (1024, 1024, jnp.bfloat16, 64, 64, False, False)
    assert attention.choose_impl(*args, platform="cuda") == "cudnn"
    assert attention.choose_impl(*args, platform="gpu") == "cudnn"  # JAX's name for its GPU backend
    for platform in ("cpu", "tpu", "rocm"):  # no cuDNN there: the size rule (Lq * Lk = 1024^2: blockwise)
        assert attention.choose_impl(*args, platform=platform) == "blockwise"
    assert (
        attention.choose_impl(512, 512, jnp.float32, 64, 64, False, False, platform="cuda") == "vmap"
    )  # float32: no cuDNN
    assert attention.choose_impl(*args[:5], True, False, platform="cuda") == "blockwise"  # dropout: no cuDNN
    default = "cudnn" if jax.default_backend() == "gpu" else "blockwise"
    assert attention.choose_impl(*args) == default  # no platform named: this process's default backend


def test_cudnn_refused_for_a_formulation_of_another_platform():
    q = jnp.zeros((1, 16, 2, 8), jnp.bfloat16)
    with pytest.raises(ValueError, match="needs an NVIDIA GPU, but the formulation's platform is 'cpu'"):
        attention.dot_product_attention(q, q, q, impl="cudnn", formulation=attention.Formulation("cpu"))
    with pytest.raises(ValueError, match="platform = 3; expected None or a JAX platform name"):
        attention.Formulation(3)


def _auto_calls(monkeypatch, platform):
    """{impl: calls} that `impl="auto"` made while the bfloat16 training step was lowered for CUDA with
    `platform`'s hooks. JAX checks for cuDNN while tracing it, so off a GPU the cuDNN implementation is
    stood in for by the XLA one (same signature): what is recorded is the choice."""
    calls = collections.Counter()
    for impl in ("cudnn", "vmap", "blockwise", "xla"):
        original = IMPLEMENTATIONS[impl]
        stand_in = IMPLEMENTATIONS["xla"] if impl == "cudnn" and jax.default_backend() != "gpu" else original

        def spy(*args, impl=impl, run=stand_in.attention, **kwargs):
            calls[impl] += 1
            return run(*args, **kwargs)

        monkeypatch.setitem(IMPLEMENTATIONS, impl, stand_in._replace(attention=spy))
    config = dataclasses.replace(_config(jnp.bfloat16, platform), attention_impl="auto")
    hlo = _train_step_hlo(config)
    return calls, hlo


def test_auto_lowered_for_cuda_takes_cudnn_on_a_cpu_machine(monkeypatch):
    """The layer's formulation carries the platform from `backends.model_hooks` down to `choose_impl`."""
    cuda, hlo = _auto_calls(monkeypatch, "cuda")
    # every attention sublayer (encoder self, decoder self, cross; TINY's 2 layers each) takes cuDNN,
    # in each trace of the model (the parameters' shapes, then the step)
    sublayers = 3 * TINY["num_layers"]
    assert set(cuda) == {"cudnn"} and cuda["cudnn"] >= sublayers and cuda["cudnn"] % sublayers == 0, cuda
    if jax.default_backend() == "gpu":  # where cuDNN can be traced, its custom calls are in the program
        assert "__cudnn$fmha" in hlo
    cpu, _ = _auto_calls(monkeypatch, "cpu")
    assert cpu == {"vmap": cuda["cudnn"]}, cpu  # the same model for XLA:CPU: the size rule (short sequences)
