"""`evaluate.decoding_speed`: cache bytes per token by hand (K/V, and MLA's latent), and sources longer than the
model reads."""

import jax
import jax.numpy as jnp

from models import Transformer
from tiny import model_config
from training.evaluation.evaluate import decoding_speed


def test_cache_bytes_by_hand_and_an_over_long_source_is_cut_to_max_len():
    config = model_config(d_model=16, num_kv_heads=2, mlp_dim=24, max_len=8)
    model = Transformer(config)
    params = model.init(jax.random.key(0), jnp.ones((1, 4), jnp.int32), jnp.ones((1, 4), jnp.int32))["params"]
    src_ids = [[5, 6, 7], list(range(3, 15))]  # 12 tokens: longer than max_len, as a dev sentence may be
    result = decoding_speed(model, params, src_ids, bucket_lengths=(4, 8, 16), beam_sizes=(1,), repeats=1)
    # float32 K and V of 2 KV heads of 4 dims, in each of 2 decoder layers: 2 * 2 * 2 * 4 * 4 bytes a token
    assert result["kv_cache_bytes_per_token"] == 2 * 2 * 2 * 4 * 4
    assert result["decode_batch"] == 2 and result["decode_tokens_per_s_beam1"] > 0


def test_mla_counts_its_latent_cache():
    config = model_config(d_model=16, mlp_dim=24, max_len=8, attention_type="mla", attention_options={"latent_dim": 6})
    model = Transformer(config)
    params = model.init(jax.random.key(0), jnp.ones((1, 4), jnp.int32), jnp.ones((1, 4), jnp.int32))["params"]
    result = decoding_speed(model, params, [[5, 6, 7]], bucket_lengths=(4, 8), beam_sizes=(1,), repeats=1)
    # one float32 latent of d_c = 6 a token in each of 2 decoder self-attentions (the cross-attention's source K/V
    # are a fixed cache, not one that grows with the output)
    assert result["kv_cache_bytes_per_token"] == 2 * 6 * 4


def test_a_model_that_never_ends_runs_every_step_to_the_cap():
    """EOS made impossible: each of 2 rows emits max_len = 8 tokens (the model's, below bucket 4 + 50), greedy and
    beam."""
    config = model_config(d_model=16, num_layers=1, mlp_dim=24, max_len=8, tie_embeddings=False)
    model = Transformer(config)
    params = model.init(jax.random.key(0), jnp.ones((1, 4), jnp.int32), jnp.ones((1, 4), jnp.int32))["params"]
    bias = params["decoder"]["logits"]["bias"]
    params["decoder"]["logits"]["bias"] = bias.at[config.eos_id].set(-1e9)
    result = decoding_speed(model, params, [[5, 6, 7], [8, 9]], bucket_lengths=(4, 8), beam_sizes=(1, 2), repeats=1)
    for beam in (1, 2):
        assert result[f"decode_steps_beam{beam}"] == 8 and result[f"decode_output_tokens_beam{beam}"] == 2 * 8
