"""`attention.head.attention_head`: the paper's one-head formula, given its two products bound, and
`attention.head.products`, which binds a formulation's (both in attention/head.py)."""

import ast
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from attention import head as formulation
from attention.head import attention_head
from reference import attention as reference

HEAD = pathlib.Path(__file__).resolve().parents[2] / "attention" / "head.py"


def test_the_head_imports_no_backend_and_the_formula_knows_no_formulation():
    imported = {
        node.module if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(ast.parse(HEAD.read_text()))
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    }
    assert not any(name.startswith("backends") for name in imported), imported
    assert {name for name in imported if name.startswith("attention")} == {"attention.masks"}
    # the formula takes its products bound: it names no formulation, only what it computes with
    assert set(attention_head.__code__.co_names) & {"Formulation", "PLAIN", "resolve", "products"} == set()


def test_one_head_with_bound_products_equals_numpy():
    keys = jax.random.split(jax.random.key(0), 3)
    q, k, v = (jax.random.normal(key, shape) for key, shape in zip(keys, [(3, 8), (5, 8), (5, 6)]))
    mask = np.arange(5)[None, :] < 4  # the last key masked, for every query
    scores, mix = formulation.products(None, lax.Precision.HIGHEST)
    out, weights = attention_head(q, k, v, mask, scores=scores, mix=mix)
    want, want_weights = reference(q[:, None], k[:, None], v[:, None], mask=mask)
    np.testing.assert_allclose(out, want[:, 0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(weights, want_weights[0], rtol=1e-5, atol=1e-6)


def test_products_are_the_formulations_with_the_precision_bound():
    class Counted(formulation.Formulation):
        calls: list = []

        def scores(self, q, k, *, precision):
            self.calls.append(("scores", precision))
            return super().scores(q, k, precision=precision)

        def mix(self, weights, v, *, precision):
            self.calls.append(("mix", precision))
            return super().mix(weights, v, precision=precision)

    scores, mix = formulation.products(Counted(), lax.Precision.HIGH)
    attention_head(jnp.ones((2, 4)), jnp.ones((3, 4)), jnp.ones((3, 4)), scores=scores, mix=mix)
    assert Counted.calls == [("scores", lax.Precision.HIGH), ("mix", lax.Precision.HIGH)]
    plain_scores, _ = formulation.products(None)
    assert plain_scores.func == formulation.PLAIN.scores and plain_scores.keywords == {"precision": None}
