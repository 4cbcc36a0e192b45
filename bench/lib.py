"""What the bench scripts share: timing, the machine, Flax's example as the peer, sizes, FLOP counts, workloads.

Every other module in bench/ is a script that imports this one (and the project's packages), never
another script. Module-level imports are the standard library and NumPy only: bench/torch_sdpa.py
imports this module under a Python that has torch but not JAX, and bench/flax_wmt_step.py and
bench/flax_wmt_decode.py under the peer's interpreter, which need not have this project's other
dependencies; the helpers that need JAX or the project import them where they run.

`--clock cpu` (the scripts' default) counts only this process's CPU time, which on a core shared
with other jobs is steadier than wall-clock.
"""

from __future__ import annotations

import ast
import functools
import importlib
import io
import json
import logging
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import types
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]  # child processes run `-m bench.…` from here

# --- timing and the machine -----------------------------------------------------------------------

CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}
# Run a module with its step clock on this process's CPU time (argv: module, its arguments).
CPU_CLOCK_SHIM = (
    "import runpy, sys, time; time.perf_counter = time.process_time; "
    "sys.argv = sys.argv[1:]; runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)"
)


def median_ms(run: Callable[[], object], reps: int, *, clock: str = "cpu", warmup: int = 1) -> float:
    """Median over `reps` timed calls of `run()` (which must block until its work is done), after `warmup` calls."""
    now = CLOCKS[clock]
    for _ in range(warmup):
        run()
    times = []
    for _ in range(reps):
        start = now()
        run()
        times.append((now() - start) * 1e3)
    return statistics.median(times)


def median_seconds(fn, args, reps, clock="wall"):
    """Seconds of `fn(*args)` on `clock` (the first two calls compile and warm up)."""
    import jax

    return median_ms(lambda: jax.block_until_ready(fn(*args)), reps, clock=clock, warmup=2) / 1e3


def cpu_description() -> str:
    """`lscpu`'s model name, the CPU's bfloat16 / AMX flags (from /proc/cpuinfo), this process's cores and
    `releases()`."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    field = lambda name: next(
        (line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith(name)), "?"
    )
    flags = [f for f in field("flags").split() if "bf16" in f or f.startswith("amx") or f in ("avx2", "avx512f")]
    affinity = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else "?"
    return f"{field('model name')} ({' '.join(flags) or 'no avx2/avx512/bf16 flags'}); affinity {affinity}{releases()}"


def releases() -> str:
    """'; jax 0.12.1, ..., requirements.lock 1a2b3c4d5e6f' (training/core/provenance.py), '' where the project
    cannot be imported (this module under another interpreter, e.g. torch's for bench/torch_sdpa.py)."""
    try:
        from training.core import provenance
    except ImportError:
        return ""
    return f"; {provenance.describe()}"


# --- the peer: Flax's examples/wmt, imported unmodified ------------------------------------------

# The example's imports that its train step, predict_step and beam search never call (metric writers,
# periodic actions, the TensorFlow input pipeline): an empty module stands in where one cannot be imported.
STUBBABLE = ("tensorflow", "clu", "clu.metric_writers", "clu.periodic_actions", "input_pipeline")
# "1" in the environment: stub every STUBBABLE module without trying its import (importing TensorFlow
# costs seconds a process, and on a GPU it would take memory the step needs)
STUB_ENV = "FLAX_WMT_STUB_DATA"


def add_peer_arguments(parser) -> None:
    """The Flax examples/wmt comparisons' shared options: --peer_python and --wmt_dir (`flax_wmt_dir`)."""
    parser.add_argument(
        "--peer_python", default=sys.executable, help="an interpreter with the peer's packages (default: this one)"
    )
    parser.add_argument(
        "--wmt_dir",
        default="",
        help="a snapshot of Flax's examples/wmt (default: $FLAX_WMT_DIR, "
        "else extracted from the google/flax git dir $FLAX_GIT_DIR)",
    )


def flax_wmt_dir(wmt_dir: str = "") -> str:
    """Flax's examples/wmt: `wmt_dir`, else $FLAX_WMT_DIR, else extracted from the google/flax git dir
    $FLAX_GIT_DIR (a bare repository or a clone's .git, as tests/attention/test_flax_dropin.py takes it)
    at $FLAX_GIT_REF (default HEAD) into a temporary folder named for the commit; "" when none is set."""
    wmt_dir = wmt_dir or os.environ.get("FLAX_WMT_DIR", "")
    git_dir = os.environ.get("FLAX_GIT_DIR", "")
    if wmt_dir or not git_dir:
        return wmt_dir
    git = ["git", f"--git-dir={git_dir}"]
    commit = subprocess.run(
        [*git, "rev-parse", os.environ.get("FLAX_GIT_REF", "HEAD")], check=True, capture_output=True, text=True
    ).stdout.strip()
    dest = Path(tempfile.gettempdir()) / f"flax-{commit[:12]}"
    if not (dest / "examples" / "wmt" / "train.py").exists():
        archive = subprocess.run([*git, "archive", commit, "examples/wmt"], check=True, capture_output=True).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(dest, filter="data")
    return str(dest / "examples" / "wmt")


def import_flax_example(wmt_dir: str, names: tuple[str, ...]) -> tuple[list, list[str]]:
    """(the example's modules `names`, e.g. ("train", "models"), the stubs that stood in for missing imports).

    The example's folder goes first on sys.path; a module found elsewhere (this repository's
    `models` package, say) is refused rather than timed as the peer's.
    """
    folder = Path(wmt_dir).resolve()
    sys.path.insert(0, str(folder))
    stubbed = []
    for name in STUBBABLE:
        try:
            if os.environ.get(STUB_ENV) == "1":
                raise ImportError(f"not imported: {STUB_ENV}=1")
            importlib.import_module(name)
        except Exception as e:  # missing, or broken (tensorflow_text against another TF)
            if name == "tensorflow":
                _import_flax_io_without_tensorflow()
            stub = _stub(name, f"stub: real import failed with {type(e).__name__}: {e}")
            sys.modules[name] = stub
            parent, _, child = name.rpartition(".")
            if parent:
                setattr(sys.modules[parent], child, stub)
            stubbed.append(f"{name} ({type(e).__name__}: {str(e)[:120]})")
    modules = [importlib.import_module(name) for name in names]
    for name, module in zip(names, modules):
        if not Path(module.__file__).resolve().is_relative_to(folder):
            raise ImportError(f"{name!r} was imported from {module.__file__}, not from Flax's example in {folder}")
    return modules, stubbed


def _import_flax_io_without_tensorflow() -> None:
    """Import `flax.io` (which the example's train.py reaches through flax.training.checkpoints) before
    TensorFlow's stub exists: it probes for TensorFlow with `importlib.util.find_spec`, which raises on
    a stub module (no spec). A None entry in sys.modules makes the probe answer "absent", installed or not."""
    absent = object()
    saved = sys.modules.get("tensorflow", absent)
    sys.modules["tensorflow"] = None
    try:
        importlib.import_module("flax.io")
    finally:
        if saved is absent:
            del sys.modules["tensorflow"]
        else:
            sys.modules["tensorflow"] = saved


def _stub(name: str, doc: str = "stub") -> types.ModuleType:
    """An empty module whose every public attribute is another stub: the example's module-level uses
    (annotations such as `tf.data.Dataset`) resolve, and nothing is ever called."""
    stub = types.ModuleType(name, doc)

    def attribute(attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        value = _stub(f"{name}.{attr}")
        setattr(stub, attr, value)
        return value

    stub.__getattr__ = attribute
    return stub


def run_json_script(python: str, module: str, args: list[str], clock: str) -> dict:
    """Run `python -m module args` from the repository root and return the last JSON line it prints.

    `clock="cpu"`: through `CPU_CLOCK_SHIM`, so the script's `time.perf_counter` counts its own CPU time.
    """
    cmd = [python, "-c", CPU_CLOCK_SHIM, module, *args] if clock == "cpu" else [python, "-m", module, *args]
    done = subprocess.run(
        cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        raise RuntimeError(f"{module} failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(lines[-1])


# --- sizes, rates and FLOP counts -----------------------------------------------------------------

# name: (model sizes, rows, length, reference steps/s: Flax examples/wmt's step on one core, float32)
SIZES = {
    "small": (dict(d_model=256, num_heads=4, num_layers=3, mlp_dim=1024), 20, 64, 1.27),  # configs/default.py
    "base": (dict(d_model=512, num_heads=8, num_layers=6, mlp_dim=2048), 32, 64, 1 / 5.23),  # configs/base.py
}
VOCAB = 8000
PEER_LENGTH = 64  # the peer's packed row length
# The same models in Flax examples/wmt's config fields, and a toy size for dry runs (rows: SIZES', toy 4).
PEER_SIZES = {
    "small": dict(emb_dim=256, qkv_dim=256, mlp_dim=1024, num_heads=4, num_layers=3),
    "base": dict(emb_dim=512, qkv_dim=512, mlp_dim=2048, num_heads=8, num_layers=6),
    "toy": dict(emb_dim=32, qkv_dim=32, mlp_dim=64, num_heads=2, num_layers=1),
}
TOY = dict(d_model=32, num_heads=2, num_layers=1, mlp_dim=64)  # PEER_SIZES["toy"] in our config's fields
HLO_DTYPES = {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}


def matmul_flops_per_s(dtype, n=2048, reps=5, clock="wall") -> float:
    """The roofline: FLOP/s of one jitted n x n x n matmul in `dtype`."""
    import jax

    a = jax.random.normal(jax.random.key(0), (n, n), dtype)
    seconds = median_seconds(jax.jit(lambda a: a @ a), (a,), reps, clock)
    return 2 * n**3 / seconds


def compiled_flops(lowered) -> float:
    """XLA's FLOP count of a lowered (or compiled) program; NaN where the backend gives none.

    `cost_analysis()` may return None (seen on a GPU), a dict, or a one-dict list (older JAX);
    a missing count makes the MFU columns NaN instead of stopping the bench.
    """
    compiled = lowered.compile() if hasattr(lowered, "compile") else lowered
    analysis = compiled.cost_analysis()
    if isinstance(analysis, (list, tuple)):
        analysis = analysis[0] if analysis else None
    return float((analysis or {}).get("flops", float("nan")))


def hlo_dots(hlo: str) -> list[tuple]:
    """Every `dot` of an optimized HLO module (fused ones too), as (lhs shape, rhs shape, dtypes, dimension numbers);
    `training.run.hlo` reads the text."""
    from training.run.hlo import parse

    return [
        ((d.lhs.dims, d.lhs.dtype), (d.rhs.dims, d.rhs.dtype), d.result.dtype, d.dimension_numbers)
        for d in parse(hlo).dots()
    ]


def dot_seconds(hlo: str, reps: int = 5, clock: str = "cpu") -> tuple[float, float, int]:
    """(seconds, FLOPs, count) of the module's dots, each timed alone as one jitted `lax.dot_general` of its shapes."""
    import jax
    import jax.numpy as jnp

    total_s = total_flops = 0.0
    dots = hlo_dots(hlo)
    for (lhs, lhs_dtype), (rhs, rhs_dtype), out_dtype, numbers in set(dots):
        count = dots.count(((lhs, lhs_dtype), (rhs, rhs_dtype), out_dtype, numbers))
        a, b = jnp.ones(lhs, jnp.dtype(HLO_DTYPES[lhs_dtype])), jnp.ones(rhs, jnp.dtype(HLO_DTYPES[rhs_dtype]))
        out = jnp.dtype(HLO_DTYPES[out_dtype])
        f = jax.jit(lambda a, b, n=numbers, o=out: jax.lax.dot_general(a, b, n, preferred_element_type=o))
        total_s += count * median_seconds(f, (a, b), reps, clock)
        contracted = np.prod([lhs[d] for d in numbers[0][0]])
        out_size = np.prod(jax.eval_shape(f, a, b).shape)
        total_flops += count * 2.0 * out_size * contracted
    return total_s, total_flops, len(dots)


# --- batches, configs and workloads ---------------------------------------------------------------


def synthetic_batch(rows: int, length: int, vocab: int, seed: int = 0):
    """A `training.data.batching.Batch` of random tokens in [4, vocab), every position real (weights 1)."""
    from training.data.batching import Batch

    rng = np.random.default_rng(seed)
    tokens = lambda: rng.integers(4, vocab, (rows, length), dtype=np.int32)
    return Batch(tokens(), tokens(), tokens(), np.ones((rows, length), np.float32))


def corpus_vocab(config, pairs: int | None = None, vocab_size: int | None = None):
    """(Multi30k's training corpus as `config` reads it, the SentencePiece vocabulary trained on its
    first `pairs` pairs (None: all) at `vocab_size` (None: the config's)), as the training loop trains it."""
    from training.data import tokenizer
    from training.data.corpus import load_corpus

    train = load_corpus(config, config.data.train_split)
    src, tgt = train.src[:pairs], train.tgt[:pairs]
    vocab = tokenizer.load(tokenizer.train(src + tgt, vocab_size or config.data.vocab_size, config.seed))
    return train, vocab


def our_config(size: str, dtype: str, overrides: dict):
    """The default config at `size`, `dtype`, with the peer's slots per step, then `overrides` {"a.b": value}."""
    from configs import default
    from training import config as config_lib

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


def with_fields(model, overrides: dict | None):
    """`model` (a `models.Transformer`) with these `TransformerConfig` fields replaced, e.g. a backend hook
    (`dot_general`, `formulation`, `dropout_keep`) taken out to time the model without it."""
    import dataclasses

    return type(model)(dataclasses.replace(model.config, **overrides)) if overrides else model


@functools.cache
def no_logits_barrier():
    """XLA:CPU's formulation (`backends.xla_cpu.FORMULATION`) with a decode step's log-probabilities spelled
    plainly: no barrier between the vocabulary matmul and log_softmax, every other barrier kept. One instance
    (of one class) a process, so configs holding it compare equal."""
    from attention.formulation import Formulation
    from backends import xla_cpu

    class NoLogitsBarrier(xla_cpu.XlaCpuFormulation):
        def decode_log_probs(self, logits):
            return Formulation.decode_log_probs(self, logits)

    return NoLogitsBarrier()


class Ours:
    """Our side of the training-step comparison: the training loop's trainer for one config, compiled
    for every bucket shape of an epoch of real batches; `epoch_rates` times the epoch's shapes."""

    def __init__(self, config, vocab, src_ids, tgt_ids, reps: int, model_overrides: dict | None = None):
        import jax

        from training import config as config_lib
        from training.data.batching import BatchSchedule, as_arrays
        from training.parallel import trainers
        from training.core import step as step_lib

        self.model = with_fields(config_lib.build_model(config, vocab, config.model.dtype), model_overrides)
        self.schedule = BatchSchedule(
            src_ids,
            tgt_ids,
            token_budget=config.data.token_budget,
            bucket_lengths=config.data.bucket_lengths,
            seed=config.seed,
            pack_length=config.data.pack_length,
        )
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
        self.flops = {shape: self.flops_of(b[0]) for shape, b in self.batches.items()}
        self.compiled = False

    def flops_of(self, batch: dict) -> float:
        """XLA's FLOP count of one step on `batch` (a dict of arrays)."""
        return compiled_flops(self.trainer.step_fn.lower(self.state, self.trainer.put_batch(batch), self.rng))

    def run_step(self, shape, i=0):
        """One step on the `i`-th kept batch of `shape`, waited for."""
        import jax

        batch = self.batches[shape][i % len(self.batches[shape])]
        self.state, metrics = self.trainer.step(self.state, self.trainer.put_batch(batch), self.rng)
        jax.device_get(metrics)  # as the loop: waits for the step

    def epoch_rates(self, clock: str) -> dict:
        """Useful and slot target tokens/s over an epoch, its mean step seconds, and FLOPs per second."""
        if not self.compiled:  # compile every shape outside the clock
            for shape in self.batches:
                self.run_step(shape)
            self.compiled = True
        seconds = {}
        for shape in self.batches:
            calls = iter(range(10**9))
            reps = len(self.batches[shape])
            seconds[shape] = (
                median_ms(lambda: self.run_step(shape, next(calls)), max(reps, 2), clock=clock, warmup=0) / 1e3
            )
        total = sum(self.counts[s] * seconds[s] for s in seconds)
        return dict(
            useful_tok_s=sum(self.useful.values()) / total,
            slot_tok_s=sum(self.slots.values()) / total,
            step_s=total / sum(self.counts.values()),
            flop_s=sum(self.counts[s] * self.flops[s] for s in seconds) / total,
            fill=sum(self.useful.values()) / sum(self.slots.values()),
            shapes=len(seconds),
        )

    def matmul_share(self, clock: str, reps: int = 5) -> dict:
        """Step seconds at the epoch's most frequent shape, and its dots' seconds each timed alone (`dot_seconds`)."""
        shape = max(self.counts, key=self.counts.get)
        hlo = (
            self.trainer.step_fn.lower(self.state, self.trainer.put_batch(self.batches[shape][0]), self.rng)
            .compile()
            .as_text()
        )
        dots_s, dots_flops, dots = dot_seconds(hlo, reps, clock)
        calls = iter(range(10**9))
        step_s = median_ms(lambda: self.run_step(shape, next(calls)), reps, clock=clock, warmup=1) / 1e3
        return dict(shape=shape, step_s=step_s, dots_s=dots_s, dots=dots, dot_flop_s=dots_flops / dots_s)


def run_peer(args, size: str) -> dict:
    """The peer's training step (`bench.flax_wmt_step` under `args.peer_python`): its JSON line, with useful tokens/s.

    `args`: wmt_dir, peer_python, clock, and optionally peer_steps (0: 10 small, 5 base), peer_rows,
    peer_dtype, peer_profile_dir.
    """
    steps = getattr(args, "peer_steps", 0) or {"small": 10, "base": 5}.get(size, 3)
    cmd = ["--wmt_dir", flax_wmt_dir(args.wmt_dir), "--size", size, "--steps", str(steps)]
    cmd += ["--batch", str(args.peer_rows)] if getattr(args, "peer_rows", 0) else []
    cmd += ["--dtype", args.peer_dtype] if getattr(args, "peer_dtype", "") else []
    cmd += ["--profile_dir", str(args.peer_profile_dir)] if getattr(args, "peer_profile_dir", "") else []
    out = run_json_script(args.peer_python, "bench.flax_wmt_step", cmd, args.clock)
    out["useful_tok_s"] = out["slot_tok_s"] * out["target_nonpad"]
    return out


class OursDecode:
    """Our side of the decode comparison: `models.beam_search` jitted for a source batch, compiled for
    every batch shape of the sources it is given.

    `toy`: a toy model (a dry run); `model_overrides`: `TransformerConfig` fields replaced after the
    config chose them (`with_fields`); `search`: the beam search jitted, called as `models.beam_search`
    (None: `models.beam_search`; bench/decode_ablation.py passes one with a piece taken out), each
    decoder its own jitted program.
    """

    def __init__(
        self,
        dtype: str,
        vocab,
        src_ids,
        batch: int,
        steps: int,
        beam: int,
        pad_to: int = 0,
        toy: bool = False,
        model_overrides: dict | None = None,
        search: Callable | None = None,
    ):
        import jax
        import jax.numpy as jnp

        from configs import default
        from models import beam_search
        from training import config as config_lib
        from training.data.batching import BatchSchedule, bucket_length

        config = default.get_config()
        config.model.update(TOY if toy else SIZES["small"][0])
        self.model = with_fields(config_lib.build_model(config, vocab, dtype), model_overrides)
        tokens = jnp.ones((1, 2), jnp.int32)
        self.params = jax.jit(self.model.init)(jax.random.key(0), tokens, tokens)["params"]
        search = search or beam_search
        self.decode = jax.jit(
            lambda params, src: search(self.model, params, src, beam_size=beam, alpha=0.6, max_len=steps)[0]
        )
        self.batches = []
        for start in range(0, len(src_ids) - batch + 1, batch):
            chunk = [
                ids[:pad_to] if pad_to else ids for ids in src_ids[start : start + batch]
            ]  # the peer cuts to its length too
            length = pad_to or bucket_length(max(map(len, chunk)), config.data.bucket_lengths)
            self.batches.append(jnp.asarray(BatchSchedule.assemble(chunk, [[] for _ in chunk], batch, length).src))
        out = [np.asarray(self.decode(self.params, src)) for src in self.batches]  # compile every shape
        self.rows_with_eos = sum(int((o == self.model.config.eos_id).any(axis=1).sum()) for o in out)
        self.rows = batch * len(self.batches)

    def seconds_per_batch(self, clock: str) -> float:
        """Median over the batches of one batch's seconds (each batch once)."""
        import jax

        batches = iter(self.batches)
        return (
            median_ms(
                lambda: jax.block_until_ready(self.decode(self.params, next(batches))),
                len(self.batches),
                clock=clock,
                warmup=0,
            )
            / 1e3
        )


# --- a preset run at a tiny size, and its log ------------------------------------------------------

TINY_MODEL = dict(d_model=32, num_heads=4, mlp_dim=64)


def tiny_preset(packed: bool, steps: int, train_limit: int = 0, vocab_size: int | None = None):
    """The Table 3 preset (configs/table3_preset.py) at a tiny model size, `steps` steps, the first
    `train_limit` training pairs (0: all); `vocab_size` None: the preset's own."""
    from configs import default, table3_preset

    config = table3_preset.apply(default.get_config("h=4"), packed=packed)
    table3_preset.set_steps(config, steps)
    config.log_every_steps = max(1, steps // 10)
    config.data.train_limit = train_limit
    if vocab_size:
        config.data.vocab_size = vocab_size
    config.model.update(TINY_MODEL)
    return config


class LogLines(logging.Handler):
    """Every log record's (time, message), kept in order (to read a run's own lines back)."""

    def __init__(self):
        super().__init__()
        self.records: list[tuple[float, str]] = []

    def emit(self, record):
        self.records.append((record.created, record.getMessage()))

    @property
    def lines(self) -> list[str]:
        return [message for _, message in self.records]
