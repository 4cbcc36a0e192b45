"""A sweep planned before it is booked: every point's train step compiled for a target, nothing trained.

`plan` compiles each value of a sweep config (one seed: seeds share every shape) for a TPU or GPU target
with `training.run.aot` and reports, per point, the memory a device needs, its share of the chip, the
FLOPs of one step, and how many points one device could hold at once: `floor(0.95 * HBM / needs)`,
the 95 % the local launcher splits between `--points_per_device` processes (`launch.slot_environments`;
that launcher shares GPUs and CPUs: on a GPU the figure is the flag to pass, on a TPU it says what memory
allows, not a flag to pass). The compiles, minutes a point for a large model, are counted on a bar (on a terminal).
"""

from __future__ import annotations

import math
from types import ModuleType

from training.core.markdown import markdown_table
from training.core.progress import Bar
from training.run import aot

SHARED_FRACTION = 0.95  # of a device's memory, split between the points sharing it (sweep.slot_environments)


def plan(module: ModuleType, target: aot.Target, data: int = -1, model: int = 1, devices=None) -> list[dict]:
    """[{point, needs_bytes, hbm_share, flops, points_per_device, compile_s, refused}], one per sweep value."""
    devices = aot.compile_only_devices(target) if devices is None else devices
    rows: list[dict] = []
    with Bar(total=len(module.SWEEP_VALUES), desc="[plan] compiling", unit="point") as bar:  # minutes a point
        for value in module.SWEEP_VALUES:
            point = f"{module.SWEEP_KEY}={value}"
            bar.set_postfix_str(f"{point}; {sum(r['refused'] is not None for r in rows)} refused so far")
            rows.append(_row(module, point, target, data, model, devices))
            bar.update()
    return rows


def _row(module: ModuleType, point: str, target: aot.Target, data: int, model: int, devices) -> dict:
    """One point's row of `plan`: its train step compiled for `target`."""
    try:
        report = aot.compile_programs(
            module.get_config(point), target, data, model, programs=("train",), devices=devices
        )["train"]
    except aot.DoesNotFit as refused:
        return {
            "point": point,
            "needs_bytes": None,
            "hbm_share": None,
            "flops": None,
            "points_per_device": 0,
            "compile_s": None,
            "refused": str(refused),
        }
    needs = report["memory_bytes"]["needed"]
    return {
        "point": point,
        "needs_bytes": needs,
        "hbm_share": report["hbm_share"],
        "flops": report["flops"],
        "points_per_device": math.floor(SHARED_FRACTION * target.chip.hbm_gib * aot.GIB / needs),
        "compile_s": report["compile_s"],
        "refused": aot.refusal("train", report),
    }


def table(rows: list[dict], target: aot.Target) -> str:
    """The plan as a Markdown table (memory in MiB a device)."""
    cells = []
    for r in rows:
        if r["needs_bytes"] is None:
            cells.append([r["point"], f"refused: {r['refused']}", "", "", 0, ""])
            continue
        flops = "n/a" if r["flops"] is None else f"{r['flops'] / 1e9:,.1f}"
        share, per_device = f"{100 * r['hbm_share']:.1f} %", r["points_per_device"]
        cells.append(
            [r["point"], f"{r['needs_bytes'] / 2**20:,.1f}", share, flops, per_device, f"{r['compile_s']:.1f}"]
        )
    titles = ["point", "needs MiB", "of HBM", "GFLOP a step / device", "points a device", "compile s"]
    return (
        f"train step per point on {target.name} ({target.chip.hbm_gib:g} GiB a device); points a device: "
        f"floor({SHARED_FRACTION} x HBM / needs)\n\n" + markdown_table(titles, cells, "lrrrrr")
    )
