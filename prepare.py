"""Prepare a config's training data once, before any run: python prepare.py --config configs/base.py

Trains the vocabulary train.py would train (the config's seed; `--vocab_seed 0` for a sweep's shared one) and
encodes the training split into the prepared-data cache (training.prepared), then prints the directory and
its manifest's SHA-256. Every later run and sweep point on the same corpus and vocabulary reads it.
"""

import json
import sys

from absl import app, flags
from ml_collections import config_flags

from training.core import errors, logs
from training import prepared

config_flags.DEFINE_config_file("config", None, "ml_collections config file (path[:args])", lock_config=True)
flags.DEFINE_string(
    "cache", None, f"the prepared-data cache (default ${prepared.ENV}, else ~/.cache/headcount/prepared)"
)
flags.DEFINE_integer(
    "vocab_seed", None, "the vocabulary's seed (default: the config's, as train.py; 0: a sweep's shared vocabulary)"
)
flags.mark_flags_as_required(["config"])


def main(argv):
    del argv
    logs.configure(verbose=flags.FLAGS.verbosity >= 1, main_process=True)
    config = flags.FLAGS.config
    if flags.FLAGS.vocab_seed is not None and flags.FLAGS.vocab_seed < 0:
        raise ValueError(f"--vocab_seed {flags.FLAGS.vocab_seed}: expected a seed >= 0")
    data = prepared.prepare(config, cache=flags.FLAGS.cache, vocab_seed=flags.FLAGS.vocab_seed)
    prepared.schedule(config, data)  # a packed config's plan too (config.seed's), which its first run would compute
    manifest = data.manifest
    print(
        json.dumps(
            {
                "directory": str(data.directory),
                "manifest_sha256": data.manifest_sha256,
                "pairs": manifest["pairs"],
                "tokens": manifest["tokens"],
            }
        )
    )


if __name__ == "__main__":
    errors.run_reporting_user_errors("prepare.py", lambda: (errors.check_config_path(sys.argv[1:]), app.run(main)))
