"""`bench.code_choices`: each variant takes out exactly the choice it names."""

import jax.numpy as jnp

from backends import xla_cpu, xla_cpu_bf16
from bench import code_choices


def test_the_flipped_matmul_is_the_one_auto_did_not_choose():
    assert code_choices.flipped({"dot_general": "flipped"}, "float32") == {
        "dot_general": xla_cpu_bf16.row_major_dot_general
    }
    assert code_choices.flipped({"dot_general": "flipped"}, "bfloat16") == {"dot_general": None}
    assert code_choices.flipped({"dropout_keep": None}, "float32") == {"dropout_keep": None}


def test_no_barriers_keeps_the_cpu_formulation_but_its_barrier():
    tree = (jnp.ones(3), jnp.zeros(2))
    assert code_choices.NoBarriers().materialize(tree) is tree
    assert isinstance(code_choices.NoBarriers(), xla_cpu.XlaCpuFormulation)
    assert set(code_choices.DECODE_VARIANTS) == {"as chosen", "matmul flipped", "no barriers", "no logits barrier"}
