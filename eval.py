"""Evaluate or use a trained model.

    python eval.py --workdir runs/default [--split test_2016_flickr] [--beam_size 4]
    python eval.py --workdir runs/default --input sentences.de --output sentences.en
"""

import json
from pathlib import Path

from absl import app, flags, logging

from training import config as config_lib
from training.evaluation import evaluate
from training.run import compile_cache, errors

flags.DEFINE_string("workdir", None, "a train.py workdir")
flags.DEFINE_string("split", "val", "split to score (perplexity, sacreBLEU)")
flags.DEFINE_integer("beam_size", 4, "beam size (1 = greedy)")
flags.DEFINE_string("input", None, "translate this text file (one sentence per line) instead")
flags.DEFINE_string("output", None, "where to write the translations of --input")
flags.mark_flag_as_required("workdir")


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)
    f = flags.FLAGS
    if (f.input is None) != (f.output is None):
        raise app.UsageError("--input and --output go together")
    saved = Path(f.workdir) / "config.json"
    if saved.exists():  # else evaluate's own check names what is missing
        compile_cache.enable(config_lib.load_saved(saved).compilation_cache_dir)
    if f.input:
        n = evaluate.translate_file(f.workdir, f.input, f.output, f.beam_size)
        print(f"translated {n} lines of {f.input} into {f.output}")
        return
    result = evaluate.evaluate_split(f.workdir, f.split, f.beam_size)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    errors.run_reporting_user_errors("eval.py", lambda: app.run(main))
