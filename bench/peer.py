"""Our training step against Flax examples/wmt's, side by side on one core, in useful target tokens/s.

    taskset -c 1 python -m bench.peer --peer_python PEER_PY --wmt_dir WMT      (results/peer.md)

WMT: a snapshot of Flax's examples/wmt (or $FLAX_WMT_DIR); PEER_PY: an interpreter with its packages
(default: this one; bench/flax_wmt_import.py stubs its TensorFlow/clu imports where they are missing).

Each round times, per size, the peer and ours, alternating which goes first (ours first in even
rounds). The peer is `flax_wmt_step.py` in its own interpreter: the example's own `train_step`,
pmapped and donated as its loop does, on packed rows of 64 at its fill. Ours is the training
loop's own trainer (`training.parallel.trainers`, donated) on the default config at that size,
fed real Multi30k batches from `BatchSchedule`, their padding included. Same slots per step
(`data.token_budget` = the peer's rows x 64), dropout 0.1; attention dropout as each side's config
has it (the peer's 0.1, our `model.attention_dropout_rate`). `--variant LABEL:PATH=VALUE,...`
(repeatable) times ours with config changes too, e.g. `--variant default: --variant buckets:data.pack_length=0`
(the default packs since 2026-12-02; the committed rounds labelled 'default' ran the buckets).

Useful tokens are target tokens that are not padding (EOS included: both losses count it). Our
rates are an epoch's: each bucket shape is timed on its own real batches (median of `--reps`),
and the epoch's useful (or slot) tokens are divided by the epoch's time, sum over shapes of
batches x step time. The peer's useful rate is its slot rate x the fill of its packed rows.
`--clock cpu` (the default) counts each process's CPU time, so a job sharing the core does not
count; the peer's script is run with `time.perf_counter` pointed at `time.process_time`.
MFU: model FLOPs (XLA's count of our step; for the peer, of our step on its all-real [rows, 64]
shape: the same arithmetic) / step time / the matmul rate measured at the start of the run.
`--matmul_share` then profiles ours: every dot of the compiled step (at the epoch's most frequent
shape) timed alone at its own shapes, against the whole step: what the step's other work costs.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import statistics
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import jax
import numpy as np

from bench.timing import median_ms
from bench.train_step import SIZES, compiled_flops, dot_seconds, matmul_flops_per_s
from configs import default
from training import config as config_lib
from training.data import tokenizer
from training.data.batching import BatchSchedule, as_arrays
from training.data.corpus import load_corpus
from training.parallel import trainers
from training.core import step as step_lib

PEER_LENGTH = 64  # the peer's packed row length
PEER_STEPS = {"small": 10, "base": 5}
# Run a peer script with its step clock on this process's CPU time (argv: script, its arguments).
CPU_CLOCK_SHIM = ("import runpy, sys, time; time.perf_counter = time.process_time; "
                  "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')")


def cpu_description() -> str:
    """`lscpu`'s model name and the CPU's bfloat16 / AMX flags, from /proc/cpuinfo."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    field = lambda name: next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith(name)), "?")
    flags = [f for f in field("flags").split() if "bf16" in f or f.startswith("amx") or f in ("avx2", "avx512f")]
    return f"{field('model name')} ({' '.join(flags) or 'no avx2/avx512/bf16 flags'})"


def our_config(size: str, dtype: str, overrides: dict):
    """The default config at `size`, `dtype`, with the peer's slots per step, then `overrides`."""
    config = default.get_config()
    config.model.update(SIZES[size][0])
    config.model.dtype = dtype
    config.data.token_budget = SIZES[size][1] * PEER_LENGTH
    config.compilation_cache_dir = ""
    for path, value in overrides.items():
        *sections, field = path.split(".")
        node = config
        for section in sections:
            node = node[section]
        node[field] = value
    config_lib.validate(config)
    return config


class Ours:
    """Our trainer for one config, compiled for every bucket shape; `epoch_rates` times an epoch's shapes."""

    def __init__(self, config, vocab, src_ids, tgt_ids, reps: int):
        self.model = config_lib.build_model(config, vocab, config.model.dtype)
        self.schedule = BatchSchedule(src_ids, tgt_ids, token_budget=config.data.token_budget,
                                      bucket_lengths=config.data.bucket_lengths, seed=config.seed,
                                      pack_length=config.data.pack_length)
        tx = step_lib.make_optimizer(config.optimizer, config.num_train_steps)
        self.trainer = trainers.make_trainer(config, self.model, tx)
        self.rng = jax.random.key(1)
        self.state = self.trainer.init_state(jax.random.key(0), self.schedule.batch(0))
        self.counts, self.useful, self.slots = defaultdict(int), defaultdict(float), defaultdict(int)
        batches = defaultdict(list)  # shape -> the first `reps` real batches of that shape in epoch 0
        for step in range(self.schedule.batches_per_epoch):
            batch = self.schedule.batch(step)
            shape = batch.tgt_out.shape
            self.counts[shape] += 1
            self.useful[shape] += float(batch.weights.sum())
            self.slots[shape] += batch.tgt_out.size
            if len(batches[shape]) < reps:
                batches[shape].append(as_arrays(batch))
        self.batches = dict(batches)
        self.flops = {shape: self._flops(b[0]) for shape, b in self.batches.items()}
        self.compiled = False

    def _flops(self, batch) -> float:
        return compiled_flops(self.trainer.step_fn.lower(self.state, self.trainer.put_batch(batch), self.rng))

    def _run(self, shape, i=0):
        batch = self.batches[shape][i % len(self.batches[shape])]
        self.state, metrics = self.trainer.step(self.state, self.trainer.put_batch(batch), self.rng)
        jax.device_get(metrics)  # as the loop: waits for the step

    def epoch_rates(self, clock: str) -> dict:
        """Useful and slot target tokens/s over an epoch, its mean step seconds, and FLOPs per second."""
        if not self.compiled:  # compile every shape outside the clock
            for shape in self.batches:
                self._run(shape)
            self.compiled = True
        seconds = {}
        for shape in self.batches:
            calls = iter(range(10**9))
            reps = len(self.batches[shape])
            seconds[shape] = median_ms(lambda: self._run(shape, next(calls)), max(reps, 2), clock=clock, warmup=0) / 1e3
        total = sum(self.counts[s] * seconds[s] for s in seconds)
        return dict(
            useful_tok_s=sum(self.useful.values()) / total, slot_tok_s=sum(self.slots.values()) / total,
            step_s=total / sum(self.counts.values()), flop_s=sum(self.counts[s] * self.flops[s] for s in seconds) / total,
            fill=sum(self.useful.values()) / sum(self.slots.values()), shapes=len(seconds),
        )

    def matmul_share(self, clock: str, reps: int = 5) -> dict:
        """Step seconds at the epoch's most frequent shape, and its dots' seconds each timed alone (bench.train_step.dot_seconds)."""
        shape = max(self.counts, key=self.counts.get)
        hlo = self.trainer.step_fn.lower(self.state, self.trainer.put_batch(self.batches[shape][0]), self.rng).compile().as_text()
        dots_s, dots_flops, dots = dot_seconds(hlo, reps, clock)
        calls = iter(range(10**9))
        step_s = median_ms(lambda: self._run(shape, next(calls)), reps, clock=clock, warmup=1) / 1e3
        return dict(shape=shape, step_s=step_s, dots_s=dots_s, dots=dots, dot_flop_s=dots_flops / dots_s)


def peer_flops(ours: Ours, rows: int) -> float:
    """FLOPs of our step on an all-real [rows, 64] batch: the peer's model arithmetic at its shape."""
    tokens = np.full((rows, PEER_LENGTH), 5, np.int32)
    batch = {"src": tokens, "tgt_in": tokens, "tgt_out": tokens, "weights": np.ones((rows, PEER_LENGTH), np.float32)}
    return ours._flops(batch)


def run_peer(args, size: str) -> dict:
    script = str(Path(args.peer_dir) / "flax_wmt_step.py")
    cmd = [args.peer_python, script, "--wmt_dir", args.wmt_dir, "--size", size, "--steps", str(args.peer_steps or PEER_STEPS.get(size, 3))]
    cmd += ["--batch", str(args.peer_rows)] if getattr(args, "peer_rows", 0) else []
    cmd += ["--dtype", args.peer_dtype] if getattr(args, "peer_dtype", "") else []
    cmd += ["--profile_dir", str(args.peer_profile_dir)] if getattr(args, "peer_profile_dir", "") else []
    if args.clock == "cpu":
        cmd = [args.peer_python, "-c", CPU_CLOCK_SHIM, *cmd[1:]]
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        raise RuntimeError(f"peer failed ({done.returncode}): {done.stderr[-2000:]}")
    out = json.loads(lines[-1])
    out["useful_tok_s"] = out["slot_tok_s"] * out["target_nonpad"]
    return out


def parse_variant(text: str) -> tuple[str, dict]:
    """'packed:data.pack_length=64,data.token_budget=1280' -> (label, {path: Python literal (or the bare string)})."""
    label, _, pairs = text.partition(":")
    overrides = {}
    for pair in filter(None, pairs.split(",")):
        path, _, value = pair.partition("=")
        try:
            overrides[path] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            overrides[path] = value
    return label, overrides


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--peer_python", default=sys.executable, help="an interpreter with the peer's packages (default: this one)")
    parser.add_argument("--wmt_dir", default=os.environ.get("FLAX_WMT_DIR", ""), required="FLAX_WMT_DIR" not in os.environ,
                        help="a snapshot of Flax's examples/wmt (default: $FLAX_WMT_DIR)")
    parser.add_argument("--peer_dir", default=str(Path(__file__).parent), help="the folder holding flax_wmt_step.py (default: bench/)")
    parser.add_argument("--peer_rows", type=int, default=0, help="the peer's rows of 64 a step (0: its size's, 20 small, 32 base)")
    parser.add_argument("--peer_dtype", default="", help="the peer's compute dtype (default: float32, the example's on CPU)")
    parser.add_argument("--sizes", nargs="*", default=list(SIZES))
    parser.add_argument("--dtypes", nargs="*", default=["float32", "bfloat16"], help="ours (the peer runs float32, as on CPU)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reps", type=int, default=3, help="our timed steps per bucket shape per round")
    parser.add_argument("--peer_steps", type=int, default=0, help="the peer's timed steps (0: small 10, base 5)")
    parser.add_argument("--clock", choices=["cpu", "wall"], default="cpu")
    parser.add_argument("--matmul_share", action="store_true", help="after the rounds, profile ours: its dots timed alone vs the step")
    parser.add_argument("--variant", action="append", metavar="LABEL:PATH=VALUE,...",
                        help="our config with these changes (repeatable; default: 'default:', the config as it is)")
    args = parser.parse_args()
    variants = dict(parse_variant(v) for v in args.variant or ["default:"])
    ours_rows = [(v, d) for v in variants for d in args.dtypes]

    rates = {d: matmul_flops_per_s(jax.numpy.dtype(d), clock=args.clock) for d in ["float32", *args.dtypes]}
    print(f"{cpu_description()}; affinity {sorted(os.sched_getaffinity(0))}")
    print(f"jax {jax.__version__}, {jax.default_backend()}, clock {args.clock}, ours {variants}; "
          "matmul 2048^3: " + ", ".join(f"{d} {r / 1e9:.0f} GFLOP/s" for d, r in rates.items()), flush=True)
    config = default.get_config()
    train = load_corpus(config, config.data.train_split)
    vocab = tokenizer.load(tokenizer.train(train.src + train.tgt, config.data.vocab_size, config.seed))
    src_ids, tgt_ids = vocab.encode(list(train.src)), vocab.encode(list(train.tgt))
    ours = {(s, v, d): Ours(our_config(s, d, variants[v]), vocab, src_ids, tgt_ids, args.reps)
            for s in args.sizes for v, d in ours_rows}
    peer_model_flops = {s: peer_flops(ours[(s, *ours_rows[0])], SIZES[s][1]) for s in args.sizes}

    print("\n| round | size | side | dtype | step s | slot tok/s | useful tok/s | target fill | shapes | MFU | useful vs peer | slot vs peer |")
    print("|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    ratios = defaultdict(list)
    for r in range(args.rounds):
        print(f"<!-- round {r + 1}: load average {os.getloadavg()[0]:.2f} -->", flush=True)
        for size in args.sizes:
            results = {}
            order = ["ours", "peer"] if r % 2 == 0 else ["peer", "ours"]
            for side in order:
                if side == "peer":
                    results["peer"] = run_peer(args, size)
                else:
                    for v, d in ours_rows:
                        results[v, d] = ours[size, v, d].epoch_rates(args.clock)
            peer = results["peer"]
            row = lambda side, d, step, slot, useful, fill, shapes, mfu, extra: print(
                f"| {r + 1} | {size} | {side} | {d} | {step:.3f} | {slot:,.0f} | {useful:,.0f} | {fill:.3f} | {shapes} | {mfu:.0%} | {extra} |",
                flush=True)
            row("flax wmt", "float32", peer["median_s"], peer["slot_tok_s"], peer["useful_tok_s"], peer["target_nonpad"], 1,
                peer_model_flops[size] / peer["median_s"] / rates["float32"], "1 | 1")
            for v, d in ours_rows:
                o = results[v, d]
                useful, slot = o["useful_tok_s"] / peer["useful_tok_s"], o["slot_tok_s"] / peer["slot_tok_s"]
                ratios[size, v, d].append((useful, slot))
                row(f"ours, {v}", d, o["step_s"], o["slot_tok_s"], o["useful_tok_s"], o["fill"], o["shapes"],
                    o["flop_s"] / rates[d], f"{useful:.2f} | {slot:.2f}")
    print("\n| size | ours | dtype | rounds | useful tok/s vs peer, median (each) | slot tok/s vs peer, median (each) |")
    print("|---|---|---|---:|---:|---:|")
    for (size, v, d), pairs in ratios.items():
        useful, slot = zip(*pairs)
        each = lambda xs: ", ".join(f"{x:.2f}" for x in xs)
        print(f"| {size} | {v} | {d} | {len(pairs)} | **{statistics.median(useful):.2f}** ({each(useful)}) | "
              f"{statistics.median(slot):.2f} ({each(slot)}) |")
    if args.matmul_share:
        print("\n| size | ours | dtype | shape | step s | its dots alone, s | dots | dot share | dot GFLOP/s | rest of the step, s |")
        print("|---|---|---|---|---:|---:|---:|---:|---:|---:|")
        for (size, v, d), o in ours.items():
            p = o.matmul_share(args.clock)
            print(f"| {size} | {v} | {d} | {p['shape'][0]} x {p['shape'][1]} | {p['step_s']:.3f} | {p['dots_s']:.3f} | {p['dots']} | "
                  f"{p['dots_s'] / p['step_s']:.0%} | {p['dot_flop_s'] / 1e9:.0f} | {p['step_s'] - p['dots_s']:.3f} |", flush=True)


if __name__ == "__main__":
    main()
