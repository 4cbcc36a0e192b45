"""`bench.code_choices`: each variant takes out exactly the choice it names."""

import jax
import jax.numpy as jnp
import numpy as np

from backends import xla_cpu, xla_cpu_bf16
from bench import code_choices, lib


def test_the_flipped_matmul_is_the_one_auto_did_not_choose():
    assert code_choices.flipped({"dot_general": "flipped"}, "float32") == {
        "dot_general": xla_cpu_bf16.row_major_dot_general
    }
    assert code_choices.flipped({"dot_general": "flipped"}, "bfloat16") == {"dot_general": None}
    assert code_choices.flipped({"dropout_keep": None}, "float32") == {"dropout_keep": None}


def barriers(fn, *args) -> int:
    return jax.jit(fn).lower(*args).as_text().count("optimization_barrier")


def test_no_barriers_keeps_the_cpu_formulation_but_its_barrier():
    tree = (jnp.ones(3), jnp.zeros(2))
    assert code_choices.NoBarriers().materialize(tree) is tree
    assert isinstance(code_choices.NoBarriers(), xla_cpu.XlaCpuFormulation)
    assert barriers(code_choices.NoBarriers().decode_log_probs, jnp.ones((2, 5))) == 0
    assert set(code_choices.DECODE_VARIANTS) == {"as chosen", "matmul flipped", "no barriers", "no logits barrier"}


def test_no_logits_barrier_takes_out_the_decode_steps_barrier_alone():
    formulation, logits = lib.no_logits_barrier(), jnp.ones((2, 5))
    assert isinstance(formulation, xla_cpu.XlaCpuFormulation) and formulation == lib.no_logits_barrier()
    assert code_choices.DECODE_VARIANTS["no logits barrier"] == {"formulation": formulation}
    assert barriers(xla_cpu.FORMULATION.decode_log_probs, logits) == 1
    assert barriers(formulation.decode_log_probs, logits) == 0
    assert barriers(formulation.materialize, logits) == 1  # the cache writes' and beam queries' barriers stay
    np.testing.assert_array_equal(formulation.decode_log_probs(logits), xla_cpu.FORMULATION.decode_log_probs(logits))
