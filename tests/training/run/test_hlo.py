"""`training.run.hlo` on hand-written optimised HLO: every element type XLA prints and its bytes (worked out by hand
below), tuples and tokens, plain, tiled and packed layouts, dynamic dimensions; the collectives, fusions, custom
calls, rematerialised instructions and dots of a module; the computations an instruction calls."""

import pytest

from training.run import hlo

# name: (result type, bytes by hand). Bytes are elements x the type's width in whole bytes; a sub-byte type is one
# byte an element (XLA's size of the primitive type; ml_dtypes' item size), its packing layout E(4) not read; a
# tiled layout's padding is not counted (f32[3,5] tiled (8,128) occupies 8 x 128 x 4 bytes on a TPU: 60 here);
# a dynamic dimension <=8 counts at its bound; a token has no bytes.
TYPES = {
    "pred": ("pred[3,5]{1,0}", 15 * 1),
    "s2": ("s2[7]{0}", 7 * 1),
    "s4": ("s4[16,2]{1,0}", 32 * 1),
    "s8": ("s8[10]{0}", 10 * 1),
    "s16": ("s16[10]{0}", 10 * 2),
    "s32": ("s32[]", 1 * 4),
    "s64": ("s64[3]{0}", 3 * 8),
    "u2": ("u2[9]{0}", 9 * 1),
    "u4": ("u4[4,4]{1,0:E(4)}", 16 * 1),
    "u8": ("u8[2,2,2]{2,1,0}", 8 * 1),
    "u16": ("u16[5]{0}", 5 * 2),
    "u32": ("u32[5]{0}", 5 * 4),
    "u64": ("u64[5]{0}", 5 * 8),
    "f4e2m1fn": ("f4e2m1fn[6]{0}", 6 * 1),
    "f6e2m3fn": ("f6e2m3fn[6]{0}", 6 * 1),
    "f6e3m2fn": ("f6e3m2fn[6]{0}", 6 * 1),
    "f8e3m4": ("f8e3m4[4]{0}", 4 * 1),
    "f8e4m3": ("f8e4m3[4]{0}", 4 * 1),
    "f8e4m3fn": ("f8e4m3fn[32,32]{1,0}", 1024 * 1),
    "f8e4m3fnuz": ("f8e4m3fnuz[4]{0}", 4 * 1),
    "f8e4m3b11fnuz": ("f8e4m3b11fnuz[4]{0}", 4 * 1),
    "f8e5m2": ("f8e5m2[4]{0}", 4 * 1),
    "f8e5m2fnuz": ("f8e5m2fnuz[4]{0}", 4 * 1),
    "f8e8m0fnu": ("f8e8m0fnu[4]{0}", 4 * 1),
    "bf16": ("bf16[8,128]{1,0:T(8,128)(2,1)}", 1024 * 2),
    "f16": ("f16[<=8,4]{1,0}", 32 * 2),
    "f32": ("f32[3,5]{1,0:T(8,128)}", 15 * 4),
    "f64": ("f64[2]{0}", 2 * 8),
    "c64": ("c64[2]{0}", 2 * 8),
    "c128": ("c128[2]{0}", 2 * 16),
    "token": ("token[]", 0),
    "nested": ("(f32[2]{0}, (s8[4]{0}, token[]), pred[])", 2 * 4 + 4 * 1 + 0 + 1),
}
PARAMETERS = [name for name in TYPES if name not in ("token", "nested")]
EVERY_TYPE = (
    "HloModule every_type\n\nENTRY %main ("
    + ", ".join(f"{name}: {TYPES[name][0].split('{')[0]}" for name in PARAMETERS)
    + ") -> pred[] {\n"
    + "".join(f"  %{name} = {TYPES[name][0]} parameter({i})\n" for i, name in enumerate(PARAMETERS))
    + "  %token = token[] after-all()\n"
    + '  %nested = (f32[2]{0}, (s8[4]{0}, token[]), pred[]) custom-call(%s8, %token), custom_call_target="x"\n'
    + "  ROOT %out = pred[] constant(true)\n}\n"
)


def test_every_type_xla_prints_and_its_bytes():
    module = hlo.parse(EVERY_TYPE)
    assert module.entry == "main"
    found = {i.name: (i.type, hlo.nbytes(i.type)) for i in module.instructions() if i.name in TYPES}
    assert found == TYPES
    assert module.computations["main"][PARAMETERS.index("f8e4m3fn")].opcode == "parameter"


def test_shapes_of_tuples_layouts_and_dynamic_dimensions():
    assert hlo.shapes("(f32[2]{0}, (s8[4]{0}, token[]), pred[])") == [
        hlo.Shape("f32", (2,)),
        hlo.Shape("s8", (4,)),
        hlo.Shape("token", ()),
        hlo.Shape("pred", ()),
    ]
    assert hlo.shapes("bf16[8,128]{1,0:T(8,128)(2,1)S(1)}") == [hlo.Shape("bf16", (8, 128))]
    assert hlo.shapes("f16[<=8,4]{1,0}") == [hlo.Shape("f16", (8, 4))]
    with pytest.raises(ValueError, match="'\\?'"):
        hlo.shapes("f32[?,4]{1,0}")  # unbounded: no size to count
    with pytest.raises(ValueError, match="'opaque'"):
        hlo.nbytes("opaque[]")


def test_eight_bit_floats_are_read_whole():
    """The type name is read to its end: f8e4m3fn, not `fn` (at the 4 bytes of an unknown type)."""
    assert hlo.shapes("f8e4m3fn[32,32]{1,0}") == [hlo.Shape("f8e4m3fn", (32, 32))]
    assert [hlo.dtype_bytes(t) for t in ("f8e4m3fn", "f8e5m2", "f8e4m3b11fnuz", "f4e2m1fn")] == [1, 1, 1, 1]


MODULE = """HloModule m, entry_computation_layout={(f32[4]{0})->f32[4]{0}}

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %s = f32[] add(%x, %y)
}

%nested (q: f32[4]) -> f32[4] {
  %q = f32[4]{0} parameter(0)
  ROOT %n = f32[4]{0} negate(%q)
}

%fused_computation (p: f32[4]) -> f32[4] {
  %p = f32[4]{0} parameter(0)
  ROOT %inner = f32[4]{0} fusion(%p), kind=kLoop, calls=%nested
}

%fused_dot (a: bf16[2,4,8], b: bf16[2,8,16]) -> f32[2,4,16] {
  %a = bf16[2,4,8]{2,1,0} parameter(0)
  %b = bf16[2,8,16]{2,1,0} parameter(1)
  ROOT %d = f32[2,4,16]{2,1,0} dot(%a, %b), lhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_batch_dims={0}, \
rhs_contracting_dims={1}
}

%body (t: (s32[], f32[4])) -> (s32[], f32[4]) {
  %t = (s32[], f32[4]{0}) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %v = f32[4]{0} get-tuple-element(%t), index=1
  %sum = f32[4]{0} all-reduce(%v), replica_groups={{0,1}}, to_apply=%add
  ROOT %next = (s32[], f32[4]{0}) tuple(%i, %sum)
}

%cond (c: (s32[], f32[4])) -> pred[] {
  %c = (s32[], f32[4]{0}) parameter(0)
  ROOT %k = pred[] constant(false)
}

%left (l: f32[4]) -> f32[4] {
  ROOT %l = f32[4]{0} parameter(0)
}

%right (r: f32[4]) -> f32[4] {
  ROOT %r = f32[4]{0} parameter(0)
}

ENTRY %main (arg: f32[4], lhs: bf16[2,4,8], rhs: bf16[2,8,16]) -> f32[4] {
  %arg = f32[4]{0} parameter(0)
  %lhs = bf16[2,4,8]{2,1,0} parameter(1)
  %rhs = bf16[2,8,16]{2,1,0} parameter(2)
  %fusion = f32[4]{0} fusion(%arg), kind=kLoop, calls=%fused_computation
  %fusion.remat = f32[4]{0} fusion(%arg), kind=kLoop, calls=%fused_computation
  %mm = f32[2,4,16]{2,1,0} fusion(%lhs, %rhs), kind=kCustom, calls=%fused_dot
  %ars = (f32[4]{0}, f32[4]{0}) all-reduce-start(%fusion), replica_groups={{0,1}}, to_apply=%add
  %ard = f32[4]{0} all-reduce-done(%ars)
  %ag = (bf16[4,4,8]{2,1,0}, f8e4m3fn[8]{0}) all-gather(%lhs, %arg), replica_groups={{0,1}}, dimensions={0}
  %rs = f32[2]{0} reduce-scatter(%ard), replica_groups={{0,1}}, dimensions={0}, to_apply=%add
  %a2a = f32[4]{0} all-to-all(%rs), replica_groups={{0,1}}, dimensions={0}
  %cp = f32[4]{0:T(256)} collective-permute(%a2a), source_target_pairs={{0,1},{1,0}}
  %rag = f32[4]{0} ragged-all-to-all(%cp, %arg), replica_groups={{0,1}}
  %bitcast.remat.12 = f32[2,2]{1,0} bitcast(%fusion.remat)
  %cc = f32[4]{0} custom-call(%cp), custom_call_target="x"
  %zero = s32[] constant(0)
  %init = (s32[], f32[4]{0}) tuple(%zero, %cc)
  %loop = (s32[], f32[4]{0}) while(%init), condition=%cond, body=%body
  %which = s32[] constant(1)
  %pick = f32[4]{0} conditional(%which, %arg, %arg), branch_computations={%left, %right}
  ROOT %fusion.remat2 = f32[4]{0} fusion(%pick), kind=kLoop, calls=%fused_computation
}
"""


def test_collectives_counted_once_an_async_pair_with_their_result_bytes():
    found = hlo.collectives(MODULE)
    assert found == {
        "all-reduce": (2, (4 + 4) * 4 + 4 * 4),  # the -start's tuple result, then the loop body's
        "all-gather": (1, 4 * 4 * 8 * 2 + 8 * 1),
        "reduce-scatter": (1, 2 * 4),
        "all-to-all": (1, 4 * 4),  # ragged-all-to-all is not one of COLLECTIVES
        "collective-permute": (1, 4 * 4),
    }
    assert hlo.collectives(hlo.parse(MODULE)) == found


def test_fusions_outside_fusion_bodies_custom_calls_and_rematerialised_instructions():
    # fusions: %fusion, %fusion.remat, %mm, %fusion.remat2 (not %inner, inside %fused_computation)
    assert hlo.counts(MODULE) == {"fusions": 4, "custom_calls": 1, "rematerialized": 3}


def test_dots_with_their_dimension_numbers_and_flops():
    (dot,) = hlo.parse(MODULE).dots()
    assert (dot.lhs, dot.rhs, dot.result) == (
        hlo.Shape("bf16", (2, 4, 8)),
        hlo.Shape("bf16", (2, 8, 16)),
        hlo.Shape("f32", (2, 4, 16)),
    )
    assert dot.dimension_numbers == (((2,), (1,)), ((0,), (0,)))
    assert dot.flops == 2 * (2 * 4 * 16) * 8 and dot.instruction.computation == "fused_dot"


def test_the_computations_an_instruction_calls():
    module = hlo.parse(MODULE)
    by_name = {i.name: i for i in module.instructions()}
    assert by_name["loop"].called == ["cond", "body"]
    assert by_name["pick"].called == ["left", "right"]
    assert by_name["sum"].called == ["add"] and by_name["mm"].called == ["fused_dot"]
    assert by_name["ars"].operands == ("fusion",) and by_name["ag"].type.startswith("(bf16[4,4,8]")
    assert list(module.computations)[-1] == module.entry == "main"
