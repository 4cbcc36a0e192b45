"""Train a translation model: python train.py --config configs/default.py --workdir runs/default

Multi-host: every process runs this same command (see README, "Multi-device and multi-host training").
"""

import jax
from absl import app, flags, logging
from ml_collections import config_flags

from training import distributed
from training.loop import train_and_evaluate

config_flags.DEFINE_config_file("config", None, "ml_collections config file (path[:args])", lock_config=True)
flags.DEFINE_string("workdir", None, "run directory: config.json, checkpoints, metrics, vocabulary")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
    del argv
    distributed.initialize(flags.FLAGS.config.distributed)  # before anything else touches JAX's devices
    logging.set_verbosity(logging.INFO if jax.process_index() == 0 else logging.WARNING)
    train_and_evaluate(flags.FLAGS.config, flags.FLAGS.workdir)


if __name__ == "__main__":
    app.run(main)
