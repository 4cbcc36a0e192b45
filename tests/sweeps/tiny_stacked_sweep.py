"""A one-point packed sweep small enough to train stacked in the test suite (test_stacked_sweep.py): the tiny
sweep's model and schedule (tiny_sweep.py, read by path: a config file is loaded by path, not as a package module),
on packed rows, so that each step has one batch shape, and with two evaluations and checkpoints in six steps."""

from pathlib import Path

from sweeps import schema

tiny_sweep = schema.import_file(Path(__file__).with_name("tiny_sweep.py"))

SWEEP_NAME = "tiny_stacked"
SWEEP_KEY = "h"
SWEEP_TEST_SPLIT = "test_2016_flickr"
SWEEP_VALUES = (2,)
SWEEP_REFERENCE = 2


def get_config(arg=None):
    config = tiny_sweep.get_config(arg)
    config.num_train_steps = 6
    config.log_every_steps = 1
    config.eval_every_steps = 3
    config.checkpoint_every_steps = 3
    config.data.pack_length = 64
    config.eval.lengths = (64, 128)
    return config
