"""The significance tables of a sweep: each value against the reference (the primary table, with its verdicts)
and the sweep's named contrasts, seeds as the unit of replication.
"""

from __future__ import annotations

import statistics

from sweeps import significance
from sweeps.tables.cells import COMPARISON_ALIGN, COMPARISON_TITLES, PRIMARY, SECONDARY, comparison_cells
from sweeps.tables.paper import paper_numbers
from sweeps.tables.prose import fill
from training.core.markdown import markdown_table


def bleu_by_seed(results: list[dict], metric: str = "test_bleu") -> dict[int | str, dict[int, float]]:
    """Each value's {seed: `metric`}, in seed order."""
    by_value: dict[int | str, dict[int, float]] = {}
    for r in sorted(results, key=lambda r: r["seed"]):
        if metric in r:
            by_value.setdefault(r["value"], {})[r["seed"]] = r[metric]
    return by_value


def bleu_by_value(results: list[dict], metric: str = "test_bleu") -> dict[int | str, list[float]]:
    """Each value's per-seed `metric`, in seed order."""
    by_value: dict[int | str, list[float]] = {}
    for r in sorted(results, key=lambda r: r["seed"]):
        if metric in r:
            by_value.setdefault(r["value"], []).append(r[metric])
    return by_value


def _steps(runs: list[dict]) -> str:
    """The scored step of each seed, in seed order ("3,600 / 4,000 / 4,000 of 4,000")."""
    runs = sorted(runs, key=lambda r: r["seed"])
    trained = {r.get("num_train_steps") for r in runs} - {None}
    suffix = f" of {trained.pop():,}" if len(trained) == 1 else ""
    return " / ".join(f"{r['step']:,}" for r in runs if "step" in r) + suffix


def detectable_text(family: int, what: str) -> str:
    """How the detectable-difference column is computed, with its level for a Holm family of `family`."""
    return fill(
        "detectable",
        alpha=f"{significance.ALPHA:g}",
        family=family,
        level=f"{significance.ALPHA / family:.4f}",
        what=what,
        power=f"{significance.POWER * 100:g}",
    )


def reference_comparisons(results: list[dict], spec: dict) -> dict[int | str, significance.SeedComparison]:
    """The primary family: every value with seeds against the reference (`significance.table_comparisons`,
    Holm over the sweep's values but the reference); {} before the reference has a seed."""
    bleu, reference = bleu_by_value(results), spec["reference"]
    if reference not in bleu:
        return {}
    return significance.table_comparisons(
        {v: b for v, b in bleu.items() if v != reference}, bleu[reference], planned=len(spec["values"]) - 1
    )


def seed_markdown(results: list[dict], spec: dict, primary: bool = True) -> str:
    """The primary table: each value's test BLEU against the reference's, seeds as the unit of replication
    (significance.table_comparisons: Welch, Hedges' g, Holm over the table, TOST), with the scored steps;
    a value of the sweep with no finished seed reads "not run yet". Not `primary` where a registered
    analysis is (`sweeps.registered`): its title says so, and it gives no verdicts."""
    key, reference = spec["key"], spec["reference"]
    bleu = bleu_by_value(results)
    if reference not in bleu:
        return ""
    compared = reference_comparisons(results, spec)
    paper = key in ("h", "dk")
    base = next((r for r in results if r["value"] == reference), {})
    first = min(r["seed"] for r in results)  # a replication's seeds start later (SWEEP_FIRST_SEED)
    titles = [key, "seeds", "test BLEU (mean)", *COMPARISON_TITLES, f"scored steps (seed {first} / {first + 1} / ...)"]
    titles += [f"paper: dev BLEU − {key}={reference}'s"] if paper else []
    rows = []
    for value in spec["values"]:
        runs = [r for r in results if r["value"] == value]
        if not runs:
            rows.append([value, 0, "not run yet"] + [""] * (len(titles) - 3))
            continue
        cells = [str(value), str(len(runs)), f"{statistics.fmean(bleu[value]):.2f}"]
        cells += (
            ["reference"] + [""] * (len(COMPARISON_TITLES) - 1)
            if value == reference
            else comparison_cells(compared[value], primary)
        )
        cells.append(_steps(runs))
        if paper:
            ours, theirs = paper_numbers(key, runs[0]), paper_numbers(key, base)
            cells.append(f"{ours[1] - theirs[1]:+.1f}" if ours and theirs and value != reference else "–")
        rows.append(cells)
    lines = [
        f"## Test BLEU against {key} = {reference}, over seeds "
        + ("(the primary result)\n" if primary else "(secondary: the registered analysis above is primary)\n"),
        PRIMARY if primary else SECONDARY,
        markdown_table(titles, rows, "lrr" + COMPARISON_ALIGN + "l" + ("r" if paper else "")),
    ]
    holm_m = significance.family_size([c.p for c in compared.values()], len(spec["values"]) - 1)
    if primary:
        lines.append("\n" + verdict_line(key, compared))
    note = fill(
        "seed_table",
        verdicts=fill("verdict_rule", margin=f"{significance.MARGIN:g}") if primary else fill("no_verdicts"),
        test_split=spec.get("test_split") or "the test split",
        holm_m=holm_m,
        comparisons="comparison" if holm_m == 1 else "comparisons",
        margin=f"{significance.MARGIN:g}",
        detectable=detectable_text(holm_m, "this table's comparisons"),
    )
    lines.append(f"\n{note}\n")
    return "\n".join(lines) + "\n"


def verdict_line(key: str, compared: dict) -> str:
    """The table's verdicts in one sentence ("Lower: h = 32. Undetermined: h = 1, 2."), the seeds' counts beside."""
    groups: dict[str, list[str]] = {}
    for value, c in compared.items():
        groups.setdefault(c.verdict, []).append(f"{value}")
    order = [v for v in significance.VERDICTS if v in groups]
    return "**Reading.** " + " ".join(
        f"{verdict[0].upper()}{verdict[1:]}: {key} = {', '.join(groups[verdict])}." for verdict in order
    )


def contrasts_markdown(results: list[dict], spec: dict, primary: bool = True) -> str:
    """The sweep's named comparisons between two of its values (spec "contrasts": [label, from, to]), seed level,
    Holm over them; a side without finished seeds reads "not run yet". Not `primary` (no verdicts) where a
    registered analysis is."""
    contrasts = spec.get("contrasts") or []
    if not contrasts:
        return ""
    bleu = bleu_by_value(results)
    ready = {label: (bleu[a], bleu[b]) for label, a, b in contrasts if a in bleu and b in bleu}
    tests = significance.adjust(
        {label: significance.compare_seeds(to, start) for label, (start, to) in ready.items()}, len(contrasts)
    )
    titles = ["comparison", "from → to", "seeds", *COMPARISON_TITLES]
    rows = []
    for label, a, b in contrasts:
        if label not in tests:
            missing = " and ".join(v for v in (a, b) if v not in bleu)
            rows.append([label, f"{a} → {b}", "–", f"{missing} not run yet"] + [""] * (len(COMPARISON_TITLES) - 1))
        else:
            rows.append(
                [label, f"{a} → {b}", f"{len(bleu[a])} → {len(bleu[b])}", *comparison_cells(tests[label], primary)]
            )
    lines = [
        "## The decomposition: one change at a time" + ("" if primary else " (secondary: no verdicts)") + "\n",
        PRIMARY if primary else SECONDARY,
        markdown_table(titles, rows, "llr" + COMPARISON_ALIGN),
    ]
    family = significance.family_size([c.p for c in tests.values()], len(contrasts))
    lines.append(f"\n{fill('contrasts', family=family, detectable=detectable_text(family, 'these comparisons'))}\n")
    return "\n".join(lines) + "\n"
