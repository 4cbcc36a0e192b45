"""The optimised HLO text that XLA prints for a compiled program (`compiled.as_text()`), read.

It gives the module's computations and their instructions (result type, opcode, operands, the
computations each calls), the arrays of a result type and their bytes, the dots with their dimension
numbers, the collectives with their result bytes, and the fusions, custom calls and rematerialised
instructions counted. jax has no public reader of this text (the module objects behind it are
jaxlib's internals), so it is read here by hand, in one place: `training.run.aot`,
`training.run.kernels` and `bench.lib` all read it through this module.

Bytes are logical: elements times the type's width (`dtype_bytes`). A layout (`{1,0}`, a TPU's
tiling `{1,0:T(8,128)(2,1)}`) is not read, so neither tiling's padding nor a packed sub-byte layout
(`E(4)`) changes a count; a dynamic dimension (`<=8`) counts at its bound.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from collections.abc import Iterator

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")

_HEADER = re.compile(r"^(?:ENTRY )?%(?P<name>[\w.\-]+) \(.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%(?P<name>[\w.\-]+) = ")
_SHAPE = re.compile(r"\b(?P<dtype>[a-z][a-z0-9]*)\[(?P<dims>[^\]]*)\]")
_WIDTH = re.compile(r"[a-z]+(?P<bits>\d+)")
_CALLED = re.compile(r"\b(?:calls|body|condition|to_apply|true_computation|false_computation)=%(?P<name>[\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{(?P<names>[^}]*)\}")
_DOT_DIMS = re.compile(r"\b(?P<key>(?:lhs|rhs)_(?:batch|contracting)_dims)=\{(?P<dims>[\d,]*)\}")
# an instruction XLA's rematerialisation cloned to recompute a value instead of keeping it (HloInstruction::Clone's
# "remat" suffix: %fusion.3.remat, %bitcast.remat.12, %fusion.remat2)
_REMAT = re.compile(r"[\w.\-]*?\.remat\d*(?:\.\d+)?")


def dtype_bytes(dtype: str) -> int:
    """Bytes an element of an HLO type. XLA names a type by its width in bits (s32, bf16, f8e4m3fn; c64 is two
    f32): that width rounded up to whole bytes. pred is a byte, token nothing. A sub-byte type (s2, u4, f4e2m1fn)
    is one byte an element: XLA's size of its primitive type, and NumPy's (ml_dtypes') item size, an array of it
    unpacked; packing is a layout's (`E(4)`), which is not read. ValueError for a name without a width."""
    if dtype in ("pred", "token"):
        return int(dtype == "pred")
    width = _WIDTH.match(dtype)
    if width is None:
        raise ValueError(f"HLO type {dtype!r}: no width in bits in its name")
    return -(-int(width["bits"]) // 8)


@dataclasses.dataclass(frozen=True)
class Shape:
    """An array of a result type: its element type and dimensions (a dynamic one, `<=8`, at its bound)."""

    dtype: str
    dims: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return dtype_bytes(self.dtype) * math.prod(self.dims)


def _dim(text: str) -> int:
    if text.removeprefix("<=").isdigit():
        return int(text.removeprefix("<="))
    raise ValueError(f"HLO dimension {text!r}: neither a size nor a bound (<=N)")


def shapes(type_text: str) -> list[Shape]:
    """The arrays of a result type, in order: one for `bf16[8,64]{1,0}`, a tuple's members for
    `(f32[8]{0}, s32[], token[])`."""
    return [Shape(m["dtype"], tuple(_dim(d) for d in m["dims"].split(",") if d)) for m in _SHAPE.finditer(type_text)]


def nbytes(type_text: str) -> int:
    """Bytes of a result type (a tuple's members summed)."""
    return sum(shape.nbytes for shape in shapes(type_text))


@dataclasses.dataclass(frozen=True)
class Instruction:
    name: str
    type: str  # result type text: "bf16[8,64]{1,0}" or a tuple "(f32[8]{0}, ...)"
    opcode: str
    operands: tuple[str, ...]
    attributes: str  # the text after the operands: ", dimensions={1}, to_apply=%add, metadata={...}"
    computation: str

    @property
    def called(self) -> list[str]:
        """The computations it calls, in order: calls=, body=, condition=, to_apply=, true_ / false_computation=,
        then a conditional's branch_computations."""
        names = _CALLED.findall(self.attributes)
        for branches in _BRANCHES.findall(self.attributes):
            names += re.findall(r"%([\w.\-]+)", branches)
        return names


@dataclasses.dataclass(frozen=True)
class Dot:
    """A `dot` instruction's operand and result arrays and its dimension numbers, ((lhs contracting, rhs
    contracting), (lhs batch, rhs batch)) as `jax.lax.dot_general` takes them."""

    instruction: Instruction
    lhs: Shape
    rhs: Shape
    result: Shape
    dimension_numbers: tuple[tuple[tuple[int, ...], tuple[int, ...]], tuple[tuple[int, ...], tuple[int, ...]]]

    @property
    def flops(self) -> float:
        """2 x result elements x the contracted size (a multiply-add is 2 FLOPs)."""
        contracted = math.prod(self.lhs.dims[d] for d in self.dimension_numbers[0][0])
        return 2.0 * math.prod(self.result.dims) * contracted


@dataclasses.dataclass
class Module:
    """A module's computations, each its instructions in order, and the entry computation's name."""

    computations: dict[str, list[Instruction]]
    entry: str | None

    def instructions(self) -> Iterator[Instruction]:
        """Every instruction, in the text's order."""
        for instructions in self.computations.values():
            yield from instructions

    @functools.cached_property
    def types(self) -> dict[str, str]:
        """{instruction name: its result type text} (names are unique in a module)."""
        return {i.name: i.type for i in self.instructions()}

    def dot(self, instruction: Instruction) -> Dot:
        """A `dot` instruction read with its operands' arrays."""
        lhs, rhs = (shapes(self.types[name])[0] for name in instruction.operands[:2])
        dims = {
            m["key"]: tuple(int(d) for d in m["dims"].split(",") if d)
            for m in _DOT_DIMS.finditer(instruction.attributes)
        }
        numbers = (
            (dims.get("lhs_contracting_dims", ()), dims.get("rhs_contracting_dims", ())),
            (dims.get("lhs_batch_dims", ()), dims.get("rhs_batch_dims", ())),
        )
        return Dot(instruction, lhs, rhs, shapes(instruction.type)[0], numbers)

    def dots(self) -> list[Dot]:
        """Every `dot` of the module (fused ones too), in the text's order."""
        return [self.dot(i) for i in self.instructions() if i.opcode == "dot"]


def parse(hlo: str) -> Module:
    """The module of an optimised HLO text."""
    computations: dict[str, list[Instruction]] = {}
    current = entry = None
    for line in hlo.splitlines():
        if (header := _HEADER.match(line)) is not None:
            current = header["name"]
            computations[current] = []
            entry = current if line.startswith("ENTRY") else entry
            continue
        if current is None or (match := _INSTRUCTION.match(line)) is None:
            continue
        type_text, rest = _split_type(line[match.end() :])
        opcode, _, rest = rest.partition("(")
        operand_text, attributes = _split_parenthesised(rest)
        operands = tuple(re.findall(r"%([\w.\-]+)", operand_text))
        computations[current].append(
            Instruction(match["name"], type_text, opcode.strip(), operands, attributes, current)
        )
    return Module(computations, entry)


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


def _module(hlo: Module | str) -> Module:
    return parse(hlo) if isinstance(hlo, str) else hlo


def collectives(hlo: Module | str) -> dict[str, tuple[int, int]]:
    """{op: (count, result bytes a device)} for each of `COLLECTIVES`, in every computation; an async pair counts
    once, at its -start (whose result may also hold the operand)."""
    found = {op: (0, 0) for op in COLLECTIVES}
    for instruction in _module(hlo).instructions():
        op = instruction.opcode.removesuffix("-start")
        if op in found:
            count, size = found[op]
            found[op] = (count + 1, size + nbytes(instruction.type))
    return found


def counts(hlo: Module | str) -> dict[str, int]:
    """{"fusions": kernels made of fused ops, "custom_calls": ..., "rematerialized": instructions XLA cloned to
    recompute a value rather than hold it}; fusions nested inside another fusion's body are not counted (they are
    part of its kernel)."""
    module = _module(hlo)
    fusions = [i for i in module.instructions() if i.opcode == "fusion" and i.called]
    bodies = {i.called[0] for i in fusions}
    return {
        "fusions": sum(i.computation not in bodies for i in fusions),
        "custom_calls": sum(i.opcode == "custom-call" for i in module.instructions()),
        "rematerialized": sum(_REMAT.fullmatch(i.name) is not None for i in module.instructions()),
    }
