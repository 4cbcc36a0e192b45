"""Decode speed of trained sweep points side by side: one sitting, one core, alternating order.

    MULTI30K_DIR=... taskset -c 1 python -m bench.sweep_decode runs/heads/h8_seed2 runs/kv/kv4_seed0 \\
        runs/kv/kv2_seed0 runs/kv/kv1_seed0 --rounds 3            (results/kv_decode.md)

A sweep table's decode tokens/s is measured once per point, at the end of its run, on whichever
machine ran it, so between points it compares machines and sittings as much as models. This
measures trained workdirs together instead, with the tables' own measure
(`evaluate.decoding_speed`: the eval split's first 64 sources, greedy and beam 4, cache bytes per
target token), each workdir in turn, the order rotated every round, and each one's rate as a
ratio to the first workdir's in the same round.

The loop runs until the batch's last sentence ends (greedy) or no live beam can beat a source's
worst finished one (beam search), so a rate mixes a model's step cost with how long it searches.
Each row therefore also gives the decoder steps the loop ran and the time per step (median time
÷ steps, the encoder's one call included): the step cost without the search length (a longer
search still reads a longer cache at its later steps). `--max_extra_length` caps the output at
the source bucket + that many tokens (the tables': 50).
"""

from __future__ import annotations

import argparse
import statistics

import jax

from bench.lib import cpu_description
from training.core.markdown import markdown_row, markdown_table
from training.data.corpus import load_corpus
from training.evaluation import evaluate
from training.evaluation.loaded import load_run

BEAMS = {"greedy": 1, "beam 4": 4}


def ms_per_step(measured: dict, beam: int) -> float:
    """Median decode time ÷ the loop's steps, from `evaluate.decoding_speed`'s tokens, rate and steps."""
    seconds = measured[f"decode_output_tokens_beam{beam}"] / measured[f"decode_tokens_per_s_beam{beam}"]
    return 1e3 * seconds / measured[f"decode_steps_beam{beam}"]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workdirs", nargs="+", help="trained workdirs; the first is the reference")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rows", type=int, default=64, help="sources in the timed batch (the sweep's 64)")
    parser.add_argument(
        "--max_extra_length",
        type=int,
        default=evaluate.SPEED_EXTRA_LENGTH,
        help="output cap: source bucket + this many tokens (default: the sweep tables' cap)",
    )
    args = parser.parse_args()
    if len(args.workdirs) < 2:
        parser.error(f"workdirs: got {len(args.workdirs)}; expected at least 2 to compare")
    if args.max_extra_length < 0:
        parser.error(f"--max_extra_length: got {args.max_extra_length}; expected >= 0")

    runs = [load_run(w) for w in args.workdirs]
    config = runs[0].config
    dev = load_corpus(config, config.data.eval_split)
    print(cpu_description())
    print(
        f"jax {jax.__version__}, {jax.default_backend()}, wall clock; {config.data.eval_split} sources 1-{args.rows}, "
        f"output cap bucket + {args.max_extra_length}, median of 3 timed decodes after a warm-up, "
        "per workdir and round\n"
    )
    titles = ["round", "workdir", "KV heads", "cache bytes/token", "greedy tok/s", "beam-4 tok/s", "greedy steps"]
    titles += ["beam-4 steps", "greedy ms/step", "beam-4 ms/step", "greedy tok/s vs first", "beam-4 tok/s vs first"]
    print(markdown_table([*titles, "greedy ms/step vs first", "beam-4 ms/step vs first"], [], "rl" + "r" * 12))
    sources = [run.vocab.encode(list(dev.src[: args.rows])) for run in runs]
    measures = {"tok/s": lambda m, beam: m[f"decode_tokens_per_s_beam{beam}"], "ms/step": ms_per_step}
    ratios = {(w, what, name): [] for w in args.workdirs[1:] for what in measures for name in BEAMS}
    for r in range(args.rounds):
        order = [(i + r) % len(runs) for i in range(len(runs))]
        measured = {}
        for i in order:
            run = runs[i]
            measured[i] = evaluate.decoding_speed(
                run.model,
                run.params,
                sources[i],
                run.config.data.bucket_lengths,
                max_extra_length=args.max_extra_length,
            )
        values = {
            i: {(what, name): f(m, beam) for what, f in measures.items() for name, beam in BEAMS.items()}
            for i, m in measured.items()
        }
        for i, (workdir, run) in enumerate(zip(args.workdirs, runs)):
            m, own = measured[i], values[i]
            vs = {key: value / values[0][key] for key, value in own.items()}
            if i:
                for key, ratio in vs.items():
                    ratios[(workdir, *key)].append(ratio)
            cells = [f"{own[('tok/s', name)]:,.0f}" for name in BEAMS]
            cells += [f"{m[f'decode_steps_beam{b}']}" for b in BEAMS.values()]
            cells += [f"{own[('ms/step', name)]:.2f}" for name in BEAMS]
            cells += [f"{ratio:.2f}" for ratio in vs.values()]
            heads = run.model.config.geometry.num_kv_heads
            print(markdown_row([r + 1, workdir, heads, f"{m['kv_cache_bytes_per_token']:,.0f}", *cells]), flush=True)
    header = [f"{name} {what} vs first" for what in measures for name in BEAMS]
    print(f"\nMedian (each round) against {args.workdirs[0]}:\n")
    print(markdown_table(["workdir", *header], [], "l" + "r" * len(header)))
    for workdir in args.workdirs[1:]:
        cells = [
            f"**{statistics.median(xs):.2f}** ({', '.join(f'{x:.2f}' for x in xs)})"
            for xs in (ratios[(workdir, what, name)] for what in measures for name in BEAMS)
        ]
        print(markdown_row([workdir, *cells]))


if __name__ == "__main__":
    main()
