"""Our layer as a drop-in for `flax.linen.MultiHeadDotProductAttention`.

Two scenarios run code from a google/flax snapshot, unchanged, with our classes swapped into
`flax.linen` (set `FLAX_GIT_DIR` to its git dir: a bare repo or a clone's .git; `FLAX_GIT_REF`, default HEAD):
Flax's own Linen attention tests, and Flax's `examples/wmt` Transformer. The snapshot runs
against the *installed* flax, so a snapshot test that fails with Flax's own layer there is
version-specific: it is reported, and only the tests Flax passes are required of ours.

The other tests are the same cases, as unit tests that need no snapshot.
"""

import contextlib
import importlib.util
import os
import subprocess
import sys
import unittest
import warnings

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attention

KEY = jax.random.key(0)
SNAPSHOT = os.environ.get("FLAX_GIT_DIR")
SNAPSHOT_REF = os.environ.get("FLAX_GIT_REF", "HEAD")
needs_snapshot = pytest.mark.skipif(not SNAPSHOT, reason="set FLAX_GIT_DIR to a google/flax git dir")
OURS = {
    "MultiHeadDotProductAttention": attention.MultiHeadDotProductAttention,
    "MultiHeadAttention": attention.MultiHeadAttention,
    "SelfAttention": attention.SelfAttention,
}
FLAXS = {name: getattr(nn, name) for name in OURS}


@contextlib.contextmanager
def flax_layer_swapped(swap):
    """`flax.linen`'s attention classes replaced by ours (when `swap`), as a user's import swap does.

    Yields the set of attention classes whose methods ran inside, to show the swap took.
    """
    ran = set()

    def record(call, args, kwargs, context):
        if isinstance(context.module, (*OURS.values(), *FLAXS.values())):
            ran.add(type(context.module))
        return call(*args, **kwargs)

    if swap:
        for name, cls in OURS.items():
            setattr(nn, name, cls)
    try:
        with nn.intercept_methods(record):
            yield ran
    finally:
        for name, cls in FLAXS.items():
            setattr(nn, name, cls)
    assert ran and ran <= set((OURS if swap else FLAXS).values()), ran


def snapshot_module(tmp_path, path):
    """Import `path` from the snapshot, extracted into `tmp_path`, as a fresh module."""
    text = subprocess.run(
        ["git", f"--git-dir={SNAPSHOT}", "show", f"{SNAPSHOT_REF}:{path}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    target = tmp_path / path.replace("/", "__")
    target.write_text(text)
    name = f"flax_snapshot_{target.stem}"
    spec = importlib.util.spec_from_file_location(name, target)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def run_unittests(module, swap):
    """Run a unittest module; return {test id: None if passed, else the failure text}."""
    suite = unittest.defaultTestLoader.loadTestsFromModule(module)
    outcome = {test.id(): None for test in _tests(suite)}  # before running: a run drops the tests
    result = unittest.TestResult()
    # Flax runs its tests with JAX's default rank promotion; tests/conftest.py raises on it.
    with flax_layer_swapped(swap), jax.numpy_rank_promotion("allow"), warnings.catch_warnings():
        suite.run(result)
    for test, text in result.failures + result.errors:
        outcome[test.id()] = text
    for test, reason in result.skipped:
        outcome[test.id()] = f"skipped: {reason}"
    return outcome


def _tests(suite):
    for item in suite:
        yield from _tests(item) if isinstance(item, unittest.TestSuite) else [item]


@needs_snapshot
def test_flax_linen_attention_tests_pass_with_our_layer(tmp_path):
    module = snapshot_module(tmp_path, "tests/linen/linen_attention_test.py")
    with_flax = run_unittests(module, swap=False)
    with_ours = run_unittests(module, swap=True)
    version_specific = sorted(t for t, failure in with_flax.items() if failure)
    required = [t for t, failure in with_flax.items() if not failure]
    failing = {t: with_ours[t] for t in required if with_ours[t]}
    print(
        f"\nflax linen_attention_test ({SNAPSHOT_REF}): {len(with_flax)} tests; Flax's layer passes "
        f"{len(required)}, ours passes {sum(not with_ours[t] for t in with_ours)}; "
        f"failing with Flax's own layer (version-specific): {version_specific}"
    )
    assert len(with_flax) >= 20, "the snapshot's attention test file shrank; check FLAX_GIT_DIR/REF"
    assert not failing, "\n\n".join(f"{t}:\n{text}" for t, text in failing.items())


@contextlib.contextmanager
def nnx_layer_swapped(swap):
    """`flax.nnx.MultiHeadAttention` replaced by ours (when `swap`), as a user's import swap does."""
    from flax import nnx

    flaxs = nnx.MultiHeadAttention
    if swap:
        nnx.MultiHeadAttention = attention.nnx.MultiHeadAttention
    try:
        yield
    finally:
        nnx.MultiHeadAttention = flaxs


# Flax's NNX tests that read the KV cache's layout, `[batch, max_length, G, D]`; ours is heads-first on purpose
NNX_CACHE_LAYOUT_TESTS = ("test_autoregressive_decode_with_x64", "test_gqa_multihead_attention")


@needs_snapshot
def test_flax_nnx_attention_tests_pass_with_our_layer_but_the_cache_layouts(tmp_path):
    module = snapshot_module(tmp_path, "tests/nnx/nn/attention_test.py")
    outcomes = {}
    for swap in (False, True):
        suite = unittest.defaultTestLoader.loadTestsFromModule(module)
        outcome = {test.id(): None for test in _tests(suite)}
        result = unittest.TestResult()
        with nnx_layer_swapped(swap), jax.numpy_rank_promotion("allow"), warnings.catch_warnings():
            suite.run(result)
        for test, text in result.failures + result.errors:
            outcome[test.id()] = text
        outcomes[swap] = outcome
    with_flax, with_ours = outcomes[False], outcomes[True]
    required = [t for t, failure in with_flax.items() if not failure]
    failing = sorted(t for t in required if with_ours[t])
    print(
        f"\nflax nnx attention_test ({SNAPSHOT_REF}): {len(with_flax)} tests; Flax's layer passes {len(required)}, "
        f"ours passes {sum(not f for f in with_ours.values())}; failing with ours: {failing}"
    )
    assert len(with_flax) >= 100, "the snapshot's NNX attention test file shrank; check FLAX_GIT_DIR/REF"
    unexpected = [t for t in failing if not t.rsplit(".", 1)[-1].startswith(NNX_CACHE_LAYOUT_TESTS)]
    assert not unexpected, "\n\n".join(f"{t}:\n{with_ours[t]}" for t in unexpected)


def wmt_setup(tmp_path, **overrides):
    """Flax's examples/wmt Transformer (small), padded inputs/targets, and Flax's parameters."""
    models = snapshot_module(tmp_path, "examples/wmt/models.py")
    config = models.TransformerConfig(
        vocab_size=32,
        output_vocab_size=32,
        emb_dim=16,
        num_heads=4,
        num_layers=2,
        qkv_dim=16,
        mlp_dim=32,
        max_len=16,
        **overrides,
    )
    inputs = np.array([[5, 9, 3, 7, 2, 0, 0], [4, 8, 0, 0, 0, 0, 0]])
    targets = np.array([[6, 2, 9, 4, 0, 0], [3, 5, 7, 8, 11, 1]])
    params = models.Transformer(config).init(KEY, inputs, targets)["params"]
    return models, config, inputs, targets, params


@needs_snapshot
def test_flax_wmt_transformer_gives_the_same_train_logits_with_our_layer(tmp_path):
    models, config, inputs, targets, params = wmt_setup(tmp_path, deterministic=False)
    model = models.Transformer(config)
    rngs = {"dropout": jax.random.key(7)}
    with flax_layer_swapped(False):
        theirs = model.apply({"params": params}, inputs, targets, rngs=rngs)
        other_draws = model.apply({"params": params}, inputs, targets, rngs={"dropout": jax.random.key(8)})
    with flax_layer_swapped(True):
        ours_init = model.init(KEY, inputs, targets)["params"]
        ours = model.apply({"params": params}, inputs, targets, rngs=rngs)
    assert jax.tree.structure(ours_init) == jax.tree.structure(params)
    assert jax.tree.all(jax.tree.map(lambda a, b: a.shape == b.shape, ours_init, params))
    assert np.abs(theirs - other_draws).max() > 1e-2  # dropout acts
    np.testing.assert_allclose(ours, theirs, atol=2e-5, rtol=2e-5)


@needs_snapshot
def test_flax_wmt_transformer_decodes_step_by_step_as_with_flax(tmp_path):
    """Teacher-forced cached decoding (float cross-attention masks), as Flax's decode.py steps it."""
    models, config, inputs, targets, params = wmt_setup(tmp_path, deterministic=True)
    full = models.Transformer(config).apply({"params": params}, inputs, targets)
    decoder = models.Transformer(config.replace(decode=True))
    fed = np.asarray(models.shift_right(jnp.asarray(targets)))

    def decode(swap):
        with flax_layer_swapped(swap):
            encoded = decoder.apply({"params": params}, inputs, method=decoder.encode)
            cache = decoder.init(KEY, inputs, np.ones_like(targets))["cache"]
            steps = []
            for t in range(targets.shape[1]):
                logits, updated = decoder.apply(
                    {"params": params, "cache": cache},
                    encoded,
                    inputs,
                    fed[:, t : t + 1],
                    mutable=["cache"],
                    method=decoder.decode,
                )
                cache = updated["cache"]
                steps.append(logits[:, 0])
        return np.stack(steps, axis=1)

    theirs, ours = decode(False), decode(True)
    np.testing.assert_allclose(ours, theirs, atol=2e-5, rtol=2e-5)
    real = targets > 0  # the full pass masks padded target rows, cached decoding does not
    np.testing.assert_allclose(ours[real], np.asarray(full)[real], atol=2e-5, rtol=2e-5)


# The same cases without a snapshot, against Flax's own layer.

X = jax.random.normal(jax.random.key(1), (2, 5, 16))
TOKENS = np.array([[3, 4, 5, 0, 0], [7, 8, 9, 1, 2]])


def flax_and_ours(**kwargs):
    return nn.MultiHeadDotProductAttention(**kwargs), attention.MultiHeadDotProductAttention(**kwargs)


@pytest.mark.parametrize("impl", ["vmap", "einsum", "xla", "blockwise", "auto"])
def test_flax_float_masks_work_in_every_impl(impl):
    """Flax's helpers return float32 0/1; any non-zero entry attends, as in Flax's layer."""
    theirs, ours = flax_and_ours(num_heads=4)
    params = theirs.init(KEY, X)
    mask = nn.combine_masks(nn.make_attention_mask(TOKENS > 0, TOKENS > 0), nn.make_causal_mask(TOKENS))
    assert mask.dtype == jnp.float32
    expected = theirs.apply(params, X, mask=mask)  # padded query rows are fully masked
    ours = ours.clone(impl=impl)
    for same_mask in (mask, mask.astype(jnp.int32), mask * 3.0, mask.astype(bool)):
        np.testing.assert_allclose(ours.apply(params, X, mask=same_mask), expected, atol=1e-5)
        np.testing.assert_allclose(theirs.apply(params, X, mask=same_mask), expected, atol=1e-6)


@pytest.mark.parametrize("impl", ["vmap", "einsum", "xla", "blockwise"])
def test_flax_float_mask_in_decode_matches_flax_step_by_step(impl):
    theirs, ours = flax_and_ours(num_heads=4, decode=True)
    ours = ours.clone(impl=impl)
    variables = theirs.init(KEY, X)
    key_padding = nn.make_attention_mask(np.ones((2, 1)), TOKENS > 0)  # [2, 1, 1, 5] float32
    cache_a, cache_b = ours.init(KEY, X)["cache"], variables["cache"]
    for t in range(X.shape[1]):
        step = dict(mask=key_padding, mutable=["cache"])
        out_a, upd_a = ours.apply({"params": variables["params"], "cache": cache_a}, X[:, t : t + 1], **step)
        out_b, upd_b = theirs.apply({"params": variables["params"], "cache": cache_b}, X[:, t : t + 1], **step)
        cache_a, cache_b = upd_a["cache"], upd_b["cache"]
        np.testing.assert_allclose(out_a, out_b, atol=1e-5, err_msg=f"step {t}")


@pytest.mark.parametrize("force_fp32", [True, False])
def test_mixed_precision_output_and_sown_weight_dtypes_are_flaxs(force_fp32):
    theirs, ours = flax_and_ours(num_heads=2, qkv_features=4, dtype=jnp.bfloat16, force_fp32_for_softmax=force_fp32)
    x = jax.random.uniform(jax.random.key(2), (2, 3, 4))
    params = theirs.init(KEY, x)
    run = lambda m: m.apply(params, x, sow_weights=True, mutable=["intermediates"])
    (out_a, state_a), (out_b, state_b) = run(ours), run(theirs)
    w_a, w_b = state_a["intermediates"]["attention_weights"][0], state_b["intermediates"]["attention_weights"][0]
    assert w_a.dtype == w_b.dtype == (jnp.float32 if force_fp32 else jnp.bfloat16)
    assert out_a.dtype == out_b.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.float32(w_a), np.float32(w_b), atol=1e-2)
    np.testing.assert_allclose(np.float32(out_a), np.float32(out_b), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize(
    "kwargs", [{}, dict(param_dtype=jnp.bfloat16), dict(dtype=jnp.float16)], ids=["promoted", "bf16-params", "f16"]
)
def test_bfloat16_inputs_give_flaxs_output_and_weight_dtypes(kwargs):
    theirs, ours = flax_and_ours(num_heads=2, **kwargs)
    x = jax.random.uniform(jax.random.key(2), (2, 3, 4)).astype(jnp.bfloat16)
    params = theirs.init(KEY, x)
    dtypes = [
        (out.dtype, state["intermediates"]["attention_weights"][0].dtype)
        for out, state in (m.apply(params, x, sow_weights=True, mutable=["intermediates"]) for m in (ours, theirs))
    ]
    assert dtypes[0] == dtypes[1]


@pytest.mark.parametrize("impl", ["vmap", "einsum", "auto"])
def test_complex_inputs_give_flaxs_complex_outputs(impl):
    theirs, ours = flax_and_ours(num_heads=2, qkv_features=8)
    x = (X[..., :6] + 1j * X[..., 6:12]).astype(jnp.complex64)
    params = theirs.init(KEY, x)
    mask = nn.make_causal_mask(TOKENS)
    out_a, out_b = ours.clone(impl=impl).apply(params, x, mask=mask), theirs.apply(params, x, mask=mask)
    assert out_a.dtype == out_b.dtype == jnp.complex64
    np.testing.assert_allclose(out_a, out_b, atol=1e-4)


def test_decode_under_x64_matches_flax():
    """Cache indices are int32, Python ints int64 under x64: dynamic_update_slice needs one type."""
    with jax.enable_x64(True):
        theirs, ours = flax_and_ours(num_heads=2, qkv_features=4, decode=True)
        x = jax.random.normal(jax.random.key(3), (1, 4, 4))
        assert x.dtype == jnp.float64
        variables = theirs.init(KEY, x, x, x)
        cache_a, cache_b = ours.init(KEY, x, x, x)["cache"], variables["cache"]
        for t in range(4):
            step = lambda m, c: m.apply({"params": variables["params"], "cache": c}, x[:, t : t + 1], mutable=["cache"])
            (out_a, upd_a), (out_b, upd_b) = step(ours, cache_a), step(theirs, cache_b)
            cache_a, cache_b = upd_a["cache"], upd_b["cache"]
            assert out_a.dtype == out_b.dtype == jnp.float64
            np.testing.assert_allclose(out_a, out_b, atol=1e-10, err_msg=f"step {t}")


def messages(call, expected):
    """The warning and error texts `call` produces."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            call()
        except expected as error:
            return [str(w.message) for w in caught] + [str(error)]
    return [str(w.message) for w in caught]


@pytest.mark.parametrize(
    "args, kwargs, raises",
    [
        ((), dict(inputs_kv=X), ()),
        ((X, X), dict(inputs_kv=X), ValueError),
        ((None, X), {}, ValueError),
        ((jnp.ones((2, 16, 16)), jnp.ones((2, 16, 16))), {}, ()),  # Flax's heuristic: a mask in inputs_v?
    ],
    ids=["inputs_kv", "inputs_kv-and-inputs_k", "inputs_v-without-inputs_k", "square-inputs_v"],
)
def test_deprecation_warnings_and_input_errors_read_as_flaxs(args, kwargs, raises):
    theirs, ours = flax_and_ours(num_heads=4)
    expected = messages(lambda: theirs.init(KEY, X, *args, **kwargs), raises)
    assert expected and messages(lambda: ours.init(KEY, X, *args, **kwargs), raises) == expected


def test_self_attention_alias_is_flaxs():
    """`mask` positional, Flax's deprecation warning, Flax's parameter path `SelfAttention_0`."""
    mask = nn.make_causal_mask(TOKENS)

    def model(cls):
        class Model(nn.Module):
            @nn.compact
            def __call__(self, x, mask):
                return cls(num_heads=4)(x, mask)

        return Model()

    with pytest.warns(DeprecationWarning, match="SelfAttention will be deprecated soon"):
        params = model(nn.SelfAttention).init(KEY, X, mask)
    assert list(params["params"]) == ["SelfAttention_0"]
    assert messages(lambda: model(attention.SelfAttention).init(KEY, X, mask), ()) == messages(
        lambda: model(nn.SelfAttention).init(KEY, X, mask), ()
    )
    with pytest.warns(DeprecationWarning, match="SelfAttention will be deprecated soon"):
        ours = model(attention.SelfAttention).apply(params, X, mask)
    np.testing.assert_allclose(ours, model(nn.SelfAttention).apply(params, X, mask), atol=1e-5)


@pytest.mark.parametrize(
    "call, message",
    [
        (
            lambda q, k, v: attention.dot_product_attention(q, k, v, mask=np.ones((2, 3, 5, 5), np.float32)),
            r"mask has shape \(2, 3, 5, 5\), which does not broadcast to \(2, 4, 5, 5\)",
        ),
        (
            lambda q, k, v: attention.dot_product_attention(q, k, v, mask=jax.random.split(KEY, 5)),
            "mask must be bool .* or numeric",
        ),
        (
            lambda q, k, v: attention.dot_product_attention(q, k[..., :3, :], v[..., :3, :]),
            r"query heads \(4\) must be a multiple of key/value heads \(3\)",
        ),
        (
            lambda q, k, v: attention.dot_product_attention(q.astype(jnp.complex64), k, v, impl="xla"),
            "complex inputs .* need impl='vmap' or 'einsum'",
        ),
        (
            lambda q, k, v: attention.dot_product_attention(q, k, v, impl="cudnn", mask=np.ones((5, 5), np.float32)),
            "needs an NVIDIA GPU" if jax.default_backend() != "gpu" else "dtype is float32",
        ),
    ],
    ids=["mask-shape", "mask-dtype", "gqa-divisibility", "complex-xla", "cudnn-on-cpu"],
)
def test_strictness_that_catches_mistakes_stays(call, message):
    q, k, v = (jax.random.normal(jax.random.key(i), (2, 5, 4, 8)) for i in range(3))
    with pytest.raises(ValueError, match=message):
        call(q, k, v)


def test_decode_still_checks_the_mask_shape():
    layer = attention.MultiHeadDotProductAttention(num_heads=4, decode=True)
    variables = layer.init(KEY, X)
    with pytest.raises(ValueError, match=r"mask has shape \(2, 1, 1, 4\), which does not broadcast to \(2, 4, 1, 5\)"):
        layer.apply(variables, X[:, :1], mask=np.ones((2, 1, 1, 4), np.float32), mutable=["cache"])
