"""Evaluation at a few fixed lengths (`config.eval.lengths`): the scores of the bucketed path, fewer programs.

An untrained model is the hard case: its outputs seldom end in EOS, so most of them run to the
output cap, which the fixed shapes must keep at the bucket's (source bucket + max_extra_length).
"""

from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import Transformer, beam_search, greedy_decode
from tiny import model_config
from training.core.compile_cache import CompileCounter
from training.data import batching
from training.evaluation import dev, translate

BUCKETS = (8, 12, 16, 24, 32, 48)
FIXED = (32, 64)


@pytest.fixture(scope="module")
def tiny():
    config = model_config(vocab_size=40, d_model=16, num_heads=2, num_layers=1, mlp_dim=32, max_len=64)
    model = Transformer(config)
    params = model.init(jax.random.key(0), jnp.ones((1, 4), jnp.int32), jnp.ones((1, 4), jnp.int32))["params"]
    rng = np.random.default_rng(0)
    src = [list(rng.integers(4, 40, n)) for n in rng.integers(2, 45, 40)]
    tgt = [list(rng.integers(4, 40, n)) for n in rng.integers(2, 45, 40)]
    return model, params, src, tgt


# Beam search under a limit is in the default run (test_a_limit_stops_...); beam_size 3 here compiles as many
# programs again as greedy's, so it runs with `pytest -m slow`.
@pytest.mark.parametrize("beam_size", [1, pytest.param(3, marks=pytest.mark.slow)])
def test_translations_at_fixed_lengths_are_the_bucketed_ones_from_fewer_programs(tiny, beam_size):
    model, params, src, _ = tiny
    run = lambda lengths: translate.translate(
        model,
        params,
        src,
        beam_size=beam_size,
        alpha=0.6,
        max_extra_length=6,
        bucket_lengths=BUCKETS,
        rows=8,
        lengths=lengths,
    )
    with CompileCounter() as bucketed:
        want = run(())
    with CompileCounter() as fixed:
        got = run(FIXED)
    assert got == want
    assert (
        sum(len(t) == min(b + 6, 64) for t, b in zip(want, (batching.bucket_length(len(s), BUCKETS) for s in src))) > 0
    )
    # 40 sources in 5 batches of 8 across the buckets; at fixed lengths, one decode program per length used
    assert fixed.totals()["compiled"] < bucketed.totals()["compiled"]
    assert len({batching.bucket_length(batching.bucket_length(len(s), BUCKETS), FIXED) for s in src}) == 2


# a full decode at three cache segments (~35 s of one core): kept out of the default suite's time budget
@pytest.mark.slow
def test_a_limit_stops_the_decode_where_a_smaller_max_len_would(tiny):
    model, params, src, _ = tiny
    batch = jnp.asarray(batching.BatchSchedule.assemble(src[:4], [[]] * 4, 4, 48).src)
    want = greedy_decode(model, params, batch, 20)
    got = jax.jit(lambda p, s, n: greedy_decode(model, params, s, 40, limit=n))(params, batch, jnp.int32(20))
    np.testing.assert_array_equal(got[:, :20], want)
    assert (np.asarray(got[:, 20:]) == model.config.pad_id).all()
    want_beam, want_score = beam_search(model, params, batch, beam_size=3, max_len=20)
    got_beam, got_score = beam_search(model, params, batch, beam_size=3, max_len=40, limit=jnp.int32(20))
    np.testing.assert_array_equal(got_beam[:, :20], want_beam)
    np.testing.assert_allclose(got_score, want_score, rtol=1e-6)


def test_dev_loss_at_fixed_lengths_is_the_bucketed_one(tiny):
    model, params, src, tgt = tiny

    class Ids:
        encode = staticmethod(lambda texts: [[int(w) for w in t.split()] for t in texts])

    corpus = SimpleNamespace(src=[" ".join(map(str, s)) for s in src], tgt=[" ".join(map(str, t)) for t in tgt])
    config = lambda lengths: SimpleNamespace(
        model=SimpleNamespace(max_len=64),
        eval=SimpleNamespace(lengths=lengths),
        data=SimpleNamespace(bucket_lengths=BUCKETS, token_budget=256),
    )
    step = dev.eval_step_fn(model)
    bucketed, fixed = (batching.dev_batches(config(lengths), Ids, corpus) for lengths in ((), FIXED))
    assert {b["src"].shape[1] for b in fixed} == {32, 64} and len({b["src"].shape for b in bucketed}) > 2
    # the same per-token sums, grouped into other batches: equal up to float32 summation order
    np.testing.assert_allclose(dev.dev_loss(params, fixed, step), dev.dev_loss(params, bucketed, step), rtol=1e-5)


def test_the_preset_packs_only_when_asked_and_bad_eval_lengths_are_named():
    from configs import ablation_heads, default, table3_preset
    from training import config as config_lib

    committed = ablation_heads.get_config("h=8")
    assert committed.data.pack_length == 0 and tuple(committed.eval.lengths) == ()  # the committed points' recipe
    packed = table3_preset.apply(default.get_config("h=8"), packed=True)
    assert packed.data.pack_length == table3_preset.PACK_LENGTH
    assert tuple(packed.eval.lengths) == (*table3_preset.EVAL_LENGTHS, packed.model.max_len)
    assert packed.to_dict() | {"data": None, "eval": None} == committed.to_dict() | {"data": None, "eval": None}
    config_lib.validate(packed)
    packed.eval.lengths = (32, 64)  # shorter than max_len: a pair would have no fixed length to go to
    with pytest.raises(ValueError, match=r"eval.lengths"):
        config_lib.validate(packed)
