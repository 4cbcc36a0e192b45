"""Run a config sweep and collect its tables and plots.

    python sweep.py --config configs/ablation_heads.py --workdir runs/heads --seeds 2
    python sweep.py --config configs/ablation_heads.py --workdir runs/heads --seeds 2 --print_commands
    python sweep.py --collect --workdir runs/heads [--results_dir results]

Finished points are skipped and interrupted ones resume; `--print_commands` prints one command
per point for a cluster scheduler instead of running them, and `--collect` rebuilds
RESULTS_DIR/NAME.{md,csv,png} from the finished runs alone.
"""

import sys
from pathlib import Path

from absl import app, flags

from training.run import errors, logs
from training.sweeps import sweep, tables as sweep_tables

flags.DEFINE_string("config", None, "a sweep config file (configs/ablation_heads.py, configs/ablation_kv.py)")
flags.DEFINE_string("workdir", None, "the sweep's directory: one subdirectory per point and seed")
flags.DEFINE_integer("seeds", 2, "seeds per point (0, 1, ...)")
flags.DEFINE_integer("jobs", 1, "points run at the same time")
flags.DEFINE_bool("print_commands", False, "print each unfinished point's command and exit")
flags.DEFINE_bool("collect", False, "only rebuild the tables and plots from finished points")
flags.DEFINE_string("results_dir", "results", "where NAME.md, NAME.csv and NAME.png go")
flags.DEFINE_string("point", None, "internal / cluster use: run only this point (KEY=VALUE) ...")
flags.DEFINE_integer("seed", 0, "... with this seed")
flags.mark_flag_as_required("workdir")


def main(argv):
    del argv
    f = flags.FLAGS
    workdir = Path(f.workdir)
    if not f.collect and f.config is None:
        raise app.UsageError("--config is required unless --collect")
    if f.point:
        logs.configure(verbose=f.verbosity >= 1, main_process=True)  # the point's training log, quiet as train.py's
        key, _, value = f.point.partition("=")
        sweep.run_point(f.config, workdir, sweep.Point(key, int(value), f.seed))
        return
    if f.print_commands:
        module = sweep.load_module(f.config)
        sweep.write_spec(workdir, f.config, module, f.seeds)
        for point in sweep.points(module, f.seeds):
            if not sweep.is_finished(workdir, point):
                print(sweep.shell_line(sweep.point_command(["python", "sweep.py"], f.config, workdir, point)))
        return
    program = [sys.executable, str(Path(__file__).resolve())]
    failed = [] if f.collect else sweep.run_sweep(program, f.config, workdir, f.seeds, f.jobs)
    for path in sweep_tables.collect(workdir, Path(f.results_dir)):
        print(f"wrote {path}")
    if failed:
        sys.exit(f"{len(failed)} point(s) failed: {', '.join(p.name for p in failed)}; see WORKDIR/NAME.log")


if __name__ == "__main__":
    errors.run_reporting_user_errors("sweep.py", lambda: app.run(main))
