"""A compiled GPU program's kernels, read from its optimised HLO text: how many, of which kind, and a roofline.

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
import math
import re

# bytes an element, by HLO type name
DTYPE_BYTES = {
    "pred": 1,
    "s8": 1,
    "u8": 1,
    "s4": 1,
    "u4": 1,
    "f8e4m3fn": 1,
    "f8e5m2": 1,
    "bf16": 2,
    "f16": 2,
    "s16": 2,
    "u16": 2,
    "f32": 4,
    "s32": 4,
    "u32": 4,
    "f64": 8,
    "s64": 8,
    "u64": 8,
    "c64": 8,
    "c128": 16,
}
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
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")

_HEADER = re.compile(r"^(?:ENTRY )?%(?P<name>[\w.\-]+) \(.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%(?P<name>[\w.\-]+) = ")
_SHAPE = re.compile(r"(?P<dtype>[a-z]+\d*(?:e\d+m\d+\w*)?)\[(?P<dims>[\d,]*)\]")
_BRANCHES = re.compile(r"branch_computations=\{(?P<names>[^}]*)\}")
_CALLED = re.compile(r"\b(?:calls|body|condition|to_apply|true_computation|false_computation)=%(?P<name>[\w.\-]+)")


@dataclasses.dataclass(frozen=True)
class Instruction:
    name: str
    type: str  # result type text: "bf16[8,64]{1,0}" or a tuple "(f32[8]{0}, ...)"
    opcode: str
    operands: tuple[str, ...]
    attributes: str
    computation: str


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


def parse(hlo: str) -> dict[str, list[Instruction]]:
    """{computation name: its instructions in order}; the entry computation is also under "ENTRY"."""
    computations, current, entry = {}, None, None
    for line in hlo.splitlines():
        if (header := _HEADER.match(line)) is not None:
            current = header["name"]
            computations[current] = []
            entry = current if line.startswith("ENTRY") else entry
            continue
        if current is None or (match := _INSTRUCTION.match(line)) is None:
            continue
        rest = line[match.end() :]
        type_text, rest = _split_type(rest)
        opcode, _, rest = rest.partition("(")
        operand_text, attributes = _split_parenthesised(rest)
        operands = tuple(re.findall(r"%([\w.\-]+)", operand_text))
        computations[current].append(
            Instruction(match["name"], type_text, opcode.strip(), operands, attributes, current)
        )
    if entry is not None:
        computations["ENTRY"] = computations[entry]
    return computations


def _split_type(text: str) -> tuple[str, str]:
    """('(f32[2]{0}, bf16[3]{0})', 'fusion(...) ...') from the text after '= '."""
    if not text.startswith("("):
        type_text, _, rest = text.partition(" ")
        return type_text, rest
    depth = 0
    for i, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0:
            return text[: i + 1], text[i + 1 :].lstrip()
    return text, ""


def _split_parenthesised(text: str) -> tuple[str, str]:
    """(the operand list, the attributes after it) from the text after an opcode's '('."""
    depth = 1
    for i, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0:
            return text[:i], text[i + 1 :]
    return text, ""


def nbytes(type_text: str) -> int:
    """Bytes of a result type (a tuple's members summed)."""
    return sum(
        DTYPE_BYTES.get(m["dtype"], 4) * math.prod(int(d) for d in m["dims"].split(",") if d)
        for m in _SHAPE.finditer(type_text)
    )


def _dims(type_text: str) -> tuple[str, list[int]]:
    match = _SHAPE.search(type_text)
    return match["dtype"], [int(d) for d in match["dims"].split(",") if d]


def kernels(computations: dict[str, list[Instruction]]) -> list[Instruction]:
    """The instructions that launch a kernel: the entry computation's and those of the loops, calls and branches
    it reaches (not fusion bodies, reducers or other computations called from inside a kernel; every branch of a
    conditional is counted, as if each ran)."""
    out, queue, seen = [], ["ENTRY"], set()
    while queue:
        name = queue.pop()
        if name in seen or name not in computations:
            continue
        seen.add(name)
        for instruction in computations[name]:
            if instruction.opcode in ("while", "call", "conditional"):
                queue += _CALLED.findall(instruction.attributes)
                for branches in _BRANCHES.findall(instruction.attributes):
                    queue += re.findall(r"%([\w.\-]+)", branches)
            elif instruction.opcode not in NO_KERNEL:
                out.append(instruction)
    return out


def dots(computations: dict[str, list[Instruction]], name: str, types: dict[str, str]) -> list[tuple[str, str, float]]:
    """[(lhs dtype, rhs dtype, FLOPs)] of the dots in computation `name` and the fusions nested in it."""
    found = []
    for instruction in computations.get(name, ()):
        if instruction.opcode == "dot":
            lhs_dtype, lhs_dims = _dims(types[instruction.operands[0]])
            rhs_dtype, _ = _dims(types[instruction.operands[1]])
            contracting = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", instruction.attributes)[1]
            size = math.prod(lhs_dims[int(d)] for d in contracting.split(",") if d)
            found.append((lhs_dtype, rhs_dtype, 2.0 * math.prod(_dims(instruction.type)[1]) * size))
        for called in _CALLED.findall(instruction.attributes):
            if called != name:
                found += dots(computations, called, types)
    return found


def kind(instruction: Instruction, computations: dict[str, list[Instruction]], has_dot: bool) -> str:
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
    called = _CALLED.search(instruction.attributes)
    body = computations.get(called["name"], []) if called else []
    if "kind=kInput" in instruction.attributes or any(i.opcode in ("reduce", "reduce-window") for i in body):
        return "reduction"
    if body and all(i.opcode in ("parameter", "copy", "transpose", "bitcast", "tuple") for i in body):
        return "copy/transpose"
    return "elementwise"


def profile(hlo: str, rates: Rates) -> dict:
    """The compiled module's kernels: their count, count and estimated microseconds by kind, dots by operand types,
    bytes, FLOPs and the roofline estimate in all (microseconds)."""
    computations = parse(hlo)
    types = {i.name: i.type for instructions in computations.values() for i in instructions}
    by_kind, micros, dot_types = collections.Counter(), collections.Counter(), collections.Counter()
    total_bytes = total_flops = total_us = 0.0
    launched = kernels(computations)
    for instruction in launched:
        called = _CALLED.findall(instruction.attributes)
        found = [d for name in called for d in dots(computations, name, types)]
        moved = nbytes(instruction.type) + sum(nbytes(types.get(o, "")) for o in instruction.operands)
        flops = sum(f for _, _, f in found)
        compute = sum(f / rates.matrix_flops.get(lhs, rates.matrix_flops["f32"]) for lhs, _, f in found)
        seconds = max(moved / rates.bandwidth, compute)
        label = kind(instruction, computations, bool(found))
        by_kind[label] += 1
        micros[label] += seconds * 1e6
        dot_types.update(f"{lhs} x {rhs}" for lhs, rhs, _ in found)
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
