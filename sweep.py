r"""Run a config sweep and collect its tables and plots.

    python sweep.py run --config configs/ablation_heads.py --workdir runs/heads --seeds 3
    python sweep.py run --config configs/ablation_heads.py --workdir runs/heads --seeds 3 --launcher slurm \
        --slurm_partition gpu --slurm_gpus 1 --slurm_time_min 120
    python sweep.py run --config configs/ablation_heads.py --workdir runs/heads --seeds 3 --points_per_device 3
    python sweep.py run --config configs/ablation_heads.py:packed --workdir runs/heads_packed --points_per_device 4
    python sweep.py run --config configs/ablation_heads.py:packed --workdir runs/heads_packed --seeds 8 --stack_seeds 8
    python sweep.py run --config configs/ablation_heads.py --workdir runs/heads --seeds 3 --print_commands
    python sweep.py point --config configs/ablation_heads.py --workdir runs/heads --point h=8 --seed 0 [--restart]
    python sweep.py collect [--config configs/ablation_heads.py] [--results_dir results]
    python sweep.py study --config configs/table3_preset.py [--results_dir results]   # several sweeps, one Holm family
    python sweep.py plan --config configs/ablation_heads.py --target tpu:v5e   # compile every point, train nothing
    python sweep.py plan --config configs/ablation_heads.py:packed --target tpu:v5e:2x4 --stack_seeds 8  # hours
    python sweep.py adopt --config configs/ablation_dk.py [--results_dir results]  # shared runs' later seeds
    python sweep.py registered --config configs/head_size_blocked.py [--missing VALUE:SEED --why ...]  # preregistered

A finished point's small files go to RESULTS_DIR/NAME/KEYVALUE/seedK/ (commit them); points stored
there are skipped, wherever the sweep is continued, and interrupted ones resume from their
checkpoint in WORKDIR. `run` starts one process per unfinished point (`point`; `--points_per_device K`:
K of them on each GPU; `--stack_seeds S`: one per S seeds of a point, trained as one program);
`--launcher slurm` submits one submitit job per unfinished point (or stack) and waits for them;
`--print_commands` prints one command per point instead; `collect` rebuilds RESULTS_DIR/NAME.{md,csv,png}
from RESULTS_DIR/NAME/ alone. `--config PATH:packed` is the Table 3 sweeps' packed preset, stored as
NAME_packed. absl's logging flags (-v 1, --verbosity 1) go with any
subcommand: a point's training log is quiet (as train.py's) unless verbose.
"""

import argparse
import os
import sys
from pathlib import Path

# the first subcommand name given: read when JAX is imported, so a plan compiles for its --target on this host's CPU
if (
    next((a for a in sys.argv[1:] if a in ("run", "point", "collect", "study", "plan", "registered", "adopt")), None)
    == "plan"
):
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

from absl import app, flags
from absl.flags import argparse_flags

from training.core import errors, logs, platforms
from training.run import aot
from sweeps import launch, plan, point_run, registered, schema, study, tables as sweep_tables
from sweeps.adopt import adopt_stored

COMMANDS = ("run", "point", "collect", "study", "plan", "registered", "adopt")  # as spelled out for JAX_PLATFORMS above
SLURM_DEFAULTS = launch.SlurmOptions()


def parse_arguments(argv: list[str]):
    """The subcommand and its flags (absl's own, e.g. --verbosity, are accepted beside them, hidden in --help)."""
    parser = argparse_flags.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True, metavar="{" + ",".join(COMMANDS) + "}")

    def command(name, handler, help, config, config_required=True, results=True):
        sub = commands.add_parser(name, help=help, description=help)
        sub.set_defaults(handler=handler)
        sub.add_argument("--config", required=config_required, help=config)
        if results:
            sub.add_argument(
                "--results_dir",
                default="results",
                help="finished points' files (NAME/...) and the tables NAME.md, NAME.csv, NAME.png (default results)",
            )
        return sub

    sweep_config = (
        "a sweep config file (configs/ablation_heads.py, ablation_kv.py, ablation_dk.py); PATH:packed, the "
        "Table 3 sweeps' packed preset, stored as NAME_packed (sweeps.schema.variant)"
    )
    workdir = "the sweep's run directories (checkpoints): one subdirectory per point and seed"
    sub = command("run", run, "train every unfinished point of a sweep, then collect its tables", sweep_config)
    sub.add_argument("--workdir", required=True, help=workdir)
    sub.add_argument("--seeds", type=int, default=3, help="seeds per point (0, 1, ..., or from SWEEP_FIRST_SEED)")
    sub.add_argument(
        "--jobs",
        type=int,
        help="--launcher local: points run at the same time (default: one per GPU on a machine with several, else 1)",
    )
    sub.add_argument(
        "--points_per_device",
        type=int,
        help="--launcher local: point processes per accelerator, each seeing one device and 1/K of its memory "
        "(on a CPU: K at a time); instead of --jobs",
    )
    sub.add_argument(
        "--stack_seeds",
        type=int,
        help="train S seeds of a point as one program, laid over every device a process sees (docs/sweeps.md, "
        "'Stacked seeds'); packed configs only (PATH:packed); default: a process a seed",
    )
    sub.add_argument(
        "--launcher",
        choices=("local", "slurm"),
        default="local",
        help="local: subprocesses here; slurm: one submitit job per point",
    )
    for name, kind, meaning in (
        ("partition", str, "partition ('': the cluster's default)"),
        ("gpus", int, "GPUs per job"),
        ("time_min", int, "time limit per job, minutes"),
        ("cpus", int, "CPU cores per job"),
    ):
        default = getattr(SLURM_DEFAULTS, name)
        sub.add_argument(f"--slurm_{name}", type=kind, help=f"--launcher slurm: {meaning} (default {default!r})")
    sub.add_argument("--print_commands", action="store_true", help="print each unfinished point's command and exit")
    sub.add_argument("--restart", action="store_true", help=argparse.SUPPRESS)  # `point`'s: refused

    sub = command("point", one_point, "train and store one point (what `run` starts for each point)", sweep_config)
    sub.add_argument("--workdir", required=True, help=workdir)
    sub.add_argument("--point", required=True, help="the point, KEY=VALUE (e.g. h=8)")
    seeds = sub.add_mutually_exclusive_group(required=True)
    seeds.add_argument("--seed", type=int, help="its seed")
    seeds.add_argument(
        "--stacked_seeds",
        help="its seeds K,K,... trained as one program (what `run --stack_seeds` starts for each stack)",
    )
    sub.add_argument(
        "--restart",
        action="store_true",
        help="start the point afresh, the run its workdir holds moved to WORKDIR/NAME/previous/TIME/ "
        "(a run that cannot resume, e.g. one stopped before its first checkpoint)",
    )
    sub.add_argument(
        "--compilation_cache_dir",
        help="the sweep's one persistent compilation cache, used by points whose "
        "config.compilation_cache_dir is 'auto' (`run` passes its own)",
    )

    command(
        "collect",
        collect,
        "rebuild the tables and plots from the results stored in --results_dir alone",
        "a sweep config: collect that sweep only (default: every sweep stored)",
        config_required=False,
    )
    command(
        "study",
        write_study,
        "write RESULTS_DIR/STUDY_NAME.md, its sweeps' comparisons under one Holm family (sweeps/study.py), "
        "from --results_dir alone",
        "a study config (configs/table3_preset.py)",
    )
    sub = command(
        "plan",
        plan_sweep,
        "compile every point's train step for --target (python -m bench.aot's compile) and print memory, "
        "FLOPs and points a device; nothing is trained",
        sweep_config,
        results=False,
    )
    sub.add_argument(
        "--target", required=True, help="tpu:CHIP[:TOPOLOGY] or cuda:GPU[:COUNT], e.g. tpu:v5e, tpu:v4:2x2x1, cuda:h100"
    )
    sub.add_argument(
        "--mesh", help="DATA,MODEL shards of each point's mesh (-1: the rest; default -1,1); not with --stack_seeds"
    )
    sub.add_argument(
        "--stack_seeds",
        type=int,
        help="plan `run --stack_seeds S`: each point's seeds S at a time as one program over every device of "
        "--target (memory, collectives, the roofline of a stacked step) and the sweep's device-hours, a lower "
        "bound from the compiled roofline (sweeps/plan.py)",
    )
    sub.add_argument("--seeds", type=int, help="--stack_seeds: seeds a point (default 3)")
    sub.add_argument(
        "--steps", type=int, help="--stack_seeds: training steps a point (default: each point's num_train_steps)"
    )
    sub = command(
        "registered",
        registered_analysis,
        "write RESULTS_DIR/NAME_registered.md: the sweep's contrasts as its SWEEP_PREREGISTRATION fixes them, "
        "paired by seed (sweeps/registered.py), from --results_dir alone; refused until every registered run is "
        "in or declared missing",
        "a sweep config with SWEEP_PREREGISTRATION (configs/head_size_blocked.py)",
    )
    sub.add_argument(
        "--missing",
        action="append",
        default=[],
        metavar="VALUE:SEED",
        help="a registered run declared missing under the preregistration's rules (repeat for more); needs --why",
    )
    sub.add_argument("--why", help="why the --missing runs are missing, as the preregistration's rules allow")
    command(
        "adopt",
        adopt,
        "copy every seed the other sweeps have stored of this sweep's shared points (rows A's h = 8 for "
        "rows B, KV, family; sweeps.adopt.adopt_stored); `collect` after",
        "the sweep config that shares another's runs",
    )
    return parser.parse_args(argv[1:])


def run(args) -> None:
    given = [name for name, value in vars(args).items() if name.startswith("slurm_") and value is not None]
    if args.launcher == "local" and given:
        raise ValueError(f"--{given[0]} applies to --launcher slurm only, got --launcher local")
    for name in ("jobs", "points_per_device"):
        if args.launcher == "slurm" and getattr(args, name) is not None:
            raise ValueError(
                f"--{name} applies to --launcher local only (a SLURM job gets its own devices: --slurm_gpus)"
            )
    if args.restart:  # one point, named: a whole sweep started over would discard every run in --workdir
        raise ValueError("--restart applies to one point: give --point KEY=VALUE and --seed K (sweep.py point)")
    workdir, results_dir = Path(args.workdir), Path(args.results_dir)
    module = schema.load_module(args.config)
    if args.print_commands:
        for p in launch.jobs_of(launch.pending(results_dir, args.config, module, args.seeds), args.stack_seeds):
            command = launch.point_command(
                ["python", "sweep.py"], args.config, workdir, results_dir, p, launch.sweep_cache_dir()
            )
            print(launch.shell_line(command))
        return
    program = [sys.executable, str(Path(__file__).resolve())]
    if args.launcher == "slurm":
        options = launch.SlurmOptions(
            **{
                n: v
                for n in ("partition", "gpus", "time_min", "cpus")
                if (v := getattr(args, f"slurm_{n}")) is not None
            }
        )
        failed = launch.wait(
            launch.submit(program, args.config, workdir, results_dir, args.seeds, options, stack_seeds=args.stack_seeds)
        )
    else:
        failed = launch.run_sweep(
            program,
            args.config,
            workdir,
            results_dir,
            args.seeds,
            args.jobs,
            args.points_per_device,
            stack_seeds=args.stack_seeds,
        )
    for path in sweep_tables.collect(results_dir, [module.SWEEP_NAME]):
        print(f"wrote {path}")
    if failed:
        sys.exit(f"{len(failed)} point(s) failed: {', '.join(p.name for p in failed)}; see WORKDIR/NAME.log")


def one_point(args) -> None:
    logs.configure(verbose=flags.FLAGS.verbosity >= 1, main_process=True)  # the training log, quiet as train.py's
    module = schema.load_module(args.config)
    cache_dir = Path(args.compilation_cache_dir) if args.compilation_cache_dir else None
    if args.stacked_seeds is not None:
        if args.restart:
            raise ValueError(
                "--restart applies to one seed (--seed K); a stacked job resumes, or is moved aside by hand"
            )
        stack = schema.Stack(tuple(schema.parse_point(args.point, seed, module) for seed in _seeds(args.stacked_seeds)))
        point_run.run_stack(args.config, Path(args.workdir), stack, Path(args.results_dir), cache_dir)
        return
    point_run.run_point(
        args.config,
        Path(args.workdir),
        schema.parse_point(args.point, args.seed, module),
        Path(args.results_dir),
        cache_dir,
        args.restart,
    )


def _seeds(text: str) -> list[int]:
    try:
        seeds = [int(part) for part in text.split(",")]
    except ValueError:
        raise ValueError(f"--stacked_seeds {text!r}; expected seeds K,K,... (e.g. 0,1,2)") from None
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"--stacked_seeds {text!r}; expected distinct seeds")
    return seeds


def collect(args) -> None:
    names = [schema.load_module(args.config).SWEEP_NAME] if args.config else None
    for path in sweep_tables.collect(Path(args.results_dir), names):
        print(f"wrote {path}")


def write_study(args) -> None:
    print(f"wrote {study.write(Path(args.results_dir), schema.import_file(args.config))}")


def plan_sweep(args) -> None:
    target = aot.parse_target(args.target)
    if args.stack_seeds is None:
        given = [f"--{name}" for name in ("seeds", "steps") if getattr(args, name) is not None]
        if given:
            raise ValueError(
                f"{' and '.join(given)} apply with --stack_seeds only (the device-hours of a stacked sweep)"
            )
        data, model = aot.parse_mesh(args.mesh or "-1,1")
        print(plan.table(plan.plan(schema.load_module(args.config), target, data, model), target))
        return
    if args.mesh is not None:
        raise ValueError(
            f"--mesh {args.mesh} with --stack_seeds: a stack lays its seeds over every device on a (seed, data) mesh "
            "(training.parallel.stacked.layout); give one or the other"
        )
    seeds = 3 if args.seeds is None else args.seeds
    rows = plan.plan_stacked(schema.load_module(args.config), target, args.stack_seeds, seeds, args.steps)
    print(plan.stacked_table(rows, target, args.stack_seeds, seeds))


def registered_analysis(args) -> None:
    module = schema.load_module(args.config)
    declared = [registered.parse_run(arg, module) for arg in args.missing]
    print(f"wrote {registered.write(Path(args.results_dir), module, declared, args.why)}")


def adopt(args) -> None:
    adopted = adopt_stored(schema.load_module(args.config), Path(args.results_dir))
    print(f"adopted {len(adopted)} point(s): {', '.join(p.name for p in adopted) or 'none new'}")


def main(args) -> None:
    args.handler(args)


if __name__ == "__main__":
    platforms.choose()  # JAX on the CPU alone where no accelerator shows (docs/training.md)
    errors.run_reporting_user_errors("sweep.py", lambda: app.run(main, flags_parser=parse_arguments))
