"""A point's seeds stacked into one train step, compiled for an H100 and TPU hosts on this CPU: no device needed.

    python -m bench.stacked_aot [--config configs/default.py] [--stacks 1,4,8,16] [--gpu cuda:h100]
        [--tpu tpu:v5e:2x4[,tpu:v4:2x2x1]] [--tpu_stacks 8] [--md results/stacked.md]
    python -m bench.stacked_aot --config configs/ablation_heads.py:h=8,packed --tpu tpu:v5e:2x4,tpu:v4:2x2x1
    python -m bench.stacked_aot --gpu '' --tpu tpu:v4:2x2x1      # TPU hosts only

For one GPU: the run's own train step (today's trainer, one seed) and the step of S seeds stacked
(`training.parallel.stacked`: the state on a leading seed axis, the step vmapped), each compiled through the
CUDA plugin's deviceless route (the program before autotuning) and read by `training.run.kernels.profile`:
kernels launched, kernels and roofline microseconds a seed (each kernel max(bytes / bandwidth, FLOPs / matrix
rate), the card's rates), and the memory the program needs. For a TPU host: S seeds laid over its chips on
the mesh's seed axis (libtpu's compile-only devices): memory a chip, the collectives (none crosses seeds) and
the step's roofline (`aot.tpu_roofline_s`: max(FLOPs / peak bfloat16 FLOP/s, bytes accessed / HBM bandwidth) of
XLA's cost analysis at the vendor's peaks), also as chip-microseconds a seed (roofline x chips / seeds).
`--config PATH:ARG` passes ARG to the config's get_config (configs/ablation_heads.py:h=8,packed: the Table 3
preset's packed reference point). Compiled, not run: the figures are the compiler's, not a measurement.
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
    """`stack` seeds laid over `target`'s chips: memory a chip, the collectives, the step's roofline."""
    report = aot.compile_programs(copy.deepcopy(config), target, programs=("train",), stack=stack)["train"]
    roofline_s = aot.tpu_roofline_s(report, target.chip)
    return {
        "target": target.name,
        "seeds": stack,
        "mesh": report["mesh"],
        "needed_mib": report["memory_bytes"]["needed"] / MIB,
        "hbm_share": report["hbm_share"],
        "collectives": report["collectives"],
        "roofline_us": None if roofline_s is None else roofline_s * 1e6,
        "chip_us_per_seed": None if roofline_s is None else roofline_s * 1e6 * target.num_devices / stack,
        "compile_s": report["compile_s"],
    }


def markdown(config_name: str, gpu: aot.Target | None, rows: list[dict], tpu: list[dict]) -> str:
    lines = []
    if gpu is not None:
        lines += [*gpu_markdown(config_name, gpu, rows), ""]
    if tpu:
        if gpu is None:
            lines += [
                f"`{config_name}`'s train step, seeds stacked, compiled for TPU hosts on this CPU (libtpu's "
                f"compile-only devices){releases()}",
                "",
            ]
        headers = ["TPU target", "seeds", "mesh", "needs MiB a chip", "of HBM", "collectives"]
        headers += ["roofline µs a step", "chip-µs a seed", "compile s"]
        cells = [
            [
                t["target"],
                t["seeds"],
                t["mesh"],
                f"{t['needed_mib']:,.0f}",
                f"{t['hbm_share']:.1%}",
                ", ".join(f"{op} {n}" for op, n in t["collectives"].items() if n) or "none",
                "n/a" if t["roofline_us"] is None else f"{t['roofline_us']:,.0f}",
                "n/a" if t["chip_us_per_seed"] is None else f"{t['chip_us_per_seed']:,.0f}",
                f"{t['compile_s']:.0f}",
            ]
            for t in tpu
        ]
        lines += [markdown_table(headers, cells, "lrlrrlrrr"), ""]
    return "\n".join(lines[:-1]) + "\n"


def gpu_markdown(config_name: str, gpu: aot.Target, rows: list[dict]) -> list[str]:
    """The GPU table and its heading line (with the releases)."""
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
    return [
        f"`{config_name}`'s train step compiled for {gpu.name} on this CPU (deviceless: the program before "
        f"autotuning){releases()}",
        "",
        markdown_table([*headers, "needs MiB", "temp MiB", "compile s"], cells, "lrrrrrrrrr"),
    ]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/default.py", help="config file (path[:args])")
    parser.add_argument("--stacks", default="1,4,8,16", help="stack sizes to compile for the GPU")
    parser.add_argument("--gpu", default="cuda:h100", help="one GPU target; '' skips the GPU table")
    parser.add_argument(
        "--tpu", default="tpu:v5e:2x4", help="TPU hosts, comma-separated (tpu:v5e:2x4,tpu:v4:2x2x1); '' skips them"
    )
    parser.add_argument("--tpu_stacks", default="8", help="stack sizes to lay over each TPU host's chips")
    parser.add_argument("--md", default="", help="also write the tables here")
    args = parser.parse_args(argv)
    from sweeps.schema import import_file

    path, _, arg = args.config.partition(":")
    config = import_file(path).get_config(arg or None)
    stacks = [int(s) for s in args.stacks.split(",") if s]
    if any(s < 1 for s in stacks):
        raise SystemExit(f"--stacks {args.stacks}: expected positive stack sizes")
    gpu = aot.parse_target(args.gpu) if args.gpu else None
    hosts = [aot.parse_target(t) for t in args.tpu.split(",") if t]
    if gpu is None and not hosts:
        raise SystemExit("--gpu '' and --tpu '': nothing to compile")
    rows = gpu_rows(config, gpu, stacks) if gpu is not None else []
    tpu = [tpu_row(config, host, int(s)) for host in hosts for s in args.tpu_stacks.split(",") if s]
    text = markdown(args.config, gpu, rows, tpu)
    print(text)
    if args.md:
        with open(args.md, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
