"""Ahead-of-time compilation: a run's programs compiled for an accelerator this machine does not have.

`targets` names the chips and gives JAX's compile-only devices for a target, `compiled` compiles one
program and reports XLA's account of it, `programs` builds a config's train, eval, decode and beam
programs and compiles them, and `fit` searches the largest batch a device holds. Their public names
are re-exported here, so `from training.run import aot` reaches them all; the HLO is read by
`training.run.hlo` (`aot.collectives`, `aot.hlo_counts`).
"""

from training.run.aot.compiled import PROGRAM_NAMES, DoesNotFit, Program, program_report, refusal, tpu_roofline_s
from training.run.aot.fit import ROWS_GRANULARITY, largest_rows, shrinks_note
from training.run.aot.programs import (
    BEAM_SIZE,
    PROGRAMS,
    compile_programs,
    decode_shape_of,
    eval_shape_of,
    train_shape,
)
from training.run.aot.targets import (
    CHIPS,
    GIB,
    GPU_TARGETS,
    HBM_SOURCES,
    LIBTPU_ENVIRONMENT,
    Chip,
    Target,
    compile_only_devices,
    has_cuda_compiler,
    has_libtpu,
    parse_mesh,
    parse_target,
)
from training.run.hlo import collectives
from training.run.hlo import counts as hlo_counts  # aot.hlo_counts, as bench/aot.py names it

__all__ = [
    "BEAM_SIZE",
    "CHIPS",
    "GIB",
    "GPU_TARGETS",
    "HBM_SOURCES",
    "LIBTPU_ENVIRONMENT",
    "PROGRAMS",
    "PROGRAM_NAMES",
    "ROWS_GRANULARITY",
    "Chip",
    "DoesNotFit",
    "Program",
    "Target",
    "collectives",
    "compile_only_devices",
    "compile_programs",
    "decode_shape_of",
    "eval_shape_of",
    "has_cuda_compiler",
    "has_libtpu",
    "hlo_counts",
    "largest_rows",
    "parse_mesh",
    "parse_target",
    "program_report",
    "refusal",
    "shrinks_note",
    "tpu_roofline_s",
    "train_shape",
]
