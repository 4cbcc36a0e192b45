"""Train a translation model: python train.py --config configs/default.py --workdir runs/default"""

from absl import app, flags, logging
from ml_collections import config_flags

from training.loop import train_and_evaluate

config_flags.DEFINE_config_file("config", None, "ml_collections config file (path[:args])", lock_config=True)
flags.DEFINE_string("workdir", None, "run directory: config.json, checkpoints, metrics, vocabulary")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
    del argv
    logging.set_verbosity(logging.INFO)
    train_and_evaluate(flags.FLAGS.config, flags.FLAGS.workdir)


if __name__ == "__main__":
    app.run(main)
