"""Our layer as a drop-in for `flax.linen.MultiHeadDotProductAttention`.

Two scenarios run code from a google/flax snapshot, unchanged, with our classes swapped into
`flax.linen` (set `FLAX_GIT_DIR` to a clone or bare git dir; `FLAX_GIT_REF`, default HEAD):
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
        check=True, capture_output=True, text=True,
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


def wmt_setup(tmp_path, **overrides):
    """Flax's examples/wmt Transformer (small), padded inputs/targets, and Flax's parameters."""
    models = snapshot_module(tmp_path, "examples/wmt/models.py")
    config = models.TransformerConfig(
        vocab_size=32, output_vocab_size=32, emb_dim=16, num_heads=4, num_layers=2,
        qkv_dim=16, mlp_dim=32, max_len=16, **overrides,
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
                    {"params": params, "cache": cache}, encoded, inputs, fed[:, t : t + 1],
                    mutable=["cache"], method=decoder.decode,
                )
                cache = updated["cache"]
                steps.append(logits[:, 0])
        return np.stack(steps, axis=1)

    theirs, ours = decode(False), decode(True)
    np.testing.assert_allclose(ours, theirs, atol=2e-5, rtol=2e-5)
    real = targets > 0  # the full pass masks padded target rows, cached decoding does not
    np.testing.assert_allclose(ours[real], np.asarray(full)[real], atol=2e-5, rtol=2e-5)
