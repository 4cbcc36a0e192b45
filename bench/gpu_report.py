"""The GPU report: one call on a machine with one GPU writes results/gpu.md (about 8 minutes on an H200).

    MULTI30K_DIR=DATA FLAX_WMT_DIR=WMT python -m bench.gpu_report            # on the GPU
    MULTI30K_DIR=DATA FLAX_WMT_DIR=WMT python -m bench.gpu_report --dry_run  # every part at toy sizes, any backend

DATA: Multi30k (training/data/corpus.py); WMT: a snapshot of Flax's examples/wmt, or FLAX_GIT_DIR=a
google/flax git dir instead (the peer; without it the peer's parts say so and are skipped; its
TensorFlow and clu imports are always stubbed, see bench.lib.import_flax_example). What to carry onto an
image that lacks this project's other dependencies: docs/benchmarks.md, "The GPU report". Parts, each
in its own section headed with its
wall and CPU seconds (this process's and its children's; a part that fails reports its error and
the others still run; `--parts` picks some):

* suite: the default test suite (`pytest -m "not slow"`) on this backend, its summary line;
* attention: `attention.dot_product_attention` forward+backward, bfloat16, per impl (cuDNN and XLA on
  a GPU), device-side: `--calls` back-to-back calls, one `block_until_ready`, microseconds a call;
  torch's `scaled_dot_product_attention` on the same GPU, timed with CUDA events, where torch imports;
* train_step: our training step against Flax examples/wmt's (`bench.peer`: small and base, bfloat16
  both sides, 512 rows x 64 slots, `--rounds` alternating rounds), and each side's ten costliest
  kernels from the JAX profiler;
* preset: one Table 3 preset point (the packed variant, h = 8, cold compilation cache), its wall
  time split into compiling, steps, dev evaluation and the rest, then beam-4 test decoding;
* decode: beam-4 decoding against the peer's (`bench.peer_decode`, bfloat16 both sides).

`--dry_run` runs every part at toy sizes on any backend (a minute or two of one CPU core;
tests/bench/test_gpu_report.py runs it): one test file for the suite, one small attention shape,
toy models in float32 and a few steps for the peer parts and the preset point (one evaluation,
sixteen BLEU sentences, sixteen test sentences at beam 4), one round each, compiled at LLVM -O0.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import logging
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from bench.lib import STUB_ENV
from training.core.markdown import markdown_table

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("suite", "attention", "train_step", "preset", "decode")
PEER_ROWS = 512  # rows of 64 slots a step, both sides
ATTENTION_SHAPES = [(4, 1024, 8, 64), (1, 4096, 8, 64), (1, 16384, 8, 64)]  # B, N, heads, head dim
TOY = dict(d_model=32, num_heads=2, num_layers=1, mlp_dim=64)
# the dry run's preset point: a few steps, one evaluation and checkpoint at the end, a small vocabulary
DRY_PRESET = dict(steps=6, train_limit=1000, vocab_size=500, bleu_examples=16)
COMPILE_EVENT = (
    "/jax/core/compile/backend_compile_duration"  # JAX's event for every XLA compile (training.core.compile_cache)
)


# --- timing and profiles --------------------------------------------------------------------------


def device_us(fn, args, calls: int) -> float:
    """Microseconds a call of `fn(*args)`: `calls` calls queued back to back, one wait at the end (after a warm-up)."""
    jax.block_until_ready(fn(*args))
    start = time.perf_counter()
    out = None
    for _ in range(calls):
        out = fn(*args)
    jax.block_until_ready(out)
    return (time.perf_counter() - start) / calls * 1e6


def cpu_seconds() -> float:
    """CPU seconds of this process and of its children that have ended (the suite's pytest, the peer's scripts)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def top_kernels(trace_dir: str | Path, n: int = 10) -> list[tuple[str, float, int]]:
    """(name, total ms, calls) of the `n` costliest events of a JAX profiler trace (its perfetto JSON).

    Device events (a process named for a GPU/TPU) where there are any; on a CPU, the XLA ops the
    runtime's threads ran.
    """
    files = sorted(Path(trace_dir).rglob("*.trace.json.gz"))
    if not files:
        return []
    events = json.loads(gzip.decompress(files[-1].read_bytes()))
    events = events["traceEvents"] if isinstance(events, dict) else events
    names = {
        e["pid"]: e.get("args", {}).get("name", "")
        for e in events
        if e.get("ph") == "M" and e.get("name") == "process_name"
    }
    devices = {pid for pid, name in names.items() if any(d in name for d in ("GPU", "TPU", "gpu", "tpu"))}
    totals, counts = collections.defaultdict(float), collections.Counter()
    for e in events:
        if e.get("ph") != "X" or "dur" not in e or (devices and e.get("pid") not in devices):
            continue
        if not devices and (e.get("name", "").startswith("$") or "python" in names.get(e.get("pid"), "").lower()):
            continue  # the Python tracer's frames, not the runtime's ops
        totals[e["name"]] += e["dur"] / 1e3
        counts[e["name"]] += 1
    return [(name, ms, counts[name]) for name, ms in sorted(totals.items(), key=lambda x: -x[1])[:n]]


def kernel_table(title: str, kernels) -> str:
    if not kernels:
        return f"{title}: no trace events found.\n"
    total = sum(ms for _, ms, _ in kernels)
    rows = [
        [i, f"`{name[:80]}`", f"{ms:.3f}", calls, f"{ms / total:.0%}"] for i, (name, ms, calls) in enumerate(kernels, 1)
    ]
    table = markdown_table(["#", "kernel", "ms", "calls", "share"], rows, "rlrrr")
    return f"{title} (3 traced steps; share of these ten):\n\n{table}\n"


# --- the parts ------------------------------------------------------------------------------------


def part_suite(args) -> str:
    """The default suite on this backend (a dry run: one small test file), its summary line."""
    targets = ["tests/attention/impl/test_jax_nn.py"] if args.dry_run else ["tests"]
    xdist = ["-n", "0" if args.dry_run else str(min(8, os.cpu_count() or 1))]
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "not slow", "-p", "no:cacheprovider", *xdist, *targets]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=args.suite_timeout_s)
    lines = done.stdout.strip().splitlines()
    failures = [line for line in lines if line.startswith(("FAILED", "ERROR"))]
    return (
        f"`{' '.join(cmd[2:])}` (exit {done.returncode}):\n\n    {lines[-1] if lines else done.stderr[-500:]}\n\n"
        + "".join(f"    {line}\n" for line in failures[:30])
    )


def part_attention(args) -> str:
    import attention

    on_gpu = jax.default_backend() == "gpu"
    impls = ["cudnn", "xla"] if on_gpu else ["xla", "vmap"]
    shapes = [(1, 128, 2, 16)] if args.dry_run else ATTENTION_SHAPES
    torch_us = _torch_sdpa(shapes, args.calls) if on_gpu else {}
    rows = []
    for B, N, H, D in shapes:
        keys = jax.random.split(jax.random.key(0), 4)
        q, k, v, g = (jax.random.normal(key, (B, N, H, D), jnp.bfloat16) for key in keys)
        for causal in (False, True):
            times = {}
            for impl in impls:
                loss = lambda q, k, v, impl=impl: jnp.sum(
                    attention.dot_product_attention(q, k, v, impl=impl, is_causal=causal).astype(jnp.float32)
                    * g.astype(jnp.float32)
                )
                step = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
                try:
                    times[impl] = device_us(step, (q, k, v), args.calls)
                except Exception as e:
                    times[impl] = f"{type(e).__name__}: {str(e)[:60]}"
            anchor = torch_us.get((B, N, H, D, causal))
            cells = [f"{t:,.0f}" if isinstance(t, float) else t for t in times.values()]
            ratio = f"{times[impls[0]] / anchor:.2f}" if anchor and isinstance(times[impls[0]], float) else "-"
            rows.append(
                [f"{B}, {N}, {H}, {D}", "yes" if causal else "no", *cells, f"{anchor:,.0f}" if anchor else "-", ratio]
            )
    titles = ["B, N, heads, d", "causal", *(f"{impl} µs" for impl in impls), "torch SDPA µs", f"{impls[0]} / torch"]
    return (
        f"Forward+backward, bfloat16, µs a call ({args.calls} calls queued, one wait). torch: "
        f"{torch_us.get('version', 'not importable or no CUDA')}.\n\n"
        + markdown_table(titles, rows, "ll" + "r" * (len(impls) + 2))
        + "\n"
    )


def _torch_sdpa(shapes, calls) -> dict:
    """torch SDPA forward+backward µs per (B, N, H, D, causal), CUDA events over `calls` calls; {} without
    torch/CUDA."""
    try:
        import torch
    except ImportError:
        return {}
    if not torch.cuda.is_available():
        return {}
    out = {"version": f"torch {torch.__version__}"}
    for B, N, H, D in shapes:
        q, k, v, g = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        for causal in (False, True):
            leaves = [x.requires_grad_() for x in (q, k, v)]

            def call():
                o = torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=causal)
                return torch.autograd.grad((o * g).sum(), leaves)

            call()
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(calls):
                call()
            end.record()
            torch.cuda.synchronize()
            out[B, N, H, D, causal] = start.elapsed_time(end) / calls * 1e3
    return out


def part_train_step(args) -> str:
    from bench import lib as peer
    from configs import default
    from training.data import tokenizer
    from training.data.corpus import load_corpus

    if not args.wmt_dir:
        return "Skipped: no snapshot of Flax's examples/wmt (--wmt_dir, FLAX_WMT_DIR or FLAX_GIT_DIR).\n"
    sizes = ["toy"] if args.dry_run else ["small", "base"]
    rows = 4 if args.dry_run else PEER_ROWS
    config = default.get_config()
    train = load_corpus(config, config.data.train_split)
    if args.dry_run:
        train = type(train)(train.src[:2000], train.tgt[:2000], train.dropped)
    vocab = tokenizer.load(
        tokenizer.train(train.src + train.tgt, 500 if args.dry_run else config.data.vocab_size, config.seed)
    )
    src_ids, tgt_ids = vocab.encode(list(train.src)), vocab.encode(list(train.tgt))
    text, kernels = [], []
    ratios = collections.defaultdict(list)
    for size in sizes:
        overrides = {"data.token_budget": rows * peer.PEER_LENGTH}
        if size == "toy":
            overrides |= {f"model.{k}": v for k, v in TOY.items()}
        ours = peer.Ours(
            _our_config(peer, "small" if size == "toy" else size, args.dtype, overrides),
            vocab,
            src_ids,
            tgt_ids,
            reps=3,
        )
        peer_args = argparse.Namespace(
            peer_python=sys.executable,
            wmt_dir=args.wmt_dir,
            peer_dir=str(Path(__file__).parent),
            peer_steps=3 if args.dry_run else 10,
            clock="wall",
            peer_rows=rows,
            peer_dtype=args.dtype,
        )
        with tempfile.TemporaryDirectory() as ours_dir, tempfile.TemporaryDirectory() as peer_dir:
            for r in range(args.rounds):
                results = {}
                # the peer traces 3 steps after its timed ones in the last round (one process fewer)
                last = (
                    argparse.Namespace(**{**vars(peer_args), "peer_profile_dir": peer_dir})
                    if r == args.rounds - 1
                    else peer_args
                )
                for side in ["ours", "peer"] if r % 2 == 0 else ["peer", "ours"]:
                    results[side] = peer.run_peer(last, size) if side == "peer" else ours.epoch_rates("wall")
                o, p = results["ours"], results["peer"]
                ratios[size].append(o["useful_tok_s"] / p["useful_tok_s"])
                text.append(
                    [r + 1, size, f"{o['step_s'] * 1e3:.1f}", f"{o['useful_tok_s']:,.0f}", f"{o['fill']:.2f}"]
                    + [f"{p['median_s'] * 1e3:.1f}", f"{p['useful_tok_s']:,.0f}", f"{p['target_nonpad']:.2f}"]
                    + [f"{ratios[size][-1]:.2f}"]
                )
            with jax.profiler.trace(ours_dir, create_perfetto_trace=True):
                shape = max(ours.counts, key=ours.counts.get)
                for i in range(3):
                    ours.run_step(shape, i)
            kernels.append(
                kernel_table(f"**{size}, ours** (batch shape {shape[0]} x {shape[1]})", top_kernels(ours_dir))
            )
            kernels.append(kernel_table(f"**{size}, peer**", top_kernels(peer_dir)))
    summary = [
        [size, len(xs), f"**{np.median(xs):.2f}** ({', '.join(f'{x:.2f}' for x in xs)})"] for size, xs in ratios.items()
    ]
    titles = ["round", "size", "ours ms", "ours useful tok/s", "ours fill", "peer ms", "peer useful tok/s"]
    titles += ["peer fill", "ours / peer"]
    return (
        f"{args.dtype} both sides, {rows} rows x 64 slots a step, rounds alternate which side goes first; ours on "
        "Multi30k's packed rows (the default config), the peer on its synthetic packed rows; "
        "useful = non-padding target tokens.\n\n"
        + markdown_table(titles, text, "rl" + "r" * 7)
        + "\n\n"
        + markdown_table(["size", "rounds", "useful tok/s, ours / peer, median (each)"], summary, "lrr")
        + "\n\n"
        + "\n".join(kernels)
    )


def _our_config(peer, size, dtype, overrides):
    config = peer.our_config(size, dtype, {})
    for path, value in overrides.items():
        section, field = path.split(".")
        config[section][field] = value
    return config


def part_preset(args) -> str:
    from bench.lib import LogLines, tiny_preset
    from configs import default, table3_preset
    from training.evaluation import evaluate
    from training.evaluation.loaded import load_run
    from training.run import loop

    if args.dry_run:
        dry = DRY_PRESET
        config = tiny_preset(
            packed=True, steps=dry["steps"], train_limit=dry["train_limit"], vocab_size=dry["vocab_size"]
        )
        config.eval_every_steps = config.checkpoint_every_steps = dry["steps"]
        config.eval.bleu_examples = dry["bleu_examples"]
    else:
        config = table3_preset.apply(default.get_config("h=8"), packed=True)
    lines, compiles = LogLines(), CompileTimes()
    logging.getLogger().addHandler(lines)
    logging.getLogger().setLevel(logging.INFO)
    try:
        with tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory() as workdir, compiles:
            config.compilation_cache_dir = cache
            start = time.perf_counter()
            loop.train_and_evaluate(config, workdir)
            train_s, train_end = time.perf_counter() - start, time.time()
            records = [json.loads(x) for x in (Path(workdir) / "metrics.jsonl").read_text().splitlines()]
            decode_start, start = time.time(), time.perf_counter()
            if args.dry_run:  # the first sentences only, through eval.py's own path for a file (load, beam-4 decoding)
                score = _translate_first(workdir, "test_2016_flickr", dry["bleu_examples"])
            else:
                score = evaluate.score_split(load_run(workdir), "test_2016_flickr", beam_size=4, workdir=workdir)
            decode_s = time.perf_counter() - start
    finally:
        logging.getLogger().removeHandler(lines)
    split = wall_split(lines.records, [e for e in compiles.events if e[0] <= train_end], records, train_s)
    decode_compile_s = compiles.within(decode_start, time.time())
    summary = next((x for x in lines.lines if x.startswith("compilation in this invocation")), "?")
    rows = [
        [what, f"{seconds:.1f}"]
        for what, seconds in [
            ("training run, wall", train_s),
            ("of it compiling (XLA)", split["compile_s"]),
            ("of it steps (batches and updates, compiling excluded)", split["steps_s"]),
            (
                f"of it dev evaluation (loss, greedy BLEU on {config.eval.bleu_examples}; compiling excluded)",
                split["eval_s"],
            ),
            ("of it the rest (data, vocabulary, initialisation, checkpoints)", split["rest_s"]),
            (
                f"test split, beam 4 ({score.get('sentences', 'all')} sentences; "
                f"load, {'' if args.dry_run else 'loss, '}decoding)",
                decode_s,
            ),
            ("of it compiling (XLA)", decode_compile_s),
        ]
    ]
    return (
        f"The packed Table 3 preset (configs/table3_preset.py `pack`), h = {config.model.num_heads}, "
        f"{config.num_train_steps} steps, {len(split['evaluations'])} dev evaluation(s), cold compilation cache.\n\n"
        f"{markdown_table(['part', 's'], rows, 'lr')}\n\n"
        f"Run's log: {summary}. Test BLEU (beam 4) {score['bleu']:.2f}.\n"
    )


def _translate_first(workdir, split: str, n: int) -> dict:
    """Beam-4 BLEU of the run in `workdir` on the first `n` sentences of `split` (`evaluate.translate_file`)."""
    from training.data.corpus import load_corpus
    from training.evaluation import evaluate, translate
    from training.evaluation.loaded import load_run

    run = load_run(workdir)
    corpus = load_corpus(run.config, split)
    source, output = Path(workdir) / f"{split}.first.txt", Path(workdir) / f"{split}.first.beam4.txt"
    source.write_text("".join(line + "\n" for line in corpus.src[:n]), encoding="utf-8")
    evaluate.translate_file(workdir, source, output, beam_size=4, run=run)
    bleu, _ = translate.corpus_bleu(output.read_text(encoding="utf-8").splitlines(), corpus.tgt[:n])
    return {"bleu": bleu, "sentences": n}


class CompileTimes:
    """(wall time at the end, seconds) of every XLA compile while entered (a cold cache: every program is compiled)."""

    def __init__(self):
        self.events = []

    def __enter__(self):
        jax.monitoring.register_event_duration_secs_listener(self._on_duration)
        return self

    def __exit__(self, *exc):
        jax.monitoring.unregister_event_duration_listener(self._on_duration)

    def _on_duration(self, event: str, seconds: float, **kwargs) -> None:
        if event == COMPILE_EVENT:
            self.events.append((time.time(), seconds))

    def within(self, start: float, end: float) -> float:
        return within(self.events, start, end)


def within(events, start: float, end: float) -> float:
    """Seconds of the compiles in `events` ((end time, seconds)) that ended in [start, end]."""
    return sum(seconds for when, seconds in events if start <= when <= end)


STEP_LINE = re.compile(r"step \d+/\d+ ")


def wall_split(log: list[tuple[float, str]], compiles, records: list[dict], train_s: float) -> dict:
    """A training run's wall seconds split into XLA compiling, steps, dev evaluation and the rest.

    log: the run's (time, message) log lines; compiles: (end time, seconds) of its XLA compiles;
    records: its metrics.jsonl. A dev evaluation runs from the log line of the step it follows to its
    "dev" line; the steps are the records' step times (batch assembly included) less the compile in
    the first step (from "model parameters" to "first step done"); compiles are counted once, as
    compiling, wherever they fall.
    """
    evaluations, step_at = [], None
    for when, message in log:
        if STEP_LINE.match(message):
            step_at = when
        elif message.startswith("dev {") and step_at is not None:
            evaluations.append((step_at, when))
            step_at = None
    first = lambda prefix: next((when for when, message in log if message.startswith(prefix)), None)
    params_at, first_step_at = first("model parameters"), first("first step done")
    first_step_compile = within(compiles, params_at, first_step_at) if params_at and first_step_at else 0.0
    compile_s = sum(seconds for _, seconds in compiles)
    eval_s = sum(end - start - within(compiles, start, end) for start, end in evaluations)
    steps_s = (
        sum(r["step_time_s"] * (r["step"] - prev) for r, prev in _with_previous_step(records)) - first_step_compile
    )
    return {
        "compile_s": compile_s,
        "steps_s": steps_s,
        "eval_s": eval_s,
        "rest_s": train_s - compile_s - steps_s - eval_s,
        "evaluations": evaluations,
    }


def _with_previous_step(records):
    prev = 0
    for r in records:
        if "split" in r or "step_time_s" not in r:
            continue
        yield r, prev
        prev = r["step"]


def part_decode(args) -> str:
    if not args.wmt_dir:
        return "Skipped: no snapshot of Flax's examples/wmt (--wmt_dir, FLAX_WMT_DIR or FLAX_GIT_DIR).\n"
    steps, batch, batches = (7, 4, 2) if args.dry_run else (63, 64, 3)
    cmd = [
        sys.executable,
        "-m",
        "bench.peer_decode",
        "--wmt_dir",
        args.wmt_dir,
        "--dtypes",
        args.dtype,
        "--rounds",
        str(args.rounds),
        "--batch",
        str(batch),
        "--steps",
        str(steps),
        "--batches",
        str(batches),
        "--pad_to",
        "64",
        "--clock",
        "wall",
        "--peer_dtype",
        args.dtype,
    ]
    if args.dry_run:
        cmd += ["--toy"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"bench.peer_decode failed ({done.returncode}): {done.stderr[-1500:]}")
    return f"`python -m bench.peer_decode {' '.join(cmd[3:])}`:\n\n" + done.stdout


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry_run", action="store_true", help="every part at toy sizes (any backend)")
    parser.add_argument("--out", default=str(ROOT / "results" / "gpu.md"))
    parser.add_argument(
        "--wmt_dir", default="", help="Flax's examples/wmt (default: $FLAX_WMT_DIR, else extracted from $FLAX_GIT_DIR)"
    )
    parser.add_argument("--parts", nargs="*", default=list(PARTS), choices=PARTS)
    parser.add_argument(
        "--rounds", type=int, default=0, help="alternating rounds against the peer (0: 2, 1 in a dry run)"
    )
    parser.add_argument("--calls", type=int, default=0, help="attention calls a timing (0: 100, 3 in a dry run)")
    parser.add_argument("--suite_timeout_s", type=int, default=240)
    args = parser.parse_args(argv)
    from bench.lib import flax_wmt_dir

    args.wmt_dir = flax_wmt_dir(args.wmt_dir)
    args.calls = args.calls or (3 if args.dry_run else 100)
    args.rounds = args.rounds or (1 if args.dry_run else 2)
    # the peer parts' dtype: float32 in a dry run, whose CPU has no fast bfloat16 path for the peer
    # (a toy step took 1 s)
    args.dtype = "float32" if args.dry_run else "bfloat16"
    if args.dry_run:  # toy programs: their time is compiling, which LLVM's -O0 halves (as tests/conftest.py does)
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0").strip()
    os.environ[STUB_ENV] = "1"  # the peer's processes: its TensorFlow/clu imports stubbed, never imported
    device = jax.devices()[0]
    sections = [
        f"# The GPU report\n\nWritten by `python -m bench.gpu_report{' --dry_run' if args.dry_run else ''}` "
        f"on {time.strftime('%Y-%m-%d', time.gmtime())}: {jax.device_count()} x {device.device_kind} "
        f"({jax.default_backend()}), jax {jax.__version__}."
        f"{' A dry run: toy sizes, no figure means anything.' if args.dry_run else ''}\n"
    ]
    parts = {
        "suite": part_suite,
        "attention": part_attention,
        "train_step": part_train_step,
        "preset": part_preset,
        "decode": part_decode,
    }
    for name in args.parts:
        start, cpu = time.perf_counter(), cpu_seconds()
        try:
            body = parts[name](args)
        except Exception as e:
            body = f"Failed: {type(e).__name__}: {e}\n\n```\n{traceback.format_exc()[-3000:]}```\n"
        sections.append(f"## {name} ({time.perf_counter() - start:.0f} s; {cpu_seconds() - cpu:.0f} s CPU)\n\n{body}")
        print(sections[-1], flush=True)
    Path(args.out).write_text("\n".join(sections), encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
