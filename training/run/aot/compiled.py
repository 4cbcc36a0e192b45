"""One program compiled for a target, and XLA's account of it: memory a device, FLOPs, collectives, fusions.

`jit(...).lower(...).compile()` on compile-only devices computes nothing: `memory_analysis()`,
`cost_analysis()` and the optimised HLO (read by `training.run.hlo`) are what the run would execute.
A program XLA refuses for memory is `DoesNotFit`, said in one line.

What the GPU route cannot say: XLA's GPU compiler without a device skips autotuning (each matmul
becomes a Triton fusion with default tiles), cuDNN's fused attention cannot compile without a
driver, and the compiled program has no cost analysis: its FLOPs are XLA:CPU's count of the
unoptimised module, divided by the devices (`Program.flops`). Read a GPU figure from here as
the program XLA would run before autotuning.
"""

from __future__ import annotations

import dataclasses
import re
import time

import jax

from training.core.errors import RunRefused
from training.run.aot.targets import GIB, Chip, Target
from training.run.hlo import collectives, parse as parse_hlo
from training.run.hlo import counts as hlo_counts


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
