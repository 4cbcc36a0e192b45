"""A sweep planned before it is booked: every point's train step compiled for a target, nothing trained.

`plan` compiles each value of a sweep config (one seed: seeds share every shape) for a TPU or GPU target
with `training.run.aot` and reports, per point, the memory a device needs, its share of the chip, the
FLOPs of one step, and how many points one device could hold at once: `floor(0.95 * HBM / needs)`,
the 95 % the local launcher splits between `--points_per_device` processes (`launch.slot_environments`;
that launcher shares GPUs and CPUs: on a GPU the figure is the flag to pass, on a TPU it says what memory
allows, not a flag to pass). The compiles, minutes a point for a large model, are counted on a bar (on a terminal).

`plan_stacked` (`sweep.py plan --stack_seeds S`) plans what `sweep.py run --stack_seeds S` trains instead: each
point's seeds S at a time as one program (`training.parallel.stacked`) laid over every device of the target on
a (seed, data) mesh, the only way a multi-chip TPU host runs the Table 3 points. Per point: memory a device, the
collectives (none should cross seeds), the compile's seconds and the roofline of one stacked step (a GPU's
kernels at its target config's rates, a TPU's cost analysis at the chip's vendor peaks); then the sweep's
device-hours at that roofline, a lower bound from the compiler, not a measurement. A stack that does not fit a
device, that would leave devices idle, or of a bucketed config, is refused in its row.
"""

from __future__ import annotations

import math
import re
from types import ModuleType

import numpy as np

from training.core.markdown import markdown_table
from training.core.progress import Bar
from training.parallel import sharding, stacked
from training.run import aot, kernels
from training.run.hlo import COLLECTIVES, parse as parse_hlo

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


# --- seeds stacked: `sweep.py plan --stack_seeds S` ------------------------------------------------------------


def stack_sizes(seeds: int, stack: int) -> dict[int, int]:
    """{seeds a stack: stacks a point} of a point's `seeds` run `stack` at a time (`schema.stacks`: every stack full
    but perhaps the last)."""
    for flag, value in (("--seeds", seeds), ("--stack_seeds", stack)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{flag} must be a positive int, got {value!r}")
    sizes: dict[int, int] = {}
    for start in range(0, seeds, stack):
        size = min(stack, seeds - start)
        sizes[size] = sizes.get(size, 0) + 1
    return sizes


def plan_stacked(
    module: ModuleType,
    target: aot.Target,
    stack: int,
    seeds: int = 3,
    steps: int | None = None,
    devices=None,
) -> list[dict]:
    """Each point's train step with its seeds stacked (`training.parallel.stacked`) over `target`'s devices, as
    `sweep.py run --seeds SEEDS --stack_seeds STACK` trains it there: a row per point and stack size (a point's
    last stack holds fewer seeds where STACK does not divide SEEDS). A row: {point, seeds (a stack), stacks (a
    point), steps (`steps`, else the point's num_train_steps), mesh, needs_bytes, hbm_share, collectives ({op:
    (count, across seeds or None where unread)}), roofline_s (one stacked step: `roofline_s`), compile_s, refused
    (one line, or None)}."""
    sizes = stack_sizes(seeds, stack)
    if steps is not None and (not isinstance(steps, int) or isinstance(steps, bool) or steps < 1):
        raise ValueError(f"--steps must be a positive int, got {steps!r}")
    devices = aot.compile_only_devices(target) if devices is None else devices
    gpu = target.chip.target_config if target.chip.platform == "cuda" else None
    rates = kernels.Rates.from_target_config((aot.GPU_TARGETS / gpu).read_text()) if gpu else None
    rows: list[dict] = []
    total = len(module.SWEEP_VALUES) * len(sizes)
    with Bar(total=total, desc="[plan] compiling", unit="stack") as bar:  # minutes a compile for a large model
        for value in module.SWEEP_VALUES:
            point = f"{module.SWEEP_KEY}={value}"
            config = module.get_config(point)
            for size, count in sizes.items():
                bar.set_postfix_str(f"{point}, {size} seeds; {sum(r['refused'] is not None for r in rows)} refused")
                row = {"point": point, "seeds": size, "stacks": count, "steps": steps or config.num_train_steps}
                rows.append({**row, **_stacked_row(config, size, target, devices, rates)})
                bar.update()
    return rows


def _stacked_row(config, size: int, target: aot.Target, devices, rates) -> dict:
    """One stack of `size` seeds compiled for `target` (`plan_stacked`'s row, less its point and counts)."""
    row = {
        "mesh": None,
        "needs_bytes": None,
        "hbm_share": None,
        "collectives": None,
        "roofline_s": None,
        "compile_s": None,
        "refused": None,
    }
    if not config.data.pack_length:
        return {**row, "refused": _BUCKETS}
    idle = stacked.idle_note(size, len(devices), aot.train_shape(config)[0])  # said in the plan, and planned
    try:
        report = aot.compile_programs(config, target, programs=("train",), devices=devices, keep_hlo=True, stack=size)[
            "train"
        ]
    except aot.DoesNotFit as refused:
        return {**row, "refused": str(refused)}
    hlo = report.pop("hlo")
    return {
        **row,
        "mesh": report["mesh"],
        "needs_bytes": report["memory_bytes"]["needed"],
        "hbm_share": report["hbm_share"],
        "collectives": seed_collectives(hlo, report["mesh"]),
        "roofline_s": roofline_s(report, hlo, target, rates),
        "compile_s": report["compile_s"],
        "refused": aot.refusal("train", report),
        "idle": idle,
    }


_BUCKETS = (
    "trains on length buckets (config.data.pack_length = 0): stacked seeds need one batch shape a step "
    "(a Table 3 sweep's PATH:packed)"
)


def roofline_s(report: dict, hlo: str, target: aot.Target, rates) -> float | None:
    """One step's roofline seconds a device: on a GPU, the compiled HLO's kernels at the card's rates
    (`kernels.profile`: each kernel max(bytes / bandwidth, FLOPs / matrix rate), summed); on a TPU,
    `aot.tpu_roofline_s` (XLA's cost analysis at the chip's vendor peaks). None where a count is missing."""
    if target.chip.platform == "cuda":
        return kernels.profile(hlo, rates)["roofline_us"] / 1e6
    return aot.tpu_roofline_s(report, target.chip)


# replica groups as XLA prints them: an iota list ([4,2]<=[8], [2,4]<=[4,2]T(1,0)), a mesh's named axes
# (mesh['seed'=4,'data'=2] {'data'}, the group varying over the braced axes), or the groups listed ({{0,1},{2,3}})
_IOTA = re.compile(r"replica_groups=\[(?P<shape>[\d,]+)\]<=\[(?P<dims>[\d,]+)\](?:T\((?P<perm>[\d,]+)\))?")
_MESH = re.compile(
    r"replica_groups=mesh\[(?P<axes>[^\]]*)\](?:<=\[(?P<dims>[\d,]+)\](?:T\((?P<perm>[\d,]+)\))?)?\s*"
    r"\{(?P<over>[^}]*)\}"
)
_LISTED = re.compile(r"replica_groups=\{(?P<groups>(?:\{[\d,]*\},?)*)\}")
_PAIRS = re.compile(r"source_target_pairs=\{(?P<pairs>(?:\{\d+,\d+\},?)*)\}")


def _iota(dims: str, perm: str | None) -> np.ndarray:
    shape = [int(d) for d in dims.split(",")]
    ids = np.arange(math.prod(shape)).reshape(shape)
    return ids.transpose([int(p) for p in perm.split(",")]) if perm else ids


def replica_groups(attributes: str, devices: int) -> list[list[int]] | None:
    """The device groups of a collective's attributes (global device ids, as `use_global_device_ids` reads them:
    a one-replica program's partitions), or of a collective-permute's source-target pairs; None where unread."""
    if found := _IOTA.search(attributes):
        shape = [int(d) for d in found["shape"].split(",")]
        return _iota(found["dims"], found["perm"]).reshape(shape).tolist()
    if found := _MESH.search(attributes):
        axes = [re.fullmatch(r"'?([^'=]+)'?=(\d+)", a.strip()) for a in found["axes"].split(",")]
        if not all(axes):
            return None
        names, sizes = [a[1] for a in axes], [int(a[2]) for a in axes]  # type: ignore[index]
        over = [o.strip().strip("'") for o in found["over"].split(",") if o.strip()]
        if any(o not in names for o in over):
            return None
        ids = (_iota(found["dims"], found["perm"]) if found["dims"] else np.arange(math.prod(sizes))).reshape(sizes)
        order = [i for i, n in enumerate(names) if n not in over] + [names.index(o) for o in over]
        return ids.transpose(order).reshape(-1, math.prod(sizes[names.index(o)] for o in over)).tolist()
    if found := _LISTED.search(attributes):
        groups = [[int(i) for i in g.split(",") if i] for g in re.findall(r"\{([\d,]*)\}", found["groups"])]
        return [g for g in groups if g] or [list(range(devices))]  # {} : every device, one group
    if found := _PAIRS.search(attributes):
        return [[int(a), int(b)] for a, b in re.findall(r"\{(\d+),(\d+)\}", found["pairs"])]
    return None


def seed_collectives(hlo: str, mesh: dict) -> dict[str, tuple[int, int | None]]:
    """{op: (count, how many cross seed shards)} of the compiled stacked step's collectives (`hlo.COLLECTIVES`; an
    async pair once, at its -start); device i of a (seed, data) `mesh` holds seed shard i // data. How many cross is
    None where a group was not read (`replica_groups`)."""
    module = parse_hlo(hlo)
    data, devices = mesh.get(sharding.DATA, 1), math.prod(mesh.values())
    found: dict[str, tuple[int, int | None]] = {op: (0, 0) for op in COLLECTIVES}
    for instruction in module.instructions():
        op = instruction.opcode.removesuffix("-start")
        if op not in found:
            continue
        count, across = found[op]
        groups = replica_groups(instruction.attributes, devices)
        crosses = None if groups is None else any(len({d // data for d in g}) > 1 for g in groups)
        found[op] = (count + 1, None if across is None or crosses is None else across + crosses)
    return found


def _collectives_cell(found: dict[str, tuple[int, int | None]] | None) -> str:
    if found is None:
        return ""
    present = {op: c for op, c in found.items() if c[0]}
    if not present:
        return "none"
    across = [c[1] for c in present.values()]
    named = ", ".join(f"{op} {n}" for op, (n, _) in present.items())
    if any(a is None for a in across):
        return f"{named} (across seeds: unread)"
    crossing = sum(a for a in across if a is not None)
    return f"{named}, {'none' if not crossing else crossing} across seeds"


def booking_hours(rows: list[dict], target: aot.Target) -> float | None:
    """Device-hours of the sweep at the compiled roofline, a lower bound: over the rows, steps x stacks a point x
    roofline seconds a stacked step x the target's devices / 3600; None where a row is refused or has no roofline."""
    if not rows or any(r["refused"] is not None or r["roofline_s"] is None for r in rows):
        return None
    return sum(r["steps"] * r["stacks"] * r["roofline_s"] for r in rows) * target.num_devices / 3600


def stacked_table(rows: list[dict], target: aot.Target, stack: int, seeds: int) -> str:
    """`plan_stacked`'s rows as a Markdown table, then the booking line (`booking_hours`)."""
    cells = []
    for r in rows:
        mesh = "" if r["mesh"] is None else " x ".join(f"{k} {v}" for k, v in r["mesh"].items())
        if r["refused"] is not None:
            cells.append([r["point"], r["seeds"], r["stacks"], f"{r['steps']:,}", mesh, f"refused: {r['refused']}"])
            cells[-1] += [""] * 4
            continue
        roofline = "n/a" if r["roofline_s"] is None else f"{1e3 * r['roofline_s']:,.3f}"
        cells.append(
            [
                r["point"],
                r["seeds"],
                r["stacks"],
                f"{r['steps']:,}",
                mesh,
                f"{r['needs_bytes'] / 2**20:,.1f}",
                f"{100 * r['hbm_share']:.1f} %",
                _collectives_cell(r["collectives"]),
                roofline,
                f"{r['compile_s']:.1f}",
            ]
        )
    titles = ["point", "seeds a stack", "stacks", "steps", "mesh", "needs MiB", "of HBM", "collectives"]
    titles += ["roofline ms a stacked step", "compile s"]
    peak, bandwidth = target.chip.peak_flops or math.nan, target.chip.hbm_bandwidth or math.nan
    how = (
        "each kernel max(bytes / bandwidth, FLOPs / matrix rate) at the card's rates (kernels.profile), the "
        "program before autotuning"
        if target.chip.platform == "cuda"
        else f"max(FLOPs / {peak / 1e12:g} TFLOP/s, bytes accessed / {bandwidth / 1e9:,.0f} GB/s) of XLA's cost "
        "analysis, the chip's vendor peaks"
    )
    head = (
        f"train step per point, --seeds {seeds} stacked {stack} at a time (ceil({seeds} / {stack}) = "
        f"{sum(stack_sizes(seeds, stack).values())} stack(s) a point), laid over {target.name}'s "
        f"{target.num_devices} device(s) ({target.chip.hbm_gib:g} GiB each); memory a device; roofline a device: "
        f"{how}"
    )
    hours = booking_hours(rows, target)
    if hours is None:
        refused = sum(r["refused"] is not None for r in rows)
        booking = (
            f"Booking: no bound; {refused} of {len(rows)} stack(s) refused"
            if refused
            else "Booking: no bound; a roofline is missing (no cost analysis)"
        )
    else:
        points = len({r["point"] for r in rows})
        stacks = sum(stack_sizes(seeds, stack).values())
        booking = (
            f"Booking: at least {hours:,.{2 if hours >= 0.1 else 6}f} device-hours of {target.name} = the sum over "
            f"{points} point(s) and their ceil({seeds} / {stack}) = {stacks} stack(s) of steps x the roofline seconds "
            f"of the stack's step x {target.num_devices} devices / 3600. A LOWER BOUND from the compiler's roofline "
            "(no launch gaps, no achieved fraction of peak, no evaluation, compiles or input), not a measurement: "
            "book more."
        )
    notes = "".join(f"\n\n{r['point']}: {r['idle']}" for r in rows if r.get("idle"))
    return head + "\n\n" + markdown_table(titles, cells, "lrrrlrrlrr") + notes + "\n\n" + booking
