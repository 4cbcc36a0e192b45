"""Our GPU train step against Flax examples/wmt's, both compiled for an H100 on this CPU: no GPU needed.

    python -m bench.peer_compiled --wmt_dir WMT [--size base --rows 512 --target cuda:h100]
        [--variant LABEL:PATH=VALUE,...]... [--md results/peer_compiled.md]

WMT as bench/peer.py takes it (default: $FLAX_WMT_DIR, else extracted from $FLAX_GIT_DIR). The peer is
the example's own `train_step` (`bench.flax_wmt_step --target_config`, its optimizer and schedule, state
donated); ours the training loop's trainer on the default config at that size (`bench.lib.our_config`:
the same slots per step, rows x 64 packed, bfloat16), compiled by `training.run.aot` with the target's
hooks. Both go through the CUDA plugin's deviceless route, so both are the programs before autotuning
(every matmul a Triton fusion with default tiles; cuDNN's fused attention cannot compile without a
driver). For each, `training.run.kernels.profile` reads the optimised HLO: kernels by kind, dots by
operand types, bytes, FLOPs, and a roofline estimate (each kernel max(bytes / bandwidth, FLOPs /
matrix rate), the rates of the card's target config). `--variant` compiles ours with config changes
too (e.g. `--variant no_clip:optimizer.grad_clip_norm=0`), each a row beside the default.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # read when JAX is imported: the host compiles, no GPU backend is tried

from bench.lib import (
    PEER_LENGTH,
    add_peer_arguments,
    flax_wmt_dir,
    our_config,
    parse_variant,
    releases,
    run_json_script,
)
from training.core.markdown import markdown_table
from training.run import aot, kernels

KINDS = ("matmul", "reduction", "elementwise", "copy/transpose", "custom call", "collective")


def ours(size: str, dtype: str, rows: int, target: aot.Target, overrides: dict) -> dict:
    """Our train step compiled for `target`: {"profile", "temp_bytes", "compile_s"}."""
    config = our_config(size, dtype, overrides)
    config.data.token_budget = rows * PEER_LENGTH
    report = aot.compile_programs(config, target, rows=rows, programs=("train",), keep_hlo=True)["train"]
    return {"hlo": report["hlo"], "temp_bytes": report["memory_bytes"]["temp"], "compile_s": report["compile_s"]}


def peer(args, target: aot.Target) -> dict:
    """The peer's train step compiled for `target`'s card (one GPU)."""
    with tempfile.TemporaryDirectory() as tmp:
        hlo = Path(tmp) / "peer.hlo"
        out = run_json_script(
            args.peer_python,
            "bench.flax_wmt_step",
            [
                "--wmt_dir",
                flax_wmt_dir(args.wmt_dir),
                "--size",
                args.size,
                "--batch",
                str(args.rows),
                "--dtype",
                args.dtype,
                "--target_config",
                str(aot.GPU_TARGETS / target.chip.target_config),
                "--hlo_out",
                str(hlo),
            ],
            clock="wall",
        )
        return {"hlo": hlo.read_text(), "temp_bytes": out["memory_bytes"]["temp"], "compile_s": out["compile_s"]}


def row(label: str, found: dict, reference: dict | None) -> list:
    """One side's cells of the main table (`reference`: the peer's profile, None for the peer's own row)."""
    p = found["profile"]
    ratios = (
        ["1.00", "1.00"]
        if reference is None
        else [f"{p['kernels'] / reference['kernels']:.2f}", f"{p['roofline_us'] / reference['roofline_us']:.2f}"]
    )
    return [
        label,
        f"{p['kernels']:,}",
        *(p["by_kind"].get(k, 0) for k in KINDS),
        p["dots"].get("f32 x f32", 0),
        *(f"{x:,.2f}" for x in (p["bytes"] / 1e9, p["flops"] / 1e12, p["roofline_us"] / 1e3)),
        f"{found['temp_bytes'] / 2**20:,.0f}",
        *ratios,
    ]


def kind_table(ours_profile: dict, peer_profile: dict) -> str:
    """Kernels and estimated ms by kind, ours against the peer's, largest difference in time first."""
    kinds = sorted(
        set(ours_profile["by_kind"]) | set(peer_profile["by_kind"]),
        key=lambda k: -abs(ours_profile["us_by_kind"].get(k, 0) - peer_profile["us_by_kind"].get(k, 0)),
    )
    sides = (ours_profile, peer_profile)
    rows = [
        [k, *(p["by_kind"].get(k, 0) for p in sides), *(f"{p['us_by_kind'].get(k, 0) / 1e3:.2f}" for p in sides)]
        for k in kinds
    ]
    return markdown_table(["kind", "kernels ours", "kernels peer", "est. ms ours", "est. ms peer"], rows, "lrrrr")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_peer_arguments(parser)
    parser.add_argument("--size", default="base", choices=("small", "base"))
    parser.add_argument("--rows", type=int, default=512, help="rows of 64 tokens a step (both sides)")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--target", default="cuda:h100")
    parser.add_argument(
        "--variant", action="append", help="ours with config changes, LABEL:PATH=VALUE,... (repeatable)"
    )
    parser.add_argument("--json", default="", help="also write the figures here")
    args = parser.parse_args(argv)
    target = aot.parse_target(args.target)
    if target.chip.platform != "cuda" or target.num_devices != 1:
        raise SystemExit(f"--target = {args.target!r}; expected one GPU, e.g. cuda:h100")
    rates = kernels.Rates.from_target_config((aot.GPU_TARGETS / target.chip.target_config).read_text())
    variants = dict(parse_variant(v) for v in ["default:", *(args.variant or [])])
    found = {"peer": peer(args, target)}
    for label, overrides in variants.items():
        found[label] = ours(args.size, args.dtype, args.rows, target, overrides)
    for side in found.values():
        side["profile"] = kernels.profile(side.pop("hlo"), rates)
    print(
        f"{args.size}, {args.dtype}, {args.rows} x {PEER_LENGTH} slots a step, "
        f"train step compiled for {target.name} on this "
        f"CPU (deviceless: before autotuning); roofline: bandwidth {rates.bandwidth / 1e12:.2f} TB/s, bf16 matrix "
        f"{rates.matrix_flops['bf16'] / 1e12:.0f} TFLOP/s, f32 {rates.matrix_flops['f32'] / 1e12:.0f}{releases()}"
    )
    print()
    titles = ["side", "kernels", *KINDS, "f32 x f32 dots", "GB moved", "TFLOP", "roofline ms", "temp MiB"]
    rows = [row("Flax examples/wmt", found["peer"], None)]
    for label in variants:
        rows.append(
            row(f"ours {label or 'default'}" if label != "default" else "ours", found[label], found["peer"]["profile"])
        )
    print(markdown_table([*titles, "kernels / peer", "roofline / peer"], rows, "lr" + "r" * (len(KINDS) + 7)))
    print()
    print(kind_table(found["default"]["profile"], found["peer"]["profile"]))
    if args.json:
        Path(args.json).write_text(json.dumps({k: {**v} for k, v in found.items()}, indent=2))


if __name__ == "__main__":
    main()
