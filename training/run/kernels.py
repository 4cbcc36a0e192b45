"""A compiled GPU program's kernels, read from its optimised HLO text (`training.run.hlo`): how many, of which kind,
and a roofline.

XLA's GPU compiler launches one kernel for each instruction of the entry computation (and of the
loop bodies it calls) that does work: a fusion, a custom call (cuBLAS, cuDNN), a copy, a
collective. Parameters, constants, tuples, bitcasts and other bookkeeping launch nothing.
`profile` sorts the kernels by kind and gives each a time estimate from the target's roofline:
max(bytes / memory bandwidth, FLOPs / matrix-unit rate), bytes being the kernel's operands and
result, FLOPs its dots' (2 x result elements x contracted size), the rates those of XLA's target
config of the card (training/run/gpu_targets/). Kernel launch gaps, caches and the achieved
fraction of peak are not modelled: the estimate ranks programs compiled for one card, it is not
a step time.
"""

from __future__ import annotations

import collections
import dataclasses
import re

from training.run import hlo as hlo_lib
from training.run.hlo import COLLECTIVES, Dot, Instruction, Module

# xla.PrimitiveType numbers, as the target config keys its matrix-unit rates
PRIMITIVE_TYPES = {"s8": 2, "f16": 10, "f32": 11, "f64": 12, "bf16": 16}
# instructions that launch no kernel (while / call / conditional: their bodies' instructions are counted instead)
NO_KERNEL = {
    "parameter",
    "constant",
    "get-tuple-element",
    "tuple",
    "bitcast",
    "opt-barrier",
    "after-all",
    "partition-id",
    "replica-id",
    "add-dependency",
    "domain",
    "while",
    "call",
    "conditional",
    "all-reduce-done",
    "all-gather-done",
    "collective-permute-done",
    "copy-done",
    "async-done",
    "send-done",
    "recv-done",
}


@dataclasses.dataclass(frozen=True)
class Rates:
    """A GPU's memory bandwidth (bytes/s) and matrix-unit FLOP/s by operand type, from its target config."""

    bandwidth: float
    matrix_flops: dict[str, float]

    @classmethod
    def from_target_config(cls, text: str) -> Rates:
        cores = int(re.search(r"\bcore_count:\s*(\d+)", text)[1])
        bandwidth = float(re.search(r"\bmemory_bandwidth:\s*(\d+)", text)[1])
        matrix = text[text.index("matrix_unit_description") :]
        rates = {}
        for key, clock, units, ops in re.findall(
            r"key:\s*(\d+)\s*value\s*\{\s*clock_rate_ghz:\s*([\d.]+)\s*"
            r"units_per_core:\s*(\d+)\s*ops_per_clock:\s*(\d+)",
            matrix,
        ):
            rates[int(key)] = 2 * float(clock) * 1e9 * int(units) * int(ops) * cores  # an op a multiply-add: 2 FLOPs
        return cls(bandwidth, {name: rates[number] for name, number in PRIMITIVE_TYPES.items() if number in rates})


def kernels(module: Module) -> list[Instruction]:
    """The instructions that launch a kernel: the entry computation's and those of the loops, calls and branches
    it reaches (not fusion bodies, reducers or other computations called from inside a kernel; every branch of a
    conditional is counted, as if each ran)."""
    out, queue, seen = [], [module.entry], set()
    while queue:
        name = queue.pop()
        if name in seen or name not in module.computations:
            continue
        seen.add(name)
        for instruction in module.computations[name]:
            if instruction.opcode in ("while", "call", "conditional"):
                queue += instruction.called
            elif instruction.opcode not in NO_KERNEL:
                out.append(instruction)
    return out


def dots(module: Module, name: str) -> list[Dot]:
    """The dots in computation `name` and the fusions nested in it."""
    found = []
    for instruction in module.computations.get(name, ()):
        if instruction.opcode == "dot":
            found.append(module.dot(instruction))
        for called in instruction.called:
            if called != name:
                found += dots(module, called)
    return found


def kind(instruction: Instruction, module: Module, has_dot: bool) -> str:
    """A kernel's kind: matmul, reduction, elementwise (loop), copy/transpose, collective, custom call, or its
    opcode."""
    opcode = instruction.opcode.removesuffix("-start")
    if opcode in COLLECTIVES:
        return "collective"
    if has_dot:
        return "matmul"
    if opcode == "custom-call":
        return "custom call"
    if opcode in ("copy", "transpose"):
        return "copy/transpose"
    if opcode != "fusion":
        return opcode
    called = instruction.called
    body = module.computations.get(called[0], []) if called else []
    if "kind=kInput" in instruction.attributes or any(i.opcode in ("reduce", "reduce-window") for i in body):
        return "reduction"
    if body and all(i.opcode in ("parameter", "copy", "transpose", "bitcast", "tuple") for i in body):
        return "copy/transpose"
    return "elementwise"


def profile(hlo: str, rates: Rates) -> dict:
    """The compiled module's kernels: their count, count and estimated microseconds by kind, dots by operand types,
    bytes, FLOPs and the roofline estimate in all (microseconds)."""
    module = hlo_lib.parse(hlo)
    by_kind, micros, dot_types = collections.Counter(), collections.Counter(), collections.Counter()
    total_bytes = total_flops = total_us = 0.0
    launched = kernels(module)
    for instruction in launched:
        found = [d for name in instruction.called for d in dots(module, name)]
        moved = hlo_lib.nbytes(instruction.type) + sum(
            hlo_lib.nbytes(module.types.get(o, "")) for o in instruction.operands
        )
        flops = sum(d.flops for d in found)
        compute = sum(d.flops / rates.matrix_flops.get(d.lhs.dtype, rates.matrix_flops["f32"]) for d in found)
        seconds = max(moved / rates.bandwidth, compute)
        label = kind(instruction, module, bool(found))
        by_kind[label] += 1
        micros[label] += seconds * 1e6
        dot_types.update(f"{d.lhs.dtype} x {d.rhs.dtype}" for d in found)
        total_bytes, total_flops, total_us = total_bytes + moved, total_flops + flops, total_us + seconds * 1e6
    return {
        "kernels": len(launched),
        "by_kind": dict(by_kind),
        "us_by_kind": dict(micros),
        "dots": dict(dot_types),
        "bytes": total_bytes,
        "flops": total_flops,
        "roofline_us": total_us,
    }
