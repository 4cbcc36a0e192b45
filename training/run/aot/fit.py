"""The largest batch a device holds: the most training rows whose train step fits a device of a target.

Compiles are slow, so `largest_rows` draws a line through two compiles, confirms its answer and bisects
only where the line is wrong; results/aot.md shows why the line alone is not trusted.
"""

from __future__ import annotations

from training.run.aot.compiled import PROGRAM_NAMES, DoesNotFit, refusal
from training.run.aot.programs import compile_programs
from training.run.aot.targets import GIB, Target, compile_only_devices

ROWS_GRANULARITY = 8  # the largest-batch search's step: its answer is a multiple of 8, within 8 rows of the largest


def _check_search(lo: int, hi: int, granularity: int, hbm_fraction: float) -> None:
    """`largest_rows`'s arguments, or a ValueError saying which is wrong."""
    if granularity < 1 or not 0 < lo < hi or lo % granularity or hi % granularity:
        raise ValueError(
            f"largest rows: seeds lo = {lo}, hi = {hi} must be multiples of the granularity {granularity}, 0 < lo < hi"
        )
    if not 0 < hbm_fraction <= 1:
        raise ValueError(f"largest rows: hbm_fraction = {hbm_fraction}; expected a share of the chip's HBM in (0, 1]")


def _refused_entry(rows: int, stage: str, refused: DoesNotFit) -> dict:
    """`largest_rows`'s entry for a compile XLA refused."""
    return {
        "rows": rows,
        "stage": stage,
        "needed_bytes": None,
        "fits": False,
        "why": str(refused),
        "rematerialized": None,
        "compile_s": None,
    }


def _compiled_entry(rows: int, stage: str, report: dict, hbm: float, hbm_fraction: float, without_remat: bool) -> dict:
    """`largest_rows`'s entry for a compiled train step: it fits where `refusal` accepts it, its need is within
    `hbm` bytes and, `without_remat`, XLA rematerialised nothing."""
    needed = report["memory_bytes"]["needed"]
    why = refusal("train", report) or (
        None
        if needed <= hbm
        else f"{PROGRAM_NAMES['train']} needs {needed / GIB:.1f} GiB a device, over {hbm_fraction:g} of its HBM"
    )
    remat = report.get("rematerialized")
    if why is None and without_remat and remat:
        why = f"XLA rematerialised {remat} instructions to fit it"
    return {
        "rows": rows,
        "stage": stage,
        "needed_bytes": needed,
        "fits": why is None,
        "why": why,
        "rematerialized": remat,
        "compile_s": report.get("compile_s"),
    }


def _seed_line(fits, seen: dict, lo: int, hi: int, hbm: float, granularity: int) -> tuple:
    """`largest_rows`'s seeds: compiles `lo` and `hi` rows (`fits(rows, stage)` records each in `seen`), draws
    needed = a + b * rows through them and confirms the line's answer and the multiple above it.
    Returns ((a, b) or None, the line's rows or None)."""

    def measured(rows: int) -> bool:
        return rows in seen and seen[rows]["needed_bytes"] is not None

    fits(lo, "seed")
    if measured(lo):  # else XLA refused lo: no line to draw, and the answer lies below it
        fits(hi, "seed")
    line = predicted = None
    if measured(lo) and measured(hi):
        slope = (seen[hi]["needed_bytes"] - seen[lo]["needed_bytes"]) / (hi - lo)
        intercept = seen[lo]["needed_bytes"] - slope * lo
        line = (intercept, slope)
        if slope > 0:
            predicted = max(0, int((hbm - intercept) / slope) // granularity * granularity)
            if not predicted or fits(predicted, "confirm"):  # one that does not fit says the next will not
                fits(predicted + granularity, "confirm")
    return line, predicted


def _narrow(fits, seen: dict, granularity: int) -> int:
    """`largest_rows`'s search after its seeds: gallops upwards while nothing is known not to fit, then bisects
    between the largest rows that fit and the fewest that do not; returns the largest that fit (0: none)."""

    def bounds() -> tuple[int, int | None]:
        best = max((r for r, e in seen.items() if e["fits"]), default=0)
        above = [r for r, e in seen.items() if not e["fits"] and r > best]
        return best, min(above, default=None)

    best, least = bounds()
    step = granularity
    while least is None:  # nothing known not to fit: gallop upwards
        step *= 2
        fits(best + step, "search")
        best, least = bounds()
    while least - best > granularity:
        fits((best + least) // 2 // granularity * granularity, "bisect")
        best, least = bounds()
    return best


def _shrinks(compiles: list[dict]) -> list[tuple[int, int]]:
    """(fewer, more) rows of the compiles where more rows needed less memory: the search takes needed memory
    to grow with rows, so where it does not, its answer is the boundary it narrowed to, and more rows may fit."""
    measured = sorted((c["rows"], c["needed_bytes"]) for c in compiles if c["needed_bytes"] is not None)
    return [
        (fewer, more)
        for i, (fewer, need) in enumerate(measured)
        for more, more_need in measured[i + 1 :]
        if more_need < need
    ]


def shrinks_note(shrinks: list[tuple[int, int]]) -> str:
    """What `largest_rows`'s answer means where more rows needed less memory ("" where the need grew)."""
    if not shrinks:
        return ""
    pairs = ", ".join(f"{more} rows < {fewer}" for fewer, more in shrinks)
    return (
        f". Needed memory did not grow with rows in these compiles ({pairs}): the answer is where the search "
        "narrowed to, and more rows may fit"
    )


def largest_rows(
    config,
    target: Target,
    lo: int,
    hi: int,
    granularity: int = ROWS_GRANULARITY,
    data: int = -1,
    model: int = 1,
    devices=None,
    compile_fn=None,
    on_compile=None,
    hbm_fraction: float = 1.0,
    without_remat: bool = False,
) -> dict:
    """The most training rows (a multiple of `granularity`) whose train step fits a device of `target`.

    A compile fits where `memory_bytes["needed"]` <= `hbm_fraction` of the chip's HBM (1: what `refusal`
    accepts; 0.75: what a JAX process allocates of a GPU by default, XLA_PYTHON_CLIENT_MEM_FRACTION);
    one XLA refuses (`DoesNotFit`) does not; `without_remat`: nor does one where XLA rematerialised
    (`hlo_counts`): it recomputes values to make room, so that its memory stops growing with rows
    (results/aot.md), and the step does more work than the batch asks. Compiles are slow, so the search is
    seeded by a line: the train step at `lo` and `hi` rows gives needed = a + b * rows, whose largest fitting
    multiple of `granularity` is compiled (it must fit), then the next multiple above (it must not; not compiled
    where the first did not fit). Only where one of those disagrees with the line does the search
    narrow by bisection between the largest rows that fit and the fewest that do not, on multiples
    of `granularity` (doubling the step upwards while nothing above is known not to fit). Needed
    memory is taken to grow with rows; XLA's memory plan is not linear in them, nor always monotonic
    (results/aot.md): where a compile of more rows needed less, "shrinks" names the pair.

    compile_fn(config, target, data, model, rows=, programs=, devices=) -> {"train": `program_report`}
    (`compile_programs`; a test passes a fake); on_compile(entry) is called after each compile.
    Returns {"rows": the answer (0: not even `granularity` rows fit), "shrinks": the (fewer, more) row counts
    compiled where more rows needed less memory (`_shrinks`; empty where the need grew), "needed_bytes": its
    need, "hbm_bytes", "granularity", "line": (a, b) bytes or None, "predicted": the line's rows or None,
    "compiles": [entry]}, an entry being {"rows", "stage", "needed_bytes" (None where refused), "fits", "why",
    "rematerialized" (`hlo_counts`), "compile_s"}.
    """
    _check_search(lo, hi, granularity, hbm_fraction)
    compile_fn = compile_programs if compile_fn is None else compile_fn
    if devices is None and compile_fn is compile_programs:
        devices = compile_only_devices(target)
    hbm = target.chip.hbm_gib * GIB * hbm_fraction
    compiles, seen = [], {}

    def fits(rows: int, stage: str) -> bool:
        if rows in seen:
            return seen[rows]["fits"]
        try:
            report = compile_fn(config, target, data, model, rows=rows, programs=("train",), devices=devices)["train"]
        except DoesNotFit as refused:
            entry = _refused_entry(rows, stage, refused)
        else:
            entry = _compiled_entry(rows, stage, report, hbm, hbm_fraction, without_remat)
        compiles.append(entry)
        seen[rows] = entry
        if on_compile is not None:
            on_compile(entry)
        return entry["fits"]

    line, predicted = _seed_line(fits, seen, lo, hi, hbm, granularity)
    best = _narrow(fits, seen, granularity)
    return {
        "rows": best,
        "shrinks": _shrinks(compiles),
        "needed_bytes": seen[best]["needed_bytes"] if best else None,
        "hbm_bytes": hbm,
        "granularity": granularity,
        "line": line,
        "predicted": predicted,
        "compiles": compiles,
    }
