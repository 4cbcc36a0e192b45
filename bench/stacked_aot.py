"""A point's seeds stacked into one train step, compiled for an H100 and a TPU v5e-8 on this CPU: no device needed.

    python -m bench.stacked_aot [--config configs/default.py] [--stacks 1,4,8,16] [--gpu cuda:h100]
        [--tpu tpu:v5e:2x4] [--md results/stacked.md]

For one GPU: the run's own train step (today's trainer, one seed) and the step of S seeds stacked
(`training.parallel.stacked`: the state on a leading seed axis, the step vmapped), each compiled through the
CUDA plugin's deviceless route (the program before autotuning) and read by `training.run.kernels.profile`:
kernels launched, kernels and roofline microseconds a seed (each kernel max(bytes / bandwidth, FLOPs / matrix
rate), the card's rates), and the memory the program needs. For a TPU host: S seeds laid over its chips on
the mesh's seed axis (libtpu's compile-only devices): memory a chip and the collectives (none crosses seeds).
Compiled, not run: the figures are the compiler's, not a measurement.
"""

from __future__ import annotations

import argparse
import copy
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # read when JAX is imported: the host compiles, no GPU backend is tried

from bench.lib import releases
from training.core.markdown import markdown_table
from training.run import aot, kernels

MIB = 2**20


def gpu_rows(config, target: aot.Target, stacks: list[int]) -> list[dict]:
    """Today's one-seed step, then each stack size, compiled for `target` (one GPU)."""
    rates = kernels.Rates.from_target_config((aot.GPU_TARGETS / target.chip.target_config).read_text())
    rows = []
    for stack in [0, *stacks]:
        report = aot.compile_programs(copy.deepcopy(config), target, programs=("train",), keep_hlo=True, stack=stack)
        found = kernels.profile(report["train"].pop("hlo"), rates)
        seeds = max(stack, 1)
        rows.append(
            {
                "step": "one run (today's trainer)" if stack == 0 else f"{stack} stacked",
                "seeds": seeds,
                "kernels": found["kernels"],
                "kernels_per_seed": found["kernels"] / seeds,
                "roofline_us_per_seed": found["roofline_us"] / seeds,
                "needed_mib": report["train"]["memory_bytes"]["needed"] / MIB,
                "temp_mib": report["train"]["memory_bytes"]["temp"] / MIB,
                "compile_s": report["train"]["compile_s"],
            }
        )
    return rows


def tpu_row(config, target: aot.Target, stack: int) -> dict:
    """`stack` seeds laid over `target`'s chips: memory a chip, the collectives."""
    report = aot.compile_programs(copy.deepcopy(config), target, programs=("train",), stack=stack)["train"]
    return {
        "target": target.name,
        "seeds": stack,
        "mesh": report["mesh"],
        "needed_mib": report["memory_bytes"]["needed"] / MIB,
        "hbm_share": report["hbm_share"],
        "collectives": report["collectives"],
        "compile_s": report["compile_s"],
    }


def markdown(config_name: str, gpu: aot.Target, rows: list[dict], tpu: list[dict]) -> str:
    base = rows[0]
    headers = ["step", "seeds", "kernels", "kernels a seed", "÷ one run's", "roofline µs a seed", "÷ one run's"]
    cells = [
        [
            r["step"],
            r["seeds"],
            r["kernels"],
            f"{r['kernels_per_seed']:.0f}",
            f"{r['kernels_per_seed'] / base['kernels_per_seed']:.2f}",
            f"{r['roofline_us_per_seed']:.0f}",
            f"{r['roofline_us_per_seed'] / base['roofline_us_per_seed']:.2f}",
            f"{r['needed_mib']:,.0f}",
            f"{r['temp_mib']:,.0f}",
            f"{r['compile_s']:.0f}",
        ]
        for r in rows
    ]
    lines = [
        f"`{config_name}`'s train step compiled for {gpu.name} on this CPU (deviceless: the program before "
        f"autotuning){releases()}",
        "",
        markdown_table([*headers, "needs MiB", "temp MiB", "compile s"], cells, "lrrrrrrrrr"),
    ]
    if tpu:
        headers = ["TPU target", "seeds", "mesh", "needs MiB a chip", "of HBM", "collectives", "compile s"]
        cells = [
            [
                t["target"],
                t["seeds"],
                t["mesh"],
                f"{t['needed_mib']:,.0f}",
                f"{t['hbm_share']:.1%}",
                ", ".join(f"{op} {n}" for op, n in t["collectives"].items() if n) or "none",
                f"{t['compile_s']:.0f}",
            ]
            for t in tpu
        ]
        lines += ["", markdown_table(headers, cells, "lrlrrlr")]
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/default.py", help="config file (path[:args])")
    parser.add_argument("--stacks", default="1,4,8,16", help="stack sizes to compile for the GPU")
    parser.add_argument("--gpu", default="cuda:h100")
    parser.add_argument("--tpu", default="tpu:v5e:2x4", help="'' skips the TPU host")
    parser.add_argument("--tpu_stacks", default="8", help="stack sizes to lay over the TPU host's chips")
    parser.add_argument("--md", default="", help="also write the tables here")
    args = parser.parse_args(argv)
    from sweeps.schema import import_file

    path, _, arg = args.config.partition(":")
    config = import_file(path).get_config(arg or None)
    stacks = [int(s) for s in args.stacks.split(",") if s]
    if any(s < 1 for s in stacks):
        raise SystemExit(f"--stacks {args.stacks}: expected positive stack sizes")
    gpu = aot.parse_target(args.gpu)
    rows = gpu_rows(config, gpu, stacks)
    tpu = [tpu_row(config, aot.parse_target(args.tpu), int(s)) for s in args.tpu_stacks.split(",")] if args.tpu else []
    text = markdown(args.config, gpu, rows, tpu)
    print(text)
    if args.md:
        with open(args.md, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
