"""The GPU report: one call on a machine with one GPU writes results/gpu.md (about 8 minutes on an H200).

    MULTI30K_DIR=DATA FLAX_WMT_DIR=WMT python -m bench.gpu_report            # on the GPU
    MULTI30K_DIR=DATA FLAX_WMT_DIR=WMT python -m bench.gpu_report --dry_run  # every part at toy sizes, any backend

DATA: Multi30k (training/data/corpus.py); WMT: a snapshot of Flax's examples/wmt (the peer; without
it the peer's columns say so). What to carry onto an image that lacks this project's other
dependencies: docs/benchmarks.md, "The GPU report". Parts, each in its own section (a part that
fails reports its error and the others still run; `--parts` picks some):

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
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("suite", "attention", "train_step", "preset", "decode")
PEER_ROWS = 512  # rows of 64 slots a step, both sides
ATTENTION_SHAPES = [(4, 1024, 8, 64), (1, 4096, 8, 64), (1, 16384, 8, 64)]  # B, N, heads, head dim
TOY = dict(d_model=32, num_heads=2, num_layers=1, mlp_dim=64)


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
    names = {e["pid"]: e.get("args", {}).get("name", "") for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
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
    rows = "".join(f"| {i} | `{name[:80]}` | {ms:.3f} | {calls} | {ms / total:.0%} |\n" for i, (name, ms, calls) in enumerate(kernels, 1))
    return f"{title} (3 traced steps; share of these ten):\n\n| # | kernel | ms | calls | share |\n|---:|---|---:|---:|---:|\n{rows}"


# --- the parts ------------------------------------------------------------------------------------

def part_suite(args) -> str:
    """The default suite on this backend (a dry run: one small test file), its summary line."""
    targets = ["tests/attention/test_cudnn.py"] if args.dry_run else ["tests"]
    xdist = [] if args.dry_run else ["-n", str(min(8, os.cpu_count() or 1))]
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "not slow", "-p", "no:cacheprovider", *xdist, *targets]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=args.suite_timeout_s)
    lines = done.stdout.strip().splitlines()
    failures = [line for line in lines if line.startswith(("FAILED", "ERROR"))]
    return (f"`{' '.join(cmd[2:])}` (exit {done.returncode}):\n\n    {lines[-1] if lines else done.stderr[-500:]}\n\n"
            + "".join(f"    {line}\n" for line in failures[:30]))


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
                loss = lambda q, k, v, impl=impl: jnp.sum(attention.dot_product_attention(
                    q, k, v, impl=impl, is_causal=causal).astype(jnp.float32) * g.astype(jnp.float32))
                step = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
                try:
                    times[impl] = device_us(step, (q, k, v), args.calls)
                except Exception as e:  # noqa: BLE001 - a refusal is a row, not the end of the report
                    times[impl] = f"{type(e).__name__}: {str(e)[:60]}"
            anchor = torch_us.get((B, N, H, D, causal))
            cells = [f"{t:,.0f}" if isinstance(t, float) else t for t in times.values()]
            ratio = (f"{times[impls[0]] / anchor:.2f}" if anchor and isinstance(times[impls[0]], float) else "-")
            rows.append(f"| {B}, {N}, {H}, {D} | {'yes' if causal else 'no'} | {' | '.join(cells)} | "
                        f"{f'{anchor:,.0f}' if anchor else '-'} | {ratio} |")
    head = " | ".join(f"{impl} µs" for impl in impls)
    return (f"Forward+backward, bfloat16, µs a call ({args.calls} calls queued, one wait). torch: "
            f"{torch_us.get('version', 'not importable or no CUDA')}.\n\n| B, N, heads, d | causal | {head} | torch SDPA µs | "
            f"{impls[0]} / torch |\n|---|---|{'---:|' * len(impls)}---:|---:|\n" + "\n".join(rows) + "\n")


def _torch_sdpa(shapes, calls) -> dict:
    """torch SDPA forward+backward µs per (B, N, H, D, causal), CUDA events over `calls` calls; {} without torch/CUDA."""
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
        return "Skipped: no snapshot of Flax's examples/wmt (--wmt_dir or FLAX_WMT_DIR).\n"
    sizes = ["toy"] if args.dry_run else ["small", "base"]
    rows = 4 if args.dry_run else PEER_ROWS
    config = default.get_config()
    train = load_corpus(config, config.data.train_split)
    if args.dry_run:
        train = type(train)(train.src[:2000], train.tgt[:2000], train.dropped)
    vocab = tokenizer.load(tokenizer.train(train.src + train.tgt, 500 if args.dry_run else config.data.vocab_size, config.seed))
    src_ids, tgt_ids = vocab.encode(list(train.src)), vocab.encode(list(train.tgt))
    text, kernels = [], []
    ratios = collections.defaultdict(list)
    for size in sizes:
        overrides = {"data.token_budget": rows * peer.PEER_LENGTH}
        if size == "toy":
            overrides |= {f"model.{k}": v for k, v in TOY.items()}
        ours = peer.Ours(_our_config(peer, "small" if size == "toy" else size, overrides), vocab, src_ids, tgt_ids, reps=3)
        peer_args = argparse.Namespace(peer_python=sys.executable, wmt_dir=args.wmt_dir, peer_dir=str(Path(__file__).parent),
                                       peer_steps=3 if args.dry_run else 10, clock="wall", peer_rows=rows, peer_dtype="bfloat16")
        for r in range(args.rounds):
            results = {}
            for side in (["ours", "peer"] if r % 2 == 0 else ["peer", "ours"]):
                results[side] = peer.run_peer(peer_args, size) if side == "peer" else ours.epoch_rates("wall")
            o, p = results["ours"], results["peer"]
            ratios[size].append(o["useful_tok_s"] / p["useful_tok_s"])
            text.append(f"| {r + 1} | {size} | {o['step_s'] * 1e3:.1f} | {o['useful_tok_s']:,.0f} | {o['fill']:.2f} | "
                        f"{p['median_s'] * 1e3:.1f} | {p['useful_tok_s']:,.0f} | {p['target_nonpad']:.2f} | {ratios[size][-1]:.2f} |")
        with tempfile.TemporaryDirectory() as ours_dir, tempfile.TemporaryDirectory() as peer_dir:
            with jax.profiler.trace(ours_dir, create_perfetto_trace=True):
                shape = max(ours.counts, key=ours.counts.get)
                for i in range(3):
                    ours._run(shape, i)
            peer.run_peer(argparse.Namespace(**{**vars(peer_args), "peer_profile_dir": peer_dir, "peer_steps": 1}), size)
            kernels.append(kernel_table(f"**{size}, ours** (batch shape {shape[0]} x {shape[1]})", top_kernels(ours_dir)))
            kernels.append(kernel_table(f"**{size}, peer**", top_kernels(peer_dir)))
    summary = "".join(f"| {size} | {len(xs)} | **{np.median(xs):.2f}** ({', '.join(f'{x:.2f}' for x in xs)}) |\n" for size, xs in ratios.items())
    return (f"bfloat16 both sides, {rows} rows x 64 slots a step, rounds alternate which side goes first; ours on "
            "Multi30k's packed rows (the default config), the peer on its synthetic packed rows; useful = non-padding target tokens.\n\n"
            "| round | size | ours ms | ours useful tok/s | ours fill | peer ms | peer useful tok/s | peer fill | ours / peer |\n"
            "|---:|---|---:|---:|---:|---:|---:|---:|---:|\n" + "\n".join(text)
            + "\n\n| size | rounds | useful tok/s, ours / peer, median (each) |\n|---|---:|---:|\n" + summary + "\n" + "\n".join(kernels))


def _our_config(peer, size, overrides):
    config = peer.our_config(size, "bfloat16", {})
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
        config = tiny_preset(packed=True, steps=20, train_limit=1000)
    else:
        config = table3_preset.apply(default.get_config("h=8"), packed=True)
    lines = LogLines()
    logging.getLogger().addHandler(lines)
    logging.getLogger().setLevel(logging.INFO)
    try:
        with tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory() as workdir:
            config.compilation_cache_dir = cache
            start = time.perf_counter()
            loop.train_and_evaluate(config, workdir)
            train_s = time.perf_counter() - start
            records = [json.loads(x) for x in (Path(workdir) / "metrics.jsonl").read_text().splitlines()]
            steps_s = sum(r["step_time_s"] * (r["step"] - prev) for r, prev in _with_previous_step(records))
            compile_s = sum(r.get("compile_s", 0.0) for r in records if "split" not in r)
            start = time.perf_counter()
            score = evaluate.score_split(load_run(workdir), "test_2016_flickr", beam_size=4, workdir=workdir)
            decode_s = time.perf_counter() - start
    finally:
        logging.getLogger().removeHandler(lines)
    summary = next((x for x in lines.lines if x.startswith("compilation in this invocation")), "?")
    rest = train_s - steps_s - compile_s
    return (f"The packed Table 3 preset (configs/table3_preset.py `pack`), h = 8, {config.num_train_steps} steps, cold cache.\n\n"
            f"| part | s |\n|---|---:|\n| training run, wall | {train_s:.1f} |\n| of it compiling | {compile_s:.1f} |\n"
            f"| of it steps | {steps_s:.1f} |\n| of it dev evaluation (loss, greedy BLEU), data, checkpoints | {rest:.1f} |\n"
            f"| test split, beam 4 (load, compile, decode) | {decode_s:.1f} |\n\n"
            f"Run's log: {summary}. Test BLEU (beam 4) {score['bleu']:.2f}.\n")


def _with_previous_step(records):
    prev = 0
    for r in records:
        if "split" in r or "step_time_s" not in r:
            continue
        yield r, prev
        prev = r["step"]


def part_decode(args) -> str:
    if not args.wmt_dir:
        return "Skipped: no snapshot of Flax's examples/wmt (--wmt_dir or FLAX_WMT_DIR).\n"
    steps, batch, batches = (7, 4, 2) if args.dry_run else (63, 64, 3)
    cmd = [sys.executable, "-m", "bench.peer_decode", "--wmt_dir", args.wmt_dir, "--dtypes", "bfloat16",
           "--rounds", str(args.rounds), "--batch", str(batch), "--steps", str(steps), "--batches", str(batches),
           "--pad_to", "64", "--clock", "wall", "--peer_dtype", "bfloat16"]
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
    parser.add_argument("--wmt_dir", default=os.environ.get("FLAX_WMT_DIR", ""), help="Flax's examples/wmt (default: $FLAX_WMT_DIR)")
    parser.add_argument("--parts", nargs="*", default=list(PARTS), choices=PARTS)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--calls", type=int, default=0, help="attention calls a timing (0: 100, 3 in a dry run)")
    parser.add_argument("--suite_timeout_s", type=int, default=240)
    args = parser.parse_args(argv)
    args.calls = args.calls or (3 if args.dry_run else 100)
    device = jax.devices()[0]
    sections = [f"# The GPU report\n\nWritten by `python -m bench.gpu_report{' --dry_run' if args.dry_run else ''}` "
                f"on {time.strftime('%Y-%m-%d', time.gmtime())}: {jax.device_count()} x {device.device_kind} "
                f"({jax.default_backend()}), jax {jax.__version__}.{' A dry run: toy sizes, no figure means anything.' if args.dry_run else ''}\n"]
    parts = {"suite": part_suite, "attention": part_attention, "train_step": part_train_step, "preset": part_preset, "decode": part_decode}
    for name in args.parts:
        start = time.perf_counter()
        try:
            body = parts[name](args)
        except Exception as e:  # noqa: BLE001 - one failed part must not lose the others
            body = f"Failed: {type(e).__name__}: {e}\n\n```\n{traceback.format_exc()[-3000:]}```\n"
        sections.append(f"## {name} ({time.perf_counter() - start:.0f} s)\n\n{body}")
        print(sections[-1], flush=True)
    Path(args.out).write_text("\n".join(sections), encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
