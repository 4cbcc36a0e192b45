"""Ahead-of-time compilation: a run's programs compiled for an accelerator this machine does not have.

JAX compiles for TPUs and NVIDIA GPUs it cannot reach. With the `libtpu` wheel installed (the `aot`
extra), `jax.experimental.topologies.get_topology_desc` describes a TPU slice as compile-only
devices; with the CUDA plugin (`jax-cuda13-plugin` and `jax-cuda13-pjrt`, also the `aot` extra) and
CUDA's `ptxas` / `nvlink` on the PATH, it describes GPUs from XLA's target config of the card
(gpu_targets/, each file naming its source), and XLA compiles for them "deviceless". A
`Mesh` over them, the train state and batch as `jax.ShapeDtypeStruct`s carrying the run's own
shardings (`trainers.MeshTrainer`), and `jit(...).lower(...).compile()` give XLA's account of the
program the run would execute: memory per device (`memory_analysis()`), FLOPs (`cost_analysis()`),
and the optimised HLO (collectives, fusions, custom calls). Nothing is computed, and no corpus or
tokenizer is loaded: the vocabulary is the config's `data.vocab_size`, the batch the config's
training shape (`train_shape`). Evaluation's programs are compiled too, for one device as it runs
them: the eval step, one step of incremental decoding with its KV cache at the full decode length,
and the whole beam search, at the config's longest decode (`decode_shape_of`).

The model is built for the target (`training.config.model_config(..., platform=)`): its backend
hooks and `model.dtype = "auto"` are chosen for the TPU, never for this host.

What the GPU route cannot say: XLA's GPU compiler without a device skips autotuning (each matmul
becomes a Triton fusion with default tiles), cuDNN's fused attention cannot compile without a
driver, and the compiled program has no cost analysis: its FLOPs are XLA:CPU's count of the
unoptimised module, divided by the devices (`Program.flops`). Read a GPU figure from here as
the program XLA would run before autotuning.

Environment: libtpu reads `LIBTPU_ENVIRONMENT` when it loads (`compile_only_devices` sets each
variable not already set): `TPU_SKIP_MDS_QUERY=1` (no metadata server off a TPU VM) and
`ALLOW_MULTIPLE_LIBTPU_LOAD=1` (two processes compiling at once). A script should also start JAX
with `JAX_PLATFORMS=cpu` (`bench.aot` does), so JAX does not try to open a TPU as its backend.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import os
import re
import shutil
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from models import Transformer, decoding
from training import config as config_lib
from training.core import step as step_lib
from training.core.errors import RunRefused
from training.data.batching import PACKING_FIELDS, Batch, eval_lengths
from training.evaluation import dev as dev_lib
from training.evaluation import translate
from training.parallel import sharding, stacked, trainers
from training.run.hlo import collectives, parse as parse_hlo
from training.run.hlo import counts as hlo_counts  # aot.hlo_counts, as bench/aot.py names it

GIB = 2**30
LIBTPU_ENVIRONMENT = {"TPU_SKIP_MDS_QUERY": "1", "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}


@dataclasses.dataclass(frozen=True)
class Chip:
    """One accelerator kind: its platform, memory a device (GiB) and how its topology is named; for a TPU, its
    peak bfloat16 matrix FLOP/s and HBM bandwidth (bytes/s) a chip (a GPU's rates are its target config's:
    `kernels.Rates`)."""

    platform: str
    name: str
    hbm_gib: float
    topology_rank: int  # TPU: 2 ("2x2") or 3 ("2x2x1"); GPU: 1 (a count of GPUs)
    chip_config_name: str | None = None  # "megacore": one device a chip (its two TensorCores as one)
    target_config: str | None = None  # a GPU's XLA target config, a file in gpu_targets/
    peak_flops: float | None = None  # TPU: bfloat16 FLOP/s a chip
    hbm_bandwidth: float | None = None  # TPU: HBM bytes/s a chip


GPU_TARGETS = Path(__file__).parent / "gpu_targets"


def _gpu(name: str, target_config: str) -> Chip:
    """A GPU whose memory is its target config's `device_memory_size` (read as GiB)."""
    found = re.search(r"device_memory_size:\s*(\d+)", (GPU_TARGETS / target_config).read_text())
    return Chip("cuda", name, round(int(found[1]) / GIB, 1), 1, target_config=target_config)


# HBM a chip, as Google Cloud's TPU system-architecture pages state it (cloud.google.com/tpu/docs/v4,
# /v5e, /v5p, /v6e), read as GiB. v4 and v5p compile as megacore: one device is a whole chip. Peak bfloat16
# FLOP/s and HBM bandwidth a chip, from the same pages' specification tables (vendor peaks, not measured):
# v4 275 TFLOP/s, 1,200 GB/s; v5e 197 TFLOP/s, 819 GB/s; v5p 459 TFLOP/s, 2,765 GB/s; v6e 918 TFLOP/s, 1,640 GB/s.
CHIPS = {
    "v4": Chip("tpu", "v4", 32, 3, "megacore", peak_flops=275e12, hbm_bandwidth=1200e9),
    "v5e": Chip("tpu", "v5e", 16, 2, peak_flops=197e12, hbm_bandwidth=819e9),
    "v5p": Chip("tpu", "v5p", 95, 3, "megacore", peak_flops=459e12, hbm_bandwidth=2765e9),
    "v6e": Chip("tpu", "v6e", 32, 2, peak_flops=918e12, hbm_bandwidth=1640e9),
    "h100": _gpu("h100", "h100_sxm.txtpb"),
    "h200": _gpu("h200", "h200.txtpb"),
}
HBM_SOURCES = {
    "tpu": "Google Cloud TPU system architecture pages (cloud.google.com/tpu/docs/v4, v5e, v5p, v6e): HBM per chip",
    "cuda": "XLA's GPU target config (training/run/gpu_targets/): device_memory_size",
}
PROGRAMS = ("train", "eval", "decode", "beam")


@dataclasses.dataclass(frozen=True)
class Target:
    """`tpu:CHIP[:TOPOLOGY]` (tpu:v5e:2x2 is 4 chips, tpu:v4:2x2x1) or `cuda:GPU[:COUNT]` (cuda:h100,
    cuda:h200:8); one chip by default."""

    chip: Chip
    topology: str

    @property
    def name(self) -> str:
        return f"{self.chip.platform}:{self.chip.name}:{self.topology}"

    @property
    def num_devices(self) -> int:
        return int(np.prod([int(n) for n in self.topology.split("x")]))


def parse_target(text: str) -> Target:
    """'tpu:v5e:2x2' or 'cuda:h100:8' -> Target; ValueError naming --target, the value and what is expected."""
    parts = text.split(":") if isinstance(text, str) else []
    tpus = tuple(n for n, c in CHIPS.items() if c.platform == "tpu")
    gpus = tuple(n for n, c in CHIPS.items() if c.platform == "cuda")
    expected = (
        f"'tpu:CHIP[:TOPOLOGY]' with CHIP one of {tpus} (tpu:v5e:2x2, tpu:v4:2x2x1) or "
        f"'cuda:GPU[:COUNT]' with GPU one of {gpus} (cuda:h100, cuda:h200:8)"
    )
    if len(parts) not in (2, 3) or parts[1] not in CHIPS or CHIPS[parts[1]].platform != parts[0]:
        raise ValueError(f"--target = {text!r}; expected {expected}")
    chip = CHIPS[parts[1]]
    topology = parts[2] if len(parts) == 3 else "x".join("1" * chip.topology_rank)
    dims = topology.split("x")
    if len(dims) != chip.topology_rank or not all(d.isdigit() and int(d) > 0 for d in dims):
        shape = "COUNT (GPUs)" if chip.platform == "cuda" else "x".join(["N"] * chip.topology_rank) + " (chips a side)"
        raise ValueError(f"--target = {text!r}: topology {topology!r}; a {chip.name} target is named {shape}")
    return Target(chip, topology)


def parse_mesh(text: str) -> tuple[int, int]:
    """'2,2' -> (data 2, model 2); ValueError naming --mesh otherwise."""
    try:
        data, model = (int(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"--mesh = {text!r}; expected DATA,MODEL as two ints (-1: the rest), e.g. 2,2") from None
    return data, model


def has_libtpu() -> bool:
    """Whether the `libtpu` wheel (the `aot` extra) is installed: TPU targets need it."""
    return importlib.util.find_spec("libtpu") is not None


def has_cuda_compiler() -> bool:
    """Whether GPU targets can compile here: the CUDA plugin (the `aot` extra) and CUDA's ptxas and nvlink."""
    return importlib.util.find_spec("jax_plugins.xla_cuda13") is not None and all(
        shutil.which(tool) for tool in ("ptxas", "nvlink")
    )


def compile_only_devices(target: Target) -> list:
    """The target's devices, for compiling only (`jax.experimental.topologies`)."""
    from jax.experimental import topologies

    if target.chip.platform == "cuda":
        if not has_cuda_compiler():
            raise ValueError(
                f"--target = {target.name!r} needs the CUDA plugin (pip install -c requirements.lock -e "
                f"'.[aot]') and CUDA's ptxas and nvlink on the PATH (a CUDA toolkit, or pip's nvidia-cuda-nvcc)"
            )
        text = (GPU_TARGETS / target.chip.target_config).read_text()
        return list(
            topologies.get_topology_desc(
                platform="cuda", target_config=text, topology=f"1x1x{target.num_devices}"
            ).devices
        )
    if not has_libtpu():
        raise ValueError(
            f"--target = {target.name!r} needs the libtpu wheel: pip install -c requirements.lock -e '.[aot]'"
        )
    for name, value in LIBTPU_ENVIRONMENT.items():
        os.environ.setdefault(name, value)
    kwargs = {"chip_config_name": target.chip.chip_config_name} if target.chip.chip_config_name else {}
    return list(
        topologies.get_topology_desc(
            topology_name=f"{target.chip.name}:{target.topology}", platform="tpu", **kwargs
        ).devices
    )


def train_shape(config, data_shards: int = 1) -> tuple[int, int]:
    """(rows, length) of the config's largest training batch, rows padded to a multiple of `data_shards` as
    `sharding.put_batch` pads them: packed rows of `data.pack_length`, else the longest bucket."""
    length = config.data.pack_length or max(config.data.bucket_lengths)
    rows = max(1, config.data.token_budget // length)
    return -(-rows // data_shards) * data_shards, length


def eval_shape_of(config) -> tuple[int, int]:
    """(rows, length) of the config's longest dev batch (`batching.dev_batches`)."""
    length = max(config.eval.get("lengths", ()) or config.data.bucket_lengths)
    return max(1, config.data.token_budget // length), length


class DoesNotFit(RunRefused):
    """A program that needs more memory a device than the target's chip has; the message is one line."""


# XLA's TPU compiler refuses a program whose buffers cannot fit: "... the total memory required for HLO
# temporaries (16.11G) exceeds available HBM (15.75G)"
_OOM = re.compile(r"required for (?P<what>[^(]*?) \((?P<need>[\d.]+)G\) exceeds available HBM \((?P<have>[\d.]+)G\)")


@dataclasses.dataclass(frozen=True)
class Program:
    """A compiled program and its FLOPs a device: XLA's cost analysis of the compiled program where the
    target's compiler gives one (TPU), else XLA:CPU's count of the unoptimised module over the devices (GPU);
    the bytes a device's program reads and writes where the cost analysis gives them (TPU), else None."""

    compiled: object  # jax.stages.Compiled
    flops: float | None
    bytes_accessed: float | None = None

    def memory_analysis(self):
        return self.compiled.memory_analysis()

    def as_text(self) -> str:
        return self.compiled.as_text()


def _compile(program: str, target: Target, fn, *args) -> tuple[Program, float, float]:
    """(the compiled `Program`, lower seconds, compile seconds); `DoesNotFit` where XLA refuses it for memory."""
    start = time.perf_counter()
    lowered = fn.lower(*args)
    lowered_at = time.perf_counter()
    try:
        compiled = lowered.compile()
    except jax.errors.JaxRuntimeError as error:
        if "RESOURCE_EXHAUSTED" not in str(error):
            raise
        found = _OOM.search(str(error))
        need = (
            f"{float(found['need']):.1f} GiB a device ({found['what']} alone; XLA's TPU compiler counts "
            f"{float(found['have']):g} GiB usable)"
            if found
            else "more memory a device than it has (XLA's TPU compiler)"
        )
        raise DoesNotFit(
            f"{PROGRAM_NAMES[program]} needs {need}; a {target.chip.name} has {target.chip.hbm_gib:g}"
        ) from None
    compiled_at = time.perf_counter()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) and cost else cost
    if cost and "flops" in cost:
        flops = float(cost["flops"])
    else:  # the devices the program spans: the train step's mesh, or the one device evaluation runs on
        spans = [len(leaf.sharding.device_set) for leaf in jax.tree.leaves(args) if getattr(leaf, "sharding", None)]
        flops = _unoptimised_flops(lowered, max(spans, default=1))
    accessed = float(cost["bytes accessed"]) if cost and "bytes accessed" in cost else None
    return Program(compiled, flops, accessed), lowered_at - start, compiled_at - lowered_at


def _unoptimised_flops(lowered, devices: int) -> float | None:
    """XLA:CPU's FLOP count of the lowered (global, unpartitioned, unoptimised) module, over `devices`; None where
    this JAX does not offer it. jaxlib's module cost analysis is not public API: the lock pins the release."""
    try:
        from jax._src.lib import _jax

        module = lowered.compiler_ir("hlo").get_hlo_module()
        cost = _jax.hlo_module_cost_analysis(jax.devices("cpu")[0].client, module)
    except (ImportError, AttributeError, RuntimeError, TypeError):
        return None
    return float(cost["flops"]) / devices if "flops" in cost else None


def compile_programs(
    config,
    target: Target,
    data: int = -1,
    model: int = 1,
    rows: int | None = None,
    programs: tuple[str, ...] = PROGRAMS,
    devices=None,
    keep_hlo: bool = False,
    stack: int = 0,
) -> dict:
    """Compile `programs` of `config` for `target` over a (data, model) mesh; {program: `program_report`}.

    stack: S > 0 compiles the train step of S seeds stacked into one program instead (`_stacked_train`).

    rows: the global training batch's rows (None: the config's, `train_shape`). The train step is the
    run's own (`MeshTrainer.step_fn`, state donated; on a GPU or TPU the step of the unlogged steps, without
    the gradient norm: `backends.grad_norm_every_step`); the eval step (`dev.eval_step_fn`), the decode step
    (`_decode_step_program`) and beam search (`_beam_program`) run as evaluation runs them, on one device
    with unsharded parameters, at the config's longest decode (`decode_shape_of`). keep_hlo: each report
    also holds the compiled module's text ("hlo").
    """
    unknown = [p for p in programs if p not in PROGRAMS]
    if unknown:
        raise ValueError(f"--programs = {','.join(programs)!r}; expected some of {PROGRAMS}")
    config = copy.deepcopy(config)
    config.parallelism = "jit"
    config.mesh.data, config.mesh.model = data, model
    config_lib.validate(config)
    devices = compile_only_devices(target) if devices is None else devices
    platform = target.chip.platform
    net = Transformer(config_lib.model_config(config, config.data.vocab_size, platform=platform))
    tx = step_lib.make_optimizer(config.optimizer, config.num_train_steps)
    trainer = trainers.make_trainer(config, net, tx, devices)
    data_shards = trainer.mesh.shape[sharding.DATA]
    default_rows, length = train_shape(config, data_shards)
    rows = default_rows if rows is None else -(-rows // data_shards) * data_shards
    packed = bool(config.data.pack_length)
    zeros = np.zeros((rows, length), np.int32)
    batch = Batch(zeros, zeros, zeros, zeros.astype(np.float32), *([zeros] * 4 if packed else []))
    state = trainer.abstract_state(jax.random.key(0), batch)
    reports = {}
    key_type = jax.random.key(0).dtype
    if "train" in programs:
        if stack:
            (compiled, lower_s, compile_s), mesh, batch_rows = _stacked_train(
                config, net, tx, target, devices, stack, rows, length, packed
            )
        else:
            spec = _batch_spec(rows, length, packed, sharding.batch_sharding(trainer.mesh))
            rng = jax.ShapeDtypeStruct((), key_type, sharding=sharding.replicated(trainer.mesh))
            compiled, lower_s, compile_s = _compile("train", target, trainer.step_fn, state, spec, rng)
            mesh, batch_rows = trainer.mesh, rows
        reports["train"] = program_report(
            compiled,
            lower_s,
            compile_s,
            target,
            devices=len(devices),
            mesh=dict(mesh.shape),
            batch=[batch_rows, length],
            **({"stack": stack} if stack else {}),
            keep_hlo=keep_hlo,
        )
    if set(programs) - {"train"}:  # evaluation's programs: one device, unsharded parameters
        one = jax.sharding.SingleDeviceSharding(devices[0])
        params = _placed(state.params, one)
    if "eval" in programs:
        eval_rows, eval_length = eval_shape_of(config)
        spec = _batch_spec(eval_rows, eval_length, False, one)
        compiled, lower_s, compile_s = _compile("eval", target, dev_lib.eval_step_fn(net), params, spec)
        reports["eval"] = program_report(
            compiled, lower_s, compile_s, target, devices=1, mesh={}, batch=[eval_rows, eval_length], keep_hlo=keep_hlo
        )
    for program, build in (("decode", _decode_step_program), ("beam", _beam_program)):
        if program in programs:
            fn, args, shape = build(config, net, params, one)
            compiled, lower_s, compile_s = _compile(program, target, fn, *args)
            reports[program] = program_report(
                compiled, lower_s, compile_s, target, devices=1, mesh={}, **shape, keep_hlo=keep_hlo
            )
    return reports


BEAM_SIZE = 4  # eval.py's --beam_size default: the config names no beam size (`eval.beam_size` overrides it)


def _stacked_train(config, net, tx, target: Target, devices, stack: int, rows: int, length: int, packed: bool):
    """The train step of `stack` seeds stacked (`training.parallel.stacked`) on a (seed, data) mesh over `devices`,
    each seed's batch `rows` x `length`, compiled for `target`: (`_compile`'s result, the mesh, a seed's rows)."""
    trainer = stacked.StackedTrainer(net, tx, config.optimizer.label_smoothing, stack, devices)
    zeros = np.zeros((rows, length), np.int32)
    state = trainer.abstract_state(Batch(zeros, zeros, zeros, zeros.astype(np.float32)))
    rows = sharding.padded_rows(rows, trainer.mesh)
    spec = {
        name: jax.ShapeDtypeStruct((stack, *struct.shape), struct.dtype, sharding=trainer.batch_sharding)
        for name, struct in _batch_spec(rows, length, packed, None).items()
    }
    per_seed = jax.ShapeDtypeStruct((stack,), jax.random.key(0).dtype, sharding=trainer.state_sharding)
    active = jax.ShapeDtypeStruct((stack,), jnp.bool_, sharding=trainer.state_sharding)
    return _compile("train", target, trainer.step_fn, state, spec, per_seed, active), trainer.mesh, rows


def decode_shape_of(config, net) -> tuple[int, int, int]:
    """(rows, source length, output length) of the config's longest decode batch, as `translate.translate`
    pads it: `dev.ROWS` sources of the longest dev length (`eval_shape_of`), output capped at that length +
    `eval.max_extra_length` and the model's max_len (with `eval.lengths`, the program's capacity)."""
    _, length = eval_shape_of(config)
    return dev_lib.ROWS, length, min(length + config.eval.max_extra_length, net.config.max_len)


def _placed(tree, where):
    """`tree`'s arrays as `ShapeDtypeStruct`s placed by `where`."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=where), tree)


def _decode_step_program(config, net, params, where):
    """One step of greedy decoding (`decoding._decode_step`, as `greedy_decode`'s loop runs it), its cache
    at the full decode length T: (params, cache [rows, T, ...] donated, encoded [rows, Ls, d_model],
    src [rows, Ls] int32, tokens [rows] int32) -> (log-probs [rows, vocab] float32, cache).

    The decoder grows its cache through `decoding.cache_lengths` (16, 32, ..., T), one program of loops;
    the step compiled here is its dearest, the last loop's at T positions. The cache is donated, as a
    `while_loop` updates its state in place. Returns (jitted step, its arguments, report fields).
    """
    rows, src_length, max_len = decode_shape_of(config, net)
    src = jax.ShapeDtypeStruct((rows, src_length), jnp.int32, sharding=where)
    encoded = jax.eval_shape(lambda p, s: net.apply({"params": p}, s, method="encode"), params, src)
    cache = jax.eval_shape(lambda p, e, s: decoding.init_cache(net, p, e, s, max_len), params, encoded, src)
    tokens = jax.ShapeDtypeStruct((rows,), jnp.int32, sharding=where)
    step = jax.jit(lambda p, c, e, s, t: decoding._decode_step(net, p, c, e, s, t), donate_argnums=1)
    args = (params, _placed(cache, where), _placed(encoded, where), src, tokens)
    return step, args, {"batch": [rows, src_length], "max_len": max_len}


def _beam_program(config, net, params, where):
    """The whole of beam search as evaluation runs it (`translate.decoder`: `decoding.beam_search`, its cache
    grown through `cache_lengths`, early stop): (params, src [rows, Ls] int32[, limit [] int32 where
    `eval.lengths` is set]) -> tokens [rows, T] int32; `BEAM_SIZE` beams a source, so rows x K cache rows.
    Returns (jitted program, its arguments, report fields)."""
    rows, src_length, max_len = decode_shape_of(config, net)
    beam_size, limited = config.eval.get("beam_size", BEAM_SIZE), bool(eval_lengths(config))
    fn = translate.decoder(net, beam_size, config.eval.alpha, max_len, limited=limited)
    src = jax.ShapeDtypeStruct((rows, src_length), jnp.int32, sharding=where)
    limit = (jax.ShapeDtypeStruct((), jnp.int32, sharding=where),) if limited else ()
    return fn, (params, src, *limit), {"batch": [rows, src_length], "max_len": max_len, "beam_size": beam_size}


def _batch_spec(rows: int, length: int, packed: bool, where) -> dict:
    """The step's batch as `ShapeDtypeStruct`s [rows, length] placed by `where` (`batching.as_arrays`' fields)."""
    names = ("src", "tgt_in", "tgt_out", "weights", *(PACKING_FIELDS if packed else ()))
    return {
        name: jax.ShapeDtypeStruct((rows, length), jnp.float32 if name == "weights" else jnp.int32, sharding=where)
        for name in names
    }


def program_report(
    compiled: Program, lower_s: float, compile_s: float, target: Target, keep_hlo: bool = False, **extra
) -> dict:
    """Per device: memory (bytes, and the share of the chip's HBM), FLOPs, collectives, fusions, custom calls; seconds.

    memory_bytes["needed"] = argument + output - alias (a donated state is its output's buffer) + temp
    + generated code: what the program holds in a device's HBM while it runs.
    """
    memory = compiled.memory_analysis()
    fields = (
        "argument_size_in_bytes",
        "output_size_in_bytes",
        "alias_size_in_bytes",
        "temp_size_in_bytes",
        "generated_code_size_in_bytes",
    )
    mem = {f.removesuffix("_size_in_bytes"): int(getattr(memory, f)) for f in fields}
    mem["needed"] = mem["argument"] + mem["output"] - mem["alias"] + mem["temp"] + mem["generated_code"]
    hlo = compiled.as_text()
    module = parse_hlo(hlo)
    found = collectives(module)
    return {
        "target": target.name,
        **extra,
        "memory_bytes": mem,
        "hbm_gib": target.chip.hbm_gib,
        "hbm_share": mem["needed"] / (target.chip.hbm_gib * GIB),
        "flops": compiled.flops,
        "bytes_accessed": getattr(compiled, "bytes_accessed", None),
        "collectives": {op: n for op, (n, _) in found.items()},
        "collective_bytes": {op: b for op, (_, b) in found.items()},
        **hlo_counts(module),
        "lower_s": lower_s,
        "compile_s": compile_s,
        **({"hlo": hlo} if keep_hlo else {}),
    }


def tpu_roofline_s(report: dict, chip: Chip) -> float | None:
    """A TPU program's roofline seconds (`program_report`, a device's program): max(FLOPs / the chip's peak bfloat16
    FLOP/s, bytes accessed / its HBM bandwidth), both counts from XLA's cost analysis of the compiled program, the
    rates the vendor's peaks (`CHIPS`); a lower bound on the program's time, not an estimate of it. None where a
    count or a rate is unknown (a GPU: `kernels.profile`)."""
    flops, accessed = report.get("flops"), report.get("bytes_accessed")
    if flops is None or accessed is None or chip.peak_flops is None or chip.hbm_bandwidth is None:
        return None
    return max(flops / chip.peak_flops, accessed / chip.hbm_bandwidth)


PROGRAM_NAMES = {"train": "the train step", "eval": "the eval step", "decode": "the decode step", "beam": "beam search"}


def refusal(program: str, report: dict) -> str | None:
    """One line if the compiled program does not fit a device of its target ("the train step needs 18.3 GiB a device;
    a v5e has 16"), else None."""
    needed = report["memory_bytes"]["needed"] / GIB
    if needed <= report["hbm_gib"]:
        return None
    chip = report["target"].split(":")[1]
    return f"{PROGRAM_NAMES.get(program, program)} needs {needed:.1f} GiB a device; a {chip} has {report['hbm_gib']:g}"


# --- the largest batch a device holds ----------------------------------------------------------------------

ROWS_GRANULARITY = 8  # the largest-batch search's step: its answer is a multiple of 8, within 8 rows of the largest


def _check_search(lo: int, hi: int, granularity: int, hbm_fraction: float) -> None:
    """`largest_rows`'s arguments, or a ValueError saying which is wrong."""
    if granularity < 1 or not 0 < lo < hi or lo % granularity or hi % granularity:
        raise ValueError(
            f"largest rows: seeds lo = {lo}, hi = {hi} must be multiples of the granularity {granularity}, 0 < lo < hi"
        )
    if not 0 < hbm_fraction <= 1:
        raise ValueError(f"largest rows: hbm_fraction = {hbm_fraction}; expected a share of the chip's HBM in (0, 1]")


def _refused_entry(rows: int, stage: str, refused: DoesNotFit) -> dict:
    """`largest_rows`'s entry for a compile XLA refused."""
    return {
        "rows": rows,
        "stage": stage,
        "needed_bytes": None,
        "fits": False,
        "why": str(refused),
        "rematerialized": None,
        "compile_s": None,
    }


def _compiled_entry(rows: int, stage: str, report: dict, hbm: float, hbm_fraction: float, without_remat: bool) -> dict:
    """`largest_rows`'s entry for a compiled train step: it fits where `refusal` accepts it, its need is within
    `hbm` bytes and, `without_remat`, XLA rematerialised nothing."""
    needed = report["memory_bytes"]["needed"]
    why = refusal("train", report) or (
        None
        if needed <= hbm
        else f"{PROGRAM_NAMES['train']} needs {needed / GIB:.1f} GiB a device, over {hbm_fraction:g} of its HBM"
    )
    remat = report.get("rematerialized")
    if why is None and without_remat and remat:
        why = f"XLA rematerialised {remat} instructions to fit it"
    return {
        "rows": rows,
        "stage": stage,
        "needed_bytes": needed,
        "fits": why is None,
        "why": why,
        "rematerialized": remat,
        "compile_s": report.get("compile_s"),
    }


def _seed_line(fits, seen: dict, lo: int, hi: int, hbm: float, granularity: int) -> tuple:
    """`largest_rows`'s seeds: compiles `lo` and `hi` rows (`fits(rows, stage)` records each in `seen`), draws
    needed = a + b * rows through them and confirms the line's answer and the multiple above it.
    Returns ((a, b) or None, the line's rows or None)."""

    def measured(rows: int) -> bool:
        return rows in seen and seen[rows]["needed_bytes"] is not None

    fits(lo, "seed")
    if measured(lo):  # else XLA refused lo: no line to draw, and the answer lies below it
        fits(hi, "seed")
    line = predicted = None
    if measured(lo) and measured(hi):
        slope = (seen[hi]["needed_bytes"] - seen[lo]["needed_bytes"]) / (hi - lo)
        intercept = seen[lo]["needed_bytes"] - slope * lo
        line = (intercept, slope)
        if slope > 0:
            predicted = max(0, int((hbm - intercept) / slope) // granularity * granularity)
            if not predicted or fits(predicted, "confirm"):  # one that does not fit says the next will not
                fits(predicted + granularity, "confirm")
    return line, predicted


def _narrow(fits, seen: dict, granularity: int) -> int:
    """`largest_rows`'s search after its seeds: gallops upwards while nothing is known not to fit, then bisects
    between the largest rows that fit and the fewest that do not; returns the largest that fit (0: none)."""

    def bounds() -> tuple[int, int | None]:
        best = max((r for r, e in seen.items() if e["fits"]), default=0)
        above = [r for r, e in seen.items() if not e["fits"] and r > best]
        return best, min(above, default=None)

    best, least = bounds()
    step = granularity
    while least is None:  # nothing known not to fit: gallop upwards
        step *= 2
        fits(best + step, "search")
        best, least = bounds()
    while least - best > granularity:
        fits((best + least) // 2 // granularity * granularity, "bisect")
        best, least = bounds()
    return best


def _shrinks(compiles: list[dict]) -> list[tuple[int, int]]:
    """(fewer, more) rows of the compiles where more rows needed less memory: the search takes needed memory
    to grow with rows, so where it does not, its answer is the boundary it narrowed to, and more rows may fit."""
    measured = sorted((c["rows"], c["needed_bytes"]) for c in compiles if c["needed_bytes"] is not None)
    return [
        (fewer, more)
        for i, (fewer, need) in enumerate(measured)
        for more, more_need in measured[i + 1 :]
        if more_need < need
    ]


def shrinks_note(shrinks: list[tuple[int, int]]) -> str:
    """What `largest_rows`'s answer means where more rows needed less memory ("" where the need grew)."""
    if not shrinks:
        return ""
    pairs = ", ".join(f"{more} rows < {fewer}" for fewer, more in shrinks)
    return (
        f". Needed memory did not grow with rows in these compiles ({pairs}): the answer is where the search "
        "narrowed to, and more rows may fit"
    )


def largest_rows(
    config,
    target: Target,
    lo: int,
    hi: int,
    granularity: int = ROWS_GRANULARITY,
    data: int = -1,
    model: int = 1,
    devices=None,
    compile_fn=None,
    on_compile=None,
    hbm_fraction: float = 1.0,
    without_remat: bool = False,
) -> dict:
    """The most training rows (a multiple of `granularity`) whose train step fits a device of `target`.

    A compile fits where `memory_bytes["needed"]` <= `hbm_fraction` of the chip's HBM (1: what `refusal`
    accepts; 0.75: what a JAX process allocates of a GPU by default, XLA_PYTHON_CLIENT_MEM_FRACTION);
    one XLA refuses (`DoesNotFit`) does not; `without_remat`: nor does one where XLA rematerialised
    (`hlo_counts`): it recomputes values to make room, so that its memory stops growing with rows
    (results/aot.md), and the step does more work than the batch asks. Compiles are slow, so the search is
    seeded by a line: the train step at `lo` and `hi` rows gives needed = a + b * rows, whose largest fitting
    multiple of `granularity` is compiled (it must fit), then the next multiple above (it must not; not compiled
    where the first did not fit). Only where one of those disagrees with the line does the search
    narrow by bisection between the largest rows that fit and the fewest that do not, on multiples
    of `granularity` (doubling the step upwards while nothing above is known not to fit). Needed
    memory is taken to grow with rows; XLA's memory plan is not linear in them, nor always monotonic
    (results/aot.md): where a compile of more rows needed less, "shrinks" names the pair.

    compile_fn(config, target, data, model, rows=, programs=, devices=) -> {"train": `program_report`}
    (`compile_programs`; a test passes a fake); on_compile(entry) is called after each compile.
    Returns {"rows": the answer (0: not even `granularity` rows fit), "shrinks": the (fewer, more) row counts
    compiled where more rows needed less memory (`_shrinks`; empty where the need grew), "needed_bytes": its
    need, "hbm_bytes", "granularity", "line": (a, b) bytes or None, "predicted": the line's rows or None,
    "compiles": [entry]}, an entry being {"rows", "stage", "needed_bytes" (None where refused), "fits", "why",
    "rematerialized" (`hlo_counts`), "compile_s"}.
    """
    _check_search(lo, hi, granularity, hbm_fraction)
    compile_fn = compile_programs if compile_fn is None else compile_fn
    if devices is None and compile_fn is compile_programs:
        devices = compile_only_devices(target)
    hbm = target.chip.hbm_gib * GIB * hbm_fraction
    compiles, seen = [], {}

    def fits(rows: int, stage: str) -> bool:
        if rows in seen:
            return seen[rows]["fits"]
        try:
            report = compile_fn(config, target, data, model, rows=rows, programs=("train",), devices=devices)["train"]
        except DoesNotFit as refused:
            entry = _refused_entry(rows, stage, refused)
        else:
            entry = _compiled_entry(rows, stage, report, hbm, hbm_fraction, without_remat)
        compiles.append(entry)
        seen[rows] = entry
        if on_compile is not None:
            on_compile(entry)
        return entry["fits"]

    line, predicted = _seed_line(fits, seen, lo, hi, hbm, granularity)
    best = _narrow(fits, seen, granularity)
    return {
        "rows": best,
        "shrinks": _shrinks(compiles),
        "needed_bytes": seen[best]["needed_bytes"] if best else None,
        "hbm_bytes": hbm,
        "granularity": granularity,
        "line": line,
        "predicted": predicted,
        "compiles": compiles,
    }
