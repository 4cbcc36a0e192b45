"""Train a translation model: python train.py --config configs/default.py --workdir runs/default

Multi-host: every process runs this same command (see docs/distributed.md).
"""

import importlib.util
import sys
from pathlib import Path

import jax
from absl import app, flags
from ml_collections import config_flags

from training.core import errors, logs
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


def check_config_path(argv) -> None:
    """Load --config's file and call its get_config once before absl does, so that a missing file, a syntax error or a
    bad argument is one line naming the file (absl's flag parser prints a paragraph with the config's traceback)."""
    for i, arg in enumerate(argv):
        value = (
            arg.split("=", 1)[1]
            if arg.startswith("--config=")
            else argv[i + 1]
            if arg == "--config" and i + 1 < len(argv)
            else None
        )
        if value is None:
            continue
        path, *args = value.split(":", 1)
        if not Path(path).is_file():
            raise FileNotFoundError(f"--config {path}: no such config file")
        try:
            spec = importlib.util.spec_from_file_location("_checked_config", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            if not callable(getattr(module, "get_config", None)):
                raise ValueError("defines no get_config(); expected an ml_collections config file")
            module.get_config(*args)
        except SyntaxError as error:
            raise ValueError(
                f"--config {path} line {error.lineno}: {error.msg}; expected a Python config file"
            ) from None
        except Exception as error:  # the config file's own code: reported in one line, its traceback with --verbose
            if any(a.split("=")[0] in ("--verbose", "-v", "--v", "--verbosity") for a in argv):
                raise
            text = errors.one_line(error)
            raise ValueError(
                text if text.startswith(value) else f"--config {value}: {type(error).__name__}: {text}"
            ) from None


if __name__ == "__main__":
    errors.run_reporting_user_errors("train.py", lambda: (check_config_path(sys.argv[1:]), app.run(main)))
