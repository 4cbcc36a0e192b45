"""Run a config sweep and collect its tables and plots.

    python sweep.py --config configs/ablation_heads.py --workdir runs/heads --seeds 3
    python sweep.py --config configs/ablation_heads.py --workdir runs/heads --seeds 3 --launcher slurm \
        --slurm_partition gpu --slurm_gpus 1 --slurm_time_min 120
    python sweep.py --config configs/ablation_heads.py --workdir runs/heads --seeds 3 --points_per_device 3  # 3 per GPU
    python sweep.py --config configs/ablation_heads.py:packed --workdir runs/heads_packed --points_per_device 4  # packed preset
    python sweep.py --config configs/ablation_heads.py --workdir runs/heads --seeds 3 --print_commands
    python sweep.py --collect [--config configs/ablation_heads.py] [--results_dir results]
    python sweep.py --study configs/table3_preset.py [--results_dir results]   # several sweeps, one Holm family
    python sweep.py --plan --config configs/ablation_heads.py --target tpu:v5e   # compile every point, train nothing
    python sweep.py --adopt --config configs/ablation_dk.py [--results_dir results]  # shared runs' later seeds

A finished point's small files go to RESULTS_DIR/NAME/KEYVALUE/seedK/ (commit them); points stored
there are skipped, wherever the sweep is continued, and interrupted ones resume from their
checkpoint in WORKDIR. `--launcher slurm` submits one submitit job per unfinished point and waits
for them; `--print_commands` prints one command per point instead; `--collect` rebuilds
RESULTS_DIR/NAME.{md,csv,png} from RESULTS_DIR/NAME/ alone.
"""

import os
import sys
from pathlib import Path

if "--plan" in sys.argv:  # read when JAX is imported: a plan compiles for its --target on this host's CPU
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

from absl import app, flags

from training.core import errors, logs
from training.run import aot
from sweeps import launch, plan, study, sweep, tables as sweep_tables

flags.DEFINE_string(
    "config",
    None,
    "a sweep config file (configs/ablation_heads.py, ablation_kv.py, ablation_dk.py); "
    "PATH:packed, the Table 3 sweeps' packed preset, stored as NAME_packed (sweeps.sweep.variant)",
)
flags.DEFINE_string("workdir", None, "the sweep's run directories (checkpoints): one subdirectory per point and seed")
flags.DEFINE_integer("seeds", 3, "seeds per point (0, 1, ..., or from the config's SWEEP_FIRST_SEED)")
flags.DEFINE_integer("jobs", 1, "--launcher local: points run at the same time")
flags.DEFINE_integer(
    "points_per_device",
    None,
    "--launcher local: point processes per accelerator, each seeing one "
    "device and 1/K of its memory (on a CPU: K at a time); instead of --jobs",
)
flags.DEFINE_enum(
    "launcher", "local", ["local", "slurm"], "local: subprocesses here; slurm: one submitit job per point"
)
flags.DEFINE_string("slurm_partition", "", "--launcher slurm: partition ('' : the cluster's default)")
flags.DEFINE_integer("slurm_gpus", 0, "--launcher slurm: GPUs per job")
flags.DEFINE_integer("slurm_time_min", 240, "--launcher slurm: time limit per job, minutes")
flags.DEFINE_integer("slurm_cpus", 4, "--launcher slurm: CPU cores per job")
flags.DEFINE_bool("print_commands", False, "print each unfinished point's command and exit")
flags.DEFINE_bool("collect", False, "only rebuild the tables and plots from the results stored in --results_dir")
flags.DEFINE_bool(
    "adopt",
    False,
    "with --config: copy every seed the other sweeps have stored of this sweep's shared "
    "points (rows A's h = 8 for rows B, KV, family; sweeps.sweep.adopt_stored), then exit; --collect after",
)
flags.DEFINE_string(
    "study",
    None,
    "a study config (configs/table3_preset.py): write RESULTS_DIR/STUDY_NAME.md, its "
    "sweeps' comparisons under one Holm family (sweeps/study.py), from --results_dir alone",
)
flags.DEFINE_string(
    "results_dir", "results", "finished points' files (NAME/...) and the tables NAME.md, NAME.csv, NAME.png"
)
flags.DEFINE_string("point", None, "internal / cluster use: run only this point (KEY=VALUE) ...")
flags.DEFINE_integer("seed", 0, "... with this seed")
flags.DEFINE_bool(
    "restart",
    False,
    "with --point: start that point afresh, the run its workdir holds moved to "
    "WORKDIR/NAME/previous/TIME/ (a run that cannot resume, e.g. one stopped before its first checkpoint)",
)
flags.DEFINE_string(
    "compilation_cache_dir",
    None,
    "internal / cluster use: the sweep's one persistent compilation "
    "cache, used by points whose config.compilation_cache_dir is 'auto'",
)

flags.DEFINE_bool(
    "plan",
    False,
    "with --config and --target: compile every point's train step for the target "
    "(python -m bench.aot's compile) and print memory, FLOPs and points a device; nothing is trained",
)
flags.DEFINE_string(
    "target", None, "--plan: tpu:CHIP[:TOPOLOGY] or cuda:GPU[:COUNT], e.g. tpu:v5e, tpu:v4:2x2x1, cuda:h100"
)
flags.DEFINE_string("mesh", "-1,1", "--plan: DATA,MODEL shards of each point's mesh (-1: the rest of the devices)")

SLURM_FLAGS = ("slurm_partition", "slurm_gpus", "slurm_time_min", "slurm_cpus")


def main(argv):
    del argv
    f = flags.FLAGS
    results_dir = Path(f.results_dir)
    if f.study:
        print(f"wrote {study.write(results_dir, sweep.import_file(f.study, '--study'))}")
        return
    if f.adopt:
        if f.config is None:
            raise app.UsageError("--adopt needs --config (the sweep that shares another's runs)")
        adopted = sweep.adopt_stored(sweep.load_module(f.config), results_dir)
        print(f"adopted {len(adopted)} point(s): {', '.join(p.name for p in adopted) or 'none new'}")
        return
    if f.plan:
        if f.config is None or f.target is None:
            raise app.UsageError("--plan needs --config (a sweep config) and --target")
        target = aot.parse_target(f.target)
        data, model = aot.parse_mesh(f.mesh)
        print(plan.table(plan.plan(sweep.load_module(f.config), target, data, model), target))
        return
    if f.collect:
        names = [sweep.load_module(f.config).SWEEP_NAME] if f.config else None
        for path in sweep_tables.collect(results_dir, names):
            print(f"wrote {path}")
        return
    if f.config is None or f.workdir is None:
        raise app.UsageError("--config and --workdir are required unless --collect")
    if f.launcher == "local" and (given := [n for n in SLURM_FLAGS if f[n].present]):
        raise ValueError(f"--{given[0]} applies to --launcher slurm only, got --launcher local")
    if f.launcher == "slurm" and f.points_per_device is not None:
        raise ValueError(
            "--points_per_device applies to --launcher local only (a SLURM job gets its own devices: --slurm_gpus)"
        )
    if f.restart and not f.point:  # one point, named: a whole sweep started over would discard every run in --workdir
        raise ValueError("--restart applies to one point: give --point KEY=VALUE and --seed K")
    workdir = Path(f.workdir)
    module = sweep.load_module(f.config)
    if f.point:
        logs.configure(verbose=f.verbosity >= 1, main_process=True)  # the point's training log, quiet as train.py's
        cache_dir = Path(f.compilation_cache_dir) if f.compilation_cache_dir else None
        sweep.run_point(
            f.config, workdir, sweep.parse_point(f.point, f.seed, module), results_dir, cache_dir, f.restart
        )
        return
    if f.print_commands:
        for point in sweep.pending(results_dir, f.config, module, f.seeds):
            print(
                sweep.shell_line(
                    sweep.point_command(
                        ["python", "sweep.py"], f.config, workdir, results_dir, point, sweep.sweep_cache_dir()
                    )
                )
            )
        return
    program = [sys.executable, str(Path(__file__).resolve())]
    if f.launcher == "slurm":
        options = launch.SlurmOptions(f.slurm_partition, f.slurm_gpus, f.slurm_time_min, f.slurm_cpus)
        failed = launch.wait(launch.submit(program, f.config, workdir, results_dir, f.seeds, options))
    else:
        failed = sweep.run_sweep(program, f.config, workdir, results_dir, f.seeds, f.jobs, f.points_per_device)
    for path in sweep_tables.collect(results_dir, [module.SWEEP_NAME]):
        print(f"wrote {path}")
    if failed:
        sys.exit(f"{len(failed)} point(s) failed: {', '.join(p.name for p in failed)}; see WORKDIR/NAME.log")


if __name__ == "__main__":
    errors.run_reporting_user_errors("sweep.py", lambda: app.run(main))
