"""`training.run.kernels` on a hand-written optimised module: which instructions launch kernels, their kinds, bytes,
FLOPs and roofline, worked out by hand; and the rates it reads from a GPU target config (an H100 SXM's, as NVIDIA
states them: 3.35 TB/s, 989 dense bf16 TFLOP/s)."""

import pytest

from training.run import aot, kernels

HLO = """HloModule m

%gemm (p0: bf16[4,8], p1: bf16[8,16]) -> f32[4,16] {
  %p0 = bf16[4,8]{1,0} parameter(0)
  %p1 = bf16[8,16]{1,0} parameter(1)
  ROOT %d = f32[4,16]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%sum (q: f32[4,16]) -> f32[4] {
  %q = f32[4,16]{1,0} parameter(0)
  %z = f32[] constant(0)
  ROOT %r = f32[4]{0} reduce(%q, %z), dimensions={1}, to_apply=%add
}

%relu (x: f32[4,16]) -> f32[4,16] {
  %x = f32[4,16]{1,0} parameter(0)
  %zero = f32[] constant(0)
  %zeros = f32[4,16]{1,0} broadcast(%zero), dimensions={}
  ROOT %m = f32[4,16]{1,0} maximum(%x, %zeros)
}

ENTRY %main (a: bf16[4,8], b: bf16[8,16]) -> (f32[4,16], f32[4]) {
  %a = bf16[4,8]{1,0} parameter(0)
  %b = bf16[8,16]{1,0} parameter(1)
  %mm = f32[4,16]{1,0} fusion(%a, %b), kind=kCustom, calls=%gemm
  %act = f32[4,16]{1,0} fusion(%mm), kind=kLoop, calls=%relu
  %red = f32[4]{0} fusion(%act), kind=kInput, calls=%sum
  %view = f32[64]{0} bitcast(%act)
  ROOT %out = (f32[4,16]{1,0}, f32[4]{0}) tuple(%act, %red)
}
"""
RATES = kernels.Rates(bandwidth=1e9, matrix_flops={"bf16": 1e9, "f32": 1e9})


def test_kernels_kinds_bytes_and_flops_of_a_hand_written_module():
    found = kernels.profile(HLO, RATES)
    assert found["kernels"] == 3  # the three fusions; parameters, the bitcast and the tuple launch nothing
    assert found["by_kind"] == {"matmul": 1, "elementwise": 1, "reduction": 1}
    assert found["dots"] == {"bf16 x bf16": 1}
    assert found["flops"] == 2 * 4 * 16 * 8
    moved = (4 * 8 * 2 + 8 * 16 * 2 + 4 * 16 * 4) + (4 * 16 * 4 * 2) + (4 * 16 * 4 + 4 * 4)
    assert found["bytes"] == moved
    # each kernel max(bytes / 1 GB/s, FLOPs / 1 GFLOP/s): the matmul's 1024 FLOPs beat its 576 bytes
    assert found["roofline_us"] == pytest.approx(1e6 * (1024 / 1e9 + 512 / 1e9 + 272 / 1e9))


def test_the_rates_of_an_h100_sxm_from_its_target_config():
    rates = kernels.Rates.from_target_config((aot.GPU_TARGETS / "h100_sxm.txtpb").read_text())
    assert rates.bandwidth == pytest.approx(3.35e12, rel=0.01)
    assert rates.matrix_flops["bf16"] == pytest.approx(989e12, rel=0.01)
