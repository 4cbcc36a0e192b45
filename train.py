"""Train a translation model: python train.py --config configs/default.py --workdir runs/default

Multi-host: every process runs this same command (see docs/distributed.md).
"""

import sys

import jax
from absl import app, flags
from ml_collections import config_flags

from training.core import errors, logs, platforms
from training.parallel import distributed
from training.run.loop import train_and_evaluate

config_flags.DEFINE_config_file("config", None, "ml_collections config file (path[:args])", lock_config=True)
flags.DEFINE_string("workdir", None, "run directory: config.json, checkpoints, metrics, vocabulary")
flags.DEFINE_bool(
    "restart",
    False,
    "start the run afresh: what --workdir holds (but its lock) is moved to "
    "WORKDIR/previous/TIME/ first, nothing deleted; without it a workdir's run is resumed or refused",
)
flags.DEFINE_bool(
    "verbose", False, "also log every parameter's sharding and the libraries' INFO messages (orbax, JAX); so does -v 1"
)
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
    del argv
    verbose = flags.FLAGS.verbose or flags.FLAGS.verbosity >= 1
    logs.configure(verbose=verbose, main_process=True)  # before JAX starts its backends, which log at INFO
    distributed.initialize(flags.FLAGS.config.distributed)  # before anything else touches JAX's devices
    logs.configure(verbose=verbose, main_process=jax.process_index() == 0)
    train_and_evaluate(flags.FLAGS.config, flags.FLAGS.workdir, restart=flags.FLAGS.restart)


if __name__ == "__main__":
    platforms.choose()  # JAX on the CPU alone where no accelerator shows (docs/training.md)
    errors.run_reporting_user_errors("train.py", lambda: (errors.check_config_path(sys.argv[1:]), app.run(main)))
