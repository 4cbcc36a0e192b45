"""Evaluate or use a trained model; it reads the run in the workdir and writes only the translations
(WORKDIR/hypotheses.SPLIT.beamK.txt unless --hypotheses PATH, or --output with --input).

    python eval.py --workdir runs/default [--split test_2016_flickr] [--beam_size 4] [--hypotheses PATH]
    python eval.py --workdir runs/default --input sentences.de --output sentences.en
"""

import json
import os
import sys
from pathlib import Path

from absl import app, flags, logging

from training.core import compile_cache, errors, platforms
from training.data import corpus
from training.evaluation import evaluate
from training.evaluation.loaded import load_run

flags.DEFINE_string(
    "workdir", None, "a train.py workdir (its run only read; the default --hypotheses is written into it)"
)
flags.DEFINE_string("split", "val", "split to score (perplexity, sacreBLEU)")
flags.DEFINE_integer("beam_size", 4, "beam size (1 = greedy)")
flags.DEFINE_string(
    "hypotheses", None, "where to write the split's translations (default WORKDIR/hypotheses.SPLIT.beamK.txt)"
)
flags.DEFINE_string("input", None, "translate this text file (one sentence per line) instead")
flags.DEFINE_string("output", None, "where to write the translations of --input")
flags.DEFINE_string(
    "compilation_cache_dir",
    "auto",
    "JAX's persistent compilation cache for this command: 'auto' "
    "(JAX_COMPILATION_CACHE_DIR, else $XDG_CACHE_HOME or ~/.cache, /headcount/jax), '' none, or a path; "
    "never the compilation_cache_dir in the workdir's config.json",
)
flags.mark_flag_as_required("workdir")


def check_writable(path: Path, flag: str, hint: str = "") -> None:
    """ValueError up front (before minutes of decoding) unless `path` can be written."""
    folder = path.parent if str(path.parent) else Path(".")
    if (
        path.is_dir()
        or not folder.is_dir()
        or not os.access(folder, os.W_OK | os.X_OK)
        or (path.exists() and not os.access(path, os.W_OK))
    ):
        raise ValueError(f"{flag} {path} cannot be written ({folder} is not a writable directory){hint}")


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)
    f = flags.FLAGS
    if (f.input is None) != (f.output is None):
        raise app.UsageError("--input and --output go together")
    if not Path(f.workdir).is_dir():
        raise FileNotFoundError(f"--workdir {f.workdir} is not a directory: is it a train.py workdir?")
    if f.input:
        check_writable(Path(f.output), "--output")
    else:
        hypotheses = Path(f.hypotheses) if f.hypotheses else evaluate.hypotheses_path(f.workdir, f.split, f.beam_size)
        check_writable(
            hypotheses, "--hypotheses", "" if f.hypotheses else ": pass --hypotheses PATH to write them elsewhere"
        )
    cache = compile_cache.enable(f.compilation_cache_dir, "--compilation_cache_dir")
    run = load_run(f.workdir, cache)
    if not f.input:
        corpus.check_split(run.config, f.split, "--split")
    print(f"eval.py: scoring step {run.step} ({run.checkpoint})", file=sys.stderr, flush=True)
    if f.input:
        n = evaluate.translate_file(f.workdir, f.input, f.output, f.beam_size, run=run)
        print(f"translated {n} lines of {f.input} into {f.output} with step {run.step} ({run.checkpoint})")
        return
    # the score is printed before the translations are written
    evaluate.score_split(
        run, f.split, f.beam_size, f.workdir, hypotheses, report=lambda r: print(json.dumps(r, indent=2), flush=True)
    )


if __name__ == "__main__":
    platforms.choose()  # JAX on the CPU alone where no accelerator shows (docs/training.md)
    errors.run_reporting_user_errors("eval.py", lambda: app.run(main))
