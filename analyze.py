"""Look inside the heads of a trained workdir; every output goes to WORKDIR/analysis/ (the rest is only read).

python analyze.py maps --workdir runs/default --sentence "Ein Hund läuft im Schnee."
python analyze.py maps --workdir runs/default --split val --index 3
python analyze.py roles --workdir runs/default [--examples 500]
python analyze.py importance --workdir runs/default [--examples 500]
python analyze.py prune --workdir runs/default [--kinds encoder_self]   # -> pruning[_KINDS].{csv,png}
python analyze.py uptrain --workdir runs/default --num_kv_heads 2 --fraction 0.05

absl's logging flags (-v 1, --verbosity 1) go with any subcommand: the libraries' INFO messages (JAX, orbax) too.
"""

import argparse
import os
import sys
from pathlib import Path

from absl import app, flags
from absl.flags import argparse_flags

from analysis import heads, importance, maps, pruning, roles, tables, uptrain, workdir
from training.core import compile_cache, errors, logs, platforms
from training.data import corpus


def build_parser() -> argparse_flags.ArgumentParser:
    """The subcommands and their flags (absl's own, e.g. --verbosity, are accepted beside them, hidden in --help)."""
    parser = argparse_flags.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)

    def command(name, handler, help, examples):
        sub = commands.add_parser(name, help=help)
        sub.set_defaults(handler=handler)
        sub.add_argument("--workdir", required=True, help="a train.py workdir")
        sub.add_argument("--split", default="val", help="the split the sentences come from")
        sub.add_argument(
            "--examples", type=int, default=examples, help=f"first N sentences of --split (0: all; default {examples})"
        )
        sub.add_argument(
            "--compilation_cache_dir",
            default="auto",
            help="JAX's persistent compilation cache for this command: "
            "'auto' (JAX_COMPILATION_CACHE_DIR, else $XDG_CACHE_HOME or ~/.cache, /headcount/jax), '' none, or a "
            "path; never the compilation_cache_dir in the workdir's config.json",
        )
        return sub

    sub = command("maps", maps_command, "attention heatmaps for one sentence", 0)
    sub.add_argument("--sentence", help="a source sentence (else --index of --split)")
    sub.add_argument("--index", type=int, default=0, help="sentence index in --split when --sentence is not given")
    command("roles", roles_command, "per-head positional / anchor / diagonal statistics and role labels", 500)
    command("importance", importance_command, "Michel et al. head importance through the head_mask gates", 500)
    sub = command(
        "prune", prune_command, "BLEU and loss as heads are pruned by importance, at random and in reverse", 500
    )
    sub.add_argument(
        "--eval_examples",
        type=int,
        default=300,
        help="sentences scored at each pruning step, taken after the --examples used for importance",
    )
    sub.add_argument("--beam_size", type=int, default=1, help="1: greedy")
    sub.add_argument("--kinds", default=",".join(heads.MODULES), help="attention kinds whose heads are pruned")
    sub.add_argument("--steps", type=int, default=10, help="pruning steps (10: 10 %% of the heads each)")
    sub.add_argument("--seed", type=int, default=0, help="the random order's seed")
    sub.add_argument(
        "--test_split",
        default="",
        help="also score --test_fraction pruned against unpruned on this split, "
        "beam 4, with sacreBLEU's paired bootstrap (e.g. test_2016_flickr; '' skips)",
    )
    sub.add_argument("--test_fraction", type=float, default=0.5, help="the fraction of heads pruned for --test_split")
    sub.add_argument("--test_examples", type=int, default=0, help="first N sentences of --test_split (0: all)")
    sub = command("uptrain", uptrain_command, "MHA -> GQA/MQA conversion and uptraining, before/after table", 500)
    sub.add_argument("--num_kv_heads", type=int, required=True)
    sub.add_argument(
        "--fraction", type=float, default=0.05, help="uptraining steps as a fraction of the checkpoint's steps"
    )
    sub.add_argument("--methods", default="mean,first,random", help=f"comma-separated, of {uptrain.METHODS}")
    sub.add_argument("--beam_size", type=int, default=1, help="1: greedy")
    sub.add_argument("--speed_rows", type=int, default=64, help="sentences in the decode-speed batch")
    sub.add_argument("--overwrite", action="store_true", help="replace existing uptraining workdirs")
    return parser


def parse_arguments(argv: list[str]) -> argparse.Namespace:
    """absl's flags_parser: the subcommand and its flags from `argv` (the program's name first)."""
    return build_parser().parse_args(argv[1:])


def main(argv: list[str] | None = None) -> None:
    """analyze.py in this process, `argv` its arguments without the program's name (None: sys.argv's)."""
    run_command(build_parser().parse_args(argv))


def run_command(args: argparse.Namespace) -> None:
    """The subcommand `args` names, after its flags are checked and the workdir is found writable and loaded."""
    check_arguments(args)
    # progress at INFO (the training loop, pruning steps); the libraries' INFO only with -v 1
    logs.configure(verbose=flags.FLAGS.verbosity >= 1, main_process=True)

    out_parent = (
        next(p for p in (Path(args.workdir) / "analysis", Path(args.workdir)) if p.exists())
        if Path(args.workdir).exists()
        else Path(args.workdir)
    )
    if Path(args.workdir).exists() and not os.access(out_parent, os.W_OK | os.X_OK):  # up front, not after the work
        raise ValueError(
            f"--workdir {args.workdir}: {out_parent} is not writable; analyze.py writes to WORKDIR/analysis/"
        )
    cache = compile_cache.enable(args.compilation_cache_dir, "--compilation_cache_dir")
    run = workdir.load(args.workdir, cache)
    for flag in ("split", "test_split"):
        if getattr(args, flag, ""):
            corpus.check_split(run.config, getattr(args, flag), f"--{flag}")
    print(f"analyze.py: step {run.step} ({run.checkpoint})", file=sys.stderr, flush=True)
    args.handler(args, run, run.out_dir)


def maps_command(args, run, out: Path) -> None:
    if args.sentence is not None:
        sentence, prefix = args.sentence, "maps_sentence"
    else:
        pairs = len(corpus.load_corpus(run.config, args.split))
        if args.index >= pairs:
            raise ValueError(
                f"--index {args.index}; expected an index below {pairs}, the pairs in --split {args.split!r}"
            )
        sentence, prefix = (
            workdir.dev_subset(run.config, args.split, 1, args.index).src[0],
            f"maps_{args.split}{args.index}",
        )
    for path in maps.render(run, sentence, out, prefix):
        print(path)


def roles_command(args, run, out: Path) -> None:
    rows = roles.head_statistics(run, workdir.dev_subset(run.config, args.split, args.examples))
    roles.write_table(rows, out / "roles.csv", out / "roles.md")
    print(roles.plot_map(rows, out / "roles.png"))
    print((out / "roles.md").read_text())


def importance_command(args, run, out: Path) -> None:
    raw, normalised = importance.head_importance(run, workdir.dev_subset(run.config, args.split, args.examples))
    importance.write(raw, normalised, out / "importance.csv", out / "importance.md")
    print((out / "importance.md").read_text())


def prune_command(args, run, out: Path) -> None:
    raw, normalised = importance.head_importance(run, workdir.dev_subset(run.config, args.split, args.examples))
    importance.write(raw, normalised, out / "importance.csv", out / "importance.md")  # the order pruning follows
    scored = workdir.dev_subset(run.config, args.split, args.eval_examples, start=args.examples)
    score = workdir.scorer(run.config, run.vocab, run.model, scored, args.beam_size)
    kinds = args.kinds.split(",")
    rows = pruning.prune_curves(run, score, normalised, kinds, steps=args.steps, seed=args.seed)
    stem = "pruning" if sorted(kinds) == sorted(heads.MODULES) else f"pruning_{'-'.join(kinds)}"
    pruning.write_csv(rows, out / f"{stem}.csv")
    title = (
        f"{'+'.join(kinds)}: {len(scored)} {args.split} sentences after the first {args.examples} "
        f"(importance), {'greedy' if args.beam_size == 1 else f'beam {args.beam_size}'}"
    )
    print(pruning.plot(rows, out / f"{stem}.png", title))
    for r in rows:
        print(
            f"{r['order']:10s} {r['fraction']:.2f} pruned {r['pruned']:2d} bleu {r['bleu']:6.2f} loss {r['loss']:.4f}"
        )
    if args.test_split:
        held_out, outputs = pruning.held_out_test(
            run,
            normalised,
            kinds,
            workdir.dev_subset(run.config, args.test_split, args.test_examples),
            fraction=args.test_fraction,
            seed=args.seed,
        )
        name = f"{stem}_{args.test_split}_{round(100 * args.test_fraction)}pct"
        tables.write(held_out, pruning.HELD_OUT_FIELDS, out / f"{name}.csv", out / f"{name}.md")
        pruning.write_outputs(outputs, out / name)
        print((out / f"{name}.md").read_text())


def uptrain_command(args, run, out: Path) -> None:
    rows = uptrain.compare(
        run,
        workdir.dev_subset(run.config, args.split, args.examples),
        args.num_kv_heads,
        args.methods.split(","),
        args.fraction,
        beam_size=args.beam_size,
        speed_rows=args.speed_rows,
        overwrite=args.overwrite,
    )
    name = f"uptrain_table_kv{args.num_kv_heads}_{'-'.join(args.methods.split(','))}"
    tables.write(rows, uptrain.TABLE_FIELDS, out / f"{name}.csv", out / f"{name}.md")
    print((out / f"{name}.md").read_text())


# Each numeric flag's lowest value (a subcommand without the flag skips it) and what it means.
AT_LEAST = {
    "examples": (0, "0: all"),
    "index": (0, "a sentence of --split"),
    "eval_examples": (1, "sentences scored"),
    "beam_size": (1, "1: greedy"),
    "steps": (1, "pruning steps"),
    "test_examples": (0, "0: all"),
    "num_kv_heads": (1, "K/V heads"),
}


def check_arguments(args) -> None:
    """ValueError naming the first flag whose value cannot work (before the workdir is loaded)."""
    for flag, (least, meaning) in AT_LEAST.items():
        value = getattr(args, flag, None)
        if value is not None and value < least:
            raise ValueError(f"--{flag} {value}; expected an int >= {least} ({meaning})")
    if getattr(args, "sentence", None) is not None and not args.sentence.strip():
        raise ValueError("--sentence is empty; expected a source sentence (or leave it out to use --index of --split)")
    for flag, low, high in (("test_fraction", 0, 1), ("fraction", 0, None)):
        value = getattr(args, flag, None)
        if value is not None and not (value > low and (high is None or value <= high)):
            raise ValueError(f"--{flag} {value}; expected a number > {low}" + (f" and <= {high}" if high else ""))


if __name__ == "__main__":
    platforms.choose()  # JAX on the CPU alone where no accelerator shows (docs/training.md)
    errors.run_reporting_user_errors("analyze.py", lambda: app.run(run_command, flags_parser=parse_arguments))
