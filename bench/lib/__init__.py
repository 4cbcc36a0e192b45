"""What the bench scripts share: timing, the machine, Flax's example as the peer, sizes, FLOP counts, workloads.

Every other module in bench/ is a script that imports this package (and the project's packages), never
another script; the names they use are importable from here (`from bench.lib import median_ms`). Its
module-level imports are the standard library and NumPy only: bench/torch_sdpa.py imports it under a Python
that has torch but not JAX, and bench/flax_wmt_step.py and bench/flax_wmt_decode.py under the peer's
interpreter, which need not have this project's other dependencies; the helpers that need JAX or the project
import them where they run.
"""

from bench.lib.child import CPU_CLOCK_SHIM, ROOT, run_json_script
from bench.lib.flax_example import STUB_ENV, add_peer_arguments, flax_wmt_dir, import_flax_example
from bench.lib.flops import HLO_DTYPES, compiled_flops, dot_seconds, hlo_dots, matmul_flops_per_s
from bench.lib.sizes import PEER_LENGTH, PEER_SIZES, SIZES, TOY, VOCAB
from bench.lib.timing import CLOCKS, cpu_description, median_ms, median_seconds, releases
from bench.lib.tiny_preset import TINY_MODEL, LogLines, tiny_preset
from bench.lib.workloads import (
    Ours,
    OursDecode,
    corpus_vocab,
    no_logits_barrier,
    our_config,
    parse_variant,
    run_peer,
    synthetic_batch,
    with_fields,
)

__all__ = [
    "CLOCKS",
    "CPU_CLOCK_SHIM",
    "HLO_DTYPES",
    "LogLines",
    "Ours",
    "OursDecode",
    "PEER_LENGTH",
    "PEER_SIZES",
    "ROOT",
    "SIZES",
    "STUB_ENV",
    "TINY_MODEL",
    "TOY",
    "VOCAB",
    "add_peer_arguments",
    "compiled_flops",
    "corpus_vocab",
    "cpu_description",
    "dot_seconds",
    "flax_wmt_dir",
    "hlo_dots",
    "import_flax_example",
    "matmul_flops_per_s",
    "median_ms",
    "median_seconds",
    "no_logits_barrier",
    "our_config",
    "parse_variant",
    "releases",
    "run_json_script",
    "run_peer",
    "synthetic_batch",
    "tiny_preset",
    "with_fields",
]
