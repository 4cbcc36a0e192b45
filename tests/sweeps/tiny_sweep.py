"""A two-point head sweep small enough for the test suite (see test_sweep.py)."""

from configs import ablation_heads

SWEEP_NAME = "tiny_heads"
SWEEP_KEY = "h"
SWEEP_TEST_SPLIT = "test_2016_flickr"
SWEEP_VALUES = (1, 2)
SWEEP_REFERENCE = 2


def get_config(arg=None):
    config = ablation_heads.get_config(arg)
    config.num_train_steps = 4
    config.log_every_steps = 2
    config.eval_every_steps = 4
    config.checkpoint_every_steps = 2
    config.data.train_limit = 300
    config.data.vocab_size = 300
    config.model.dtype = "float32"  # kv_cache_bytes_per_token below assumes 4-byte entries
    config.data.token_budget = 512
    # Two buckets up to max_len: every dev pair fits one of two batch shapes (one eval compile each).
    # max_len stays above the first 64 dev sources (79 tokens), which the decode-speed batch reads uncut.
    config.data.bucket_lengths = (64, 128)
    config.model.update(d_model=16, num_layers=1, mlp_dim=32, max_len=128)
    config.eval.bleu_examples = 8
    config.eval.max_extra_length = 5
    return config
