"""The two faces of the layer alike: Linen's `attention.MultiHeadAttention` and `attention.nnx.MultiHeadAttention`.

One grid of options runs through both faces with the same parameters (a Linen parameter tree, random,
loaded into the NNX layer by `attention.nnx.load_linen_params`):

    attention       self / cross (keys from another sequence, of another length)
    decode          off / on
    cache_cross_kv  off / on
    beams           a beam-search table in the decode state, read in place where the layer reads it so
                    (only where the layer keeps a KV cache: decode on, cache_cross_kv off)
    attention_type  every member of `attention.family.ATTENTION_TYPES` ("softmax" and the family)
    mask            none / key padding
    dropout         none / on but deterministic / on, drawn from the same key on both faces

Each case runs one protocol on both faces: a plain call; with `cache_cross_kv`, a call that stores the
source in the decode state (Linen: an `apply` with a mutable `cache`; NNX: after `init_cache`) and a
second call whose other source is not read; with decode (and no `cache_cross_kv`), a prefill of 2 tokens
then a step of 1 over a cache sized as the keys.

Every case asserts the same decision: both faces raise a ValueError, or neither. Where both accept,
a representative set (`compared`) compares the outputs of every call, float32, within RTOL and ATOL
(tests/conftest.py sets matmul precision "highest"): softmax (the layers' own attention) in every
case without decode state, with a kept source in cross-attention (its use: models.Transformer's
decoder) and with a KV cache in self-attention, beams or not, each mask and dropout; each family
member, with a mask, in those decode-state cases (its plain calls are compared in
family/test_nnx_family.py). The other accepted cases run abstractly (`jax.eval_shape`: every check,
nothing compiled) and compare the outputs' shapes and dtypes. Comparing every accepted case took about
57 s of one core, most of it compiling each case's ops (entmax and performer recompile their loops at
each eager call); the file takes about 40 s under pytest on one core (482 tests). The shapes are the
same in every case, the parameters are built once per member and the NNX layers once per setting, so
the eager calls reuse each other's compiled ops.
"""

import functools
import itertools
import re
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import attention
import attention.beams
from attention import family
from attention.cache import BEAM_ROWS
from attention.nnx import load_linen_params

RTOL = ATOL = 1e-6  # float32; the faces run the same core on the same parameters
SOURCES, BEAMS = 2, 2
B, T, S, D, H = SOURCES * BEAMS, 6, 5, 16, 4  # batch (2 sources x 2 beams), query and source lengths, features
X, X2 = (jax.random.normal(jax.random.key(seed), (B, T, D)) for seed in (1, 2))
SRC, SRC2 = (jax.random.normal(jax.random.key(seed), (B, S, D)) for seed in (3, 4))
STEPS = ((0, 2), (2, 3))  # a decode's calls: a prefill of 2, then 1 token
DROPOUT_RATE = 0.3
# each member in a small setting that exercises its approximation (tests/attention/family/test_nnx_family.py)
OPTIONS = {
    "softmax": ({}, 2),
    "bigbird": (dict(block_size=2, random_blocks=1), 2),
    "lsh": (dict(chunk_length=2, num_buckets=2), 4),
    "linformer": (dict(max_length=8, projected_length=3), 2),
    "performer": (dict(num_features=6), 1),
    "entmax": ({}, 2),
    "span": (dict(max_span=3, ramp=2, span_init=0.7), 2),
    "mla": (dict(latent_dim=8), 4),
}


class Case(NamedTuple):
    cross: bool
    decode: bool
    cache_cross_kv: bool
    beams: bool
    attention_type: str
    mask: bool
    dropout: str  # "none", "deterministic" or "drawn"

    @property
    def key_length(self) -> int:
        """The keys' length: the source's, or the queries' own (also the decode cache's)."""
        return S if self.cross else T

    def settings(self) -> dict:
        options, kv_heads = OPTIONS[self.attention_type]
        return dict(
            num_heads=H,
            num_kv_heads=kv_heads,
            attention_type=self.attention_type,
            attention_options=options or None,
            decode=self.decode,
            cache_cross_kv=self.cache_cross_kv,
            dropout_rate=0.0 if self.dropout == "none" else DROPOUT_RATE,
        )

    def calls(self) -> list[tuple]:
        """(inputs_q, inputs_k or None, call seed) of each call, in order."""
        if self.cache_cross_kv:  # stores the source, then reads it: the second source is not read
            return [(X, SRC if self.cross else None, 10), (X2, SRC2 if self.cross else None, 11)]
        if self.decode:
            return [(X[:, lo:hi], SRC[:, lo:hi] if self.cross else None, 10 + i) for i, (lo, hi) in enumerate(STEPS)]
        return [(X, SRC if self.cross else None, 10)]


def grid() -> list[Case]:
    axes = (
        [False, True],
        [False, True],
        [False, True],
        [False, True],
        list(family.ATTENTION_TYPES),
        [False, True],
        ["none", "deterministic", "drawn"],
    )
    cases = (Case(*values) for values in itertools.product(*axes))
    return [c for c in cases if not c.beams or (c.decode and not c.cache_cross_kv)]


CASES = grid()


def case_id(c: Case) -> str:
    return "-".join(
        [
            "cross" if c.cross else "self",
            "decode" if c.decode else "full",
            *(["cache_cross_kv"] if c.cache_cross_kv else []),
            *(["beams"] if c.beams else []),
            c.attention_type,
            "mask" if c.mask else "nomask",
            f"dropout_{c.dropout}",
        ]
    )


MASK = jnp.arange(max(T, S))[None, :] < jnp.array([6, 4, 5, 3])[:, None]  # key padding, every member honours it
TABLE = jax.random.randint(jax.random.key(5), (SOURCES, BEAMS, max(T, S)), 0, BEAMS)  # row of each beam's position


def mask_for(c: Case):
    return MASK[:, None, None, : c.key_length] if c.mask else None


def dropout_arguments(c: Case, seed: int) -> tuple[dict, dict]:
    """The call's dropout arguments (Linen's, NNX's): the same key reaches `attention.attend` on both faces."""
    if c.dropout == "none":
        return {}, {}
    if c.dropout == "deterministic":
        return dict(deterministic=True), dict(deterministic=True)
    key = nnx.Rngs(dropout=seed).dropout()  # the key the NNX layer draws from this stream
    return dict(deterministic=False, dropout_rng=key), dict(deterministic=False, rngs=nnx.Rngs(dropout=seed))


@functools.cache
def linen_params(attention_type: str):
    """One Linen parameter tree per member, shared by every case (the settings varied here do not change it):
    the tree of its `init`, filled from NumPy (random biases too; nothing to compile)."""
    options, kv_heads = OPTIONS[attention_type]
    layer = attention.MultiHeadAttention(
        num_heads=H, num_kv_heads=kv_heads, attention_type=attention_type, attention_options=options or None
    )
    shapes = jax.eval_shape(layer.init, jax.random.key(0), X)["params"]
    rng = np.random.default_rng(0)
    return jax.tree.map(lambda x: jnp.asarray(0.3 * rng.standard_normal(x.shape), x.dtype), shapes)


def compared(c: Case) -> bool:
    """Whether the case's outputs are compared (else, abstractly, their shapes): see the module's docstring."""
    if c.cache_cross_kv:
        usual = c.cross  # a kept source: cross-attention's
    elif c.decode:
        usual = not c.cross  # a KV cache: self-attention's
    else:
        usual = True
    return usual and (c.attention_type == "softmax" or (c.mask and (c.decode or c.cache_cross_kv)))


def linen_outputs(c: Case, params) -> list:
    layer = attention.MultiHeadAttention(**c.settings())
    cache: dict = {}
    if c.decode and not c.cache_cross_kv:  # `init` with the full-length inputs sizes the decode state
        full = (X[:, : c.key_length], SRC if c.cross else None)  # queries as long as the keys: a causal pass's
        cache = dict(layer.init(jax.random.key(0), *full, deterministic=True).get("cache", {}))
        if c.beams and "cached_key" in cache:  # as models.decoding hands it to every KV cache
            cache[BEAM_ROWS] = TABLE[:, :, : c.key_length]
    outputs = []
    for inputs_q, inputs_k, seed in c.calls():
        dropout, _ = dropout_arguments(c, seed)
        out, state = layer.apply(
            {"params": params, "cache": cache}, inputs_q, inputs_k, mask=mask_for(c), mutable=["cache"], **dropout
        )
        cache = dict(state.get("cache", {}))
        outputs.append(out)
    return outputs


@functools.cache
def nnx_built(c: Case):
    """The NNX layer of the case's settings, built once. Without dropout its only state is its parameters,
    which `load_linen_params` replaces: it is built abstractly (a member's Linen init, uncompiled)."""
    build = lambda: attention.nnx.MultiHeadAttention(in_features=D, **c.settings(), rngs=nnx.Rngs(0))
    return nnx.eval_shape(build) if c.dropout == "none" else build()


def settings_only(c: Case) -> Case:
    return c._replace(cross=False, beams=False, mask=False)


def nnx_outputs(c: Case, params) -> list:
    layer = nnx.clone(nnx_built(settings_only(c)))
    load_linen_params(layer, params)
    if c.decode or c.cache_cross_kv:  # the decode state, sized as the keys
        layer.init_cache((B, c.key_length, D))
        if c.beams and layer.cached_key is not None:
            setattr(layer, BEAM_ROWS, nnx.Cache(TABLE[:, :, : c.key_length]))
    outputs = []
    for inputs_q, inputs_k, seed in c.calls():
        _, dropout = dropout_arguments(c, seed)
        outputs.append(layer(inputs_q, inputs_k, mask=mask_for(c), **dropout))
    return outputs


def outcome(run, c: Case):
    """The face's outputs (abstract unless `compared(c)`), or the ValueError it raised (anything else fails)."""
    params = linen_params(c.attention_type)  # concrete, outside any trace: both are cached
    try:
        if run is nnx_outputs:
            nnx_built(settings_only(c))
        return run(c, params) if compared(c) else jax.eval_shape(functools.partial(run, c), params)
    except ValueError as error:
        return error


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_both_faces_decide_alike_and_compute_alike(case):
    linen, ours = outcome(linen_outputs, case), outcome(nnx_outputs, case)
    refused = isinstance(linen, ValueError), isinstance(ours, ValueError)
    assert refused[0] == refused[1], f"Linen: {linen!r}; NNX: {ours!r}"[:2000]
    plain = not (case.cross or case.decode or case.cache_cross_kv) and case.dropout == "none"
    assert not (plain and refused[0]), f"every member serves a plain self-attention call: {linen!r}"
    if refused[0]:
        return
    assert len(linen) == len(ours)
    for i, (a, b) in enumerate(zip(linen, ours)):
        if compared(case):
            np.testing.assert_allclose(b, a, rtol=RTOL, atol=ATOL, err_msg=f"call {i}")
        else:
            assert (b.shape, b.dtype) == (a.shape, a.dtype), f"call {i}"


def test_the_nnx_layer_reads_a_beam_table_in_place_as_the_linen_layer(monkeypatch):
    """The beams cases compare a read that happens: the table moves each beam's history, read in place."""
    history, reads = attention.beams.history_attention, []
    monkeypatch.setattr(attention.beams, "history_attention", lambda *a, **k: reads.append(1) or history(*a, **k))
    case = Case(False, True, False, True, "softmax", False, "none")
    params = linen_params(case.attention_type)
    with_table, without = nnx_outputs(case, params), nnx_outputs(case._replace(beams=False), params)
    assert len(reads) == len(STEPS)
    assert not np.allclose(with_table[0], without[0])


SENTENCE = (
    "`cache_cross_kv`: the layer keeps its source's projected keys/values (`cross_key`, `cross_value`, "
    "head-first) in its decode state, in place of a KV cache: the first call that can write that state "
    "stores them, later calls read them instead of `inputs_k`/`inputs_v`, a call without the state "
    "projects them, and `decode` changes none of this (a cross-attention decodes by reusing its source)."
)


def test_both_faces_and_the_docs_state_one_meaning_of_cache_cross_kv():
    flat = lambda text: re.sub(r"\s+", " ", re.sub(r"^\s*> ?", "", text, flags=re.MULTILINE))  # a quote's ">" too
    for text in (
        attention.MultiHeadAttention.__doc__,
        attention.nnx.MultiHeadAttention.__doc__,
        (Path(__file__).parents[2] / "docs" / "attention.md").read_text(),
    ):
        assert SENTENCE in flat(text or "")
