"""A one-point packed sweep small enough to train stacked in the test suite (test_stacked_sweep.py): the tiny
sweep's model and schedule (tiny_sweep.py), on packed rows, so that each step has one batch shape."""

from configs import ablation_heads

SWEEP_NAME = "tiny_stacked"
SWEEP_KEY = "h"
SWEEP_TEST_SPLIT = "test_2016_flickr"
SWEEP_VALUES = (2,)
SWEEP_REFERENCE = 2


def get_config(arg=None):
    config = ablation_heads.get_config(arg)
    config.num_train_steps = 6
    config.log_every_steps = 1
    config.eval_every_steps = 3
    config.checkpoint_every_steps = 3
    config.data.train_limit = 300
    config.data.vocab_size = 300
    config.model.dtype = "float32"
    config.data.token_budget = 512
    config.data.bucket_lengths = (64, 128)
    config.data.pack_length = 64
    config.eval.lengths = (64, 128)
    config.model.update(d_model=16, num_layers=1, mlp_dim=32, max_len=128)
    config.eval.bleu_examples = 8
    config.eval.max_extra_length = 5
    return config
