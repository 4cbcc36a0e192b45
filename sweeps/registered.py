"""A sweep's registered analysis: its named contrasts with the seed as block, as its preregistration fixes it.

A sweep config registers its analysis with `SWEEP_PREREGISTRATION`, the committed file that fixed the
design before the first run (configs/head_size_blocked.py: results/preregistration.md); the registered
seeds are `SWEEP_FIRST_SEED` and the next, as many as the sweep was run with (its stored spec's "seeds").

For each contrast (label, from, to) of the sweep's `SWEEP_CONTRASTS` and each registered seed s,
d_s = test BLEU(to, s) - test BLEU(from, s). The paired t test of mean d = 0 (two-sided, n - 1 degrees
of freedom), its 95 % interval, TOST against ±`significance.MARGIN` on the same paired standard error,
both Holm-adjusted over the contrasts, and the difference n blocks detect with 80 % power at Holm's
strictest level (`significance.paired_comparison`, `significance.adjust`). Verdicts as everywhere:
lower / higher, equivalent within ±MARGIN, else undetermined. Beside it, labelled as such and with no
verdicts, the two registered sensitivity analyses (`sensitivity`): Welch's unpaired test and one two-way
model (point + seed block, `significance.blocked_contrasts`), each Holm-adjusted over the contrasts.

It runs only on the complete design: every contrast's points at every registered seed, but for runs the
preregistration's rules declare missing (`--missing VALUE:SEED --why ...`: each removes its block from the
contrasts it enters and is named with the reason). A sweep cut short raises and names the runs it lacks, so
no verdict is read off a partial sweep. The runs' batches
(commit × CPU kind, `tables.batch_label`) are listed; a design registered on one batch that ran on
more says so.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from sweeps import significance, store, tables
from training.core.markdown import markdown_table


def missing_runs(results: list[dict], spec: dict, seeds: Sequence[int]) -> list[tuple[str, int]]:
    """(value, seed) of every run the contrasts need at `seeds` that `results` lacks (no test BLEU)."""
    have = {(r["value"], r["seed"]) for r in results if "test_bleu" in r}
    needed = dict.fromkeys(value for _, a, b in spec.get("contrasts") or [] for value in (a, b))
    return [(value, seed) for value in needed for seed in seeds if (value, seed) not in have]


def parse_run(arg: str, module: ModuleType) -> tuple[str, int]:
    """--missing VALUE:SEED as (value, seed), the value one of the sweep's `SWEEP_VALUES` (as spelled there)."""
    value, _, seed = arg.rpartition(":")
    values = {str(v): v for v in module.SWEEP_VALUES}
    if value not in values or not seed.isdigit():
        raise ValueError(f"--missing {arg!r}: expected VALUE:SEED, VALUE one of {list(values)} and SEED an integer")
    return values[value], int(seed)


def registered_design(
    results: list[dict], spec: dict, seeds: Sequence[int], declared: Sequence[tuple[str, int]] = ()
) -> dict[str, dict[int, float]]:
    """{value: {seed: test BLEU}} of every value the contrasts name, at `seeds`; a ValueError naming the
    missing runs unless the design is complete there but for the runs `declared` missing ((value, seed) each,
    left out: the preregistration's missing runs, e.g. one the divergence guard stopped twice). A run
    declared missing that is stored is refused too: every stored run is analysed."""
    contrasts = spec.get("contrasts") or []
    if not contrasts:
        raise ValueError(f"sweep {spec['name']!r} names no contrasts (SWEEP_CONTRASTS): nothing is registered")
    if len(set(seeds)) < 2:
        raise ValueError(f"a paired analysis needs two or more registered seeds, got {list(seeds)}")
    missing = missing_runs(results, spec, seeds)
    stored = [run for run in declared if run not in missing]
    if stored:
        raise ValueError(
            f"--missing {', '.join(f'{value}:{seed}' for value, seed in stored)}: stored (or not a run the "
            "registered contrasts need at the registered seeds); a run that is in is analysed"
        )
    undeclared = [run for run in missing if run not in declared]
    if undeclared:
        runs = ", ".join(f"{value} seed {seed}" for value, seed in undeclared)
        raise ValueError(
            f"the registered design of {spec['name']!r} is not complete at seeds {list(seeds)}: "
            f"{len(undeclared)} run(s) missing ({runs}); it is analysed once every registered run is in, or "
            "declared missing under the preregistration's rules (--missing VALUE:SEED --why ...)"
        )
    bleu = {(r["value"], r["seed"]): r["test_bleu"] for r in results if "test_bleu" in r}
    values = dict.fromkeys(value for _, a, b in contrasts for value in (a, b))
    return {value: {seed: bleu[value, seed] for seed in seeds if (value, seed) in bleu} for value in values}


def comparisons(
    results: list[dict], spec: dict, seeds: Sequence[int], declared: Sequence[tuple[str, int]] = ()
) -> dict[str, significance.SeedComparison]:
    """{contrast label: its paired comparison over the seeds both of its points have, Holm-adjusted over the
    contrasts}; a ValueError naming the missing runs unless the design is complete at `seeds` but for the
    runs `declared` missing (`registered_design`): a missing run removes its block from the contrasts it enters."""
    return paired(registered_design(results, spec, seeds, declared), spec)


def paired(design: dict[str, dict[int, float]], spec: dict) -> dict[str, significance.SeedComparison]:
    """`comparisons` of a `registered_design`."""
    return significance.adjust(
        {
            label: significance.paired_comparison(*_shared_blocks(design[b], design[a]))
            for label, a, b in spec["contrasts"]
        },
        len(spec["contrasts"]),  # the registered family, even where a contrast is left untested
    )


def _shared_blocks(point: dict[int, float], reference: dict[int, float]) -> tuple[dict[int, float], dict[int, float]]:
    shared = sorted(set(point) & set(reference))
    return {s: point[s] for s in shared}, {s: reference[s] for s in shared}


def sensitivity(design: dict[str, dict[int, float]], spec: dict) -> dict[str, dict[str, object]]:
    """The registered sensitivity analyses of `design` (`registered_design`), each Holm-adjusted over the
    contrasts, no verdicts: {"welch": {label: `significance.compare_seeds`, unpaired, every stored run of the
    two points}, "two_way": {label: `significance.blocked_contrasts`, one model (point + seed block) fitted to
    every run of the seeds that every point has}}."""
    contrasts = {label: (a, b) for label, a, b in spec["contrasts"]}
    welch = {
        label: significance.compare_seeds(list(design[b].values()), list(design[a].values()))
        for label, (a, b) in contrasts.items()
    }
    blocks = _full_blocks(design)
    if len(blocks) >= 2:
        two_way = significance.blocked_contrasts({v: {s: d[s] for s in blocks} for v, d in design.items()}, contrasts)
    else:  # runs declared missing left fewer than two seeds that every point has: no model to fit
        untested = significance.Sensitivity(math.nan, math.nan, math.nan, math.nan, math.nan, math.nan)
        two_way = dict.fromkeys(contrasts, untested)
    return {
        "welch": significance.adjust(welch, len(contrasts)),
        "two_way": significance.adjust(two_way, len(contrasts)),
    }


def _full_blocks(design: dict[str, dict[int, float]]) -> list[int]:
    """The seeds every point of `design` has."""
    return sorted(set.intersection(*(set(d) for d in design.values())))


TITLES = [
    "#",
    "comparison",
    "from → to",
    "d per seed",
    "mean d (BLEU)",
    "95 % CI",
    "p (paired t, two-sided)",
    "p, Holm",
    f"equivalence p (TOST ±{significance.MARGIN:g}), Holm",
    "detectable difference (80 % power at Holm's α / m)",
    "verdict",
]


def write(
    results_dir: Path, module: ModuleType, declared: Sequence[tuple[str, int]] = (), why: str | None = None
) -> Path:
    """Write RESULTS_DIR/NAME_registered.md (`markdown`) for the sweep config `module`, from its stored results;
    `declared`: runs declared missing under the preregistration's rules, for the reason `why`."""
    registration = getattr(module, "SWEEP_PREREGISTRATION", None)
    if registration is None:
        raise ValueError(f"sweep {module.SWEEP_NAME!r} registers no analysis (no SWEEP_PREREGISTRATION in its config)")
    if bool(declared) != bool(why and why.strip()):
        raise ValueError("--missing and --why go together: the runs declared missing and the reason, as registered")
    sweep_dir = Path(results_dir) / module.SWEEP_NAME
    spec = store.read_spec(sweep_dir)
    first = getattr(module, "SWEEP_FIRST_SEED", 0)
    seeds = list(range(first, first + spec["seeds"]))
    path = Path(results_dir) / f"{module.SWEEP_NAME}_registered.md"
    path.write_text(markdown(store.load_results(sweep_dir, spec), spec, seeds, registration, declared, why))
    return path


def markdown(
    results: list[dict],
    spec: dict,
    seeds: Sequence[int],
    registration: str,
    declared: Sequence[tuple[str, int]] = (),
    why: str | None = None,
) -> str:
    """The registered analysis (`comparisons`) as markdown, the sensitivity analyses and the runs' batches below
    it, and the runs `declared` missing (for the reason `why`) named above the table."""
    design = registered_design(results, spec, seeds, declared)
    tests = paired(design, spec)
    lines = [
        tables.fill(
            "registered",
            registration=registration,
            sweep=spec["name"],
            seeds=", ".join(map(str, seeds)),
            family=len(tests),
            margin=f"{significance.MARGIN:g}",
            alpha=f"{significance.ALPHA:g}",
        ),
        "",
    ]
    if declared:
        runs = ", ".join(f"{value} seed {seed}" for value, seed in declared)
        lines += [
            f"**Missing runs** ({len(declared)}, declared as the preregistration's rules say; each removes its "
            f"block from the comparisons it enters): {runs}. Why: {why.strip() if why else ''}",
            "",
        ]
    rows = []
    for i, (label, a, b) in enumerate(spec["contrasts"], 1):
        c = tests[label]
        per_seed = ", ".join(f"{to - start:+.2f}" for to, start in zip(c.point, c.reference))
        cells = tables.comparison_cells(c)
        del cells[2]  # Hedges' g: none for paired runs
        rows.append([i, label, f"{a} → {b}", per_seed, *cells])
    lines += [tables.PRIMARY, markdown_table(TITLES, rows, "rlll" + "r" * (len(TITLES) - 5) + "l")]
    family = len(tests)
    lines += ["", tables.detectable_text(family, "these comparisons") + ".", ""]
    lines += _sensitivity_lines(design, spec, tests)
    lines += ["", _batches(results, spec, seeds)]
    return "\n".join(lines) + "\n"


SENSITIVITY_TITLES = [
    "#",
    "comparison",
    "Welch: d (BLEU)",
    "95 % CI",
    "p",
    "p, Holm",
    "two-way: d (BLEU)",
    "95 % CI",
    "p",
    "p, Holm",
    "paired (primary): p, Holm",
]


def _sensitivity_lines(design: dict[str, dict[int, float]], spec: dict, primary: dict) -> list[str]:
    """The sensitivity table (`sensitivity`) beside the `primary` Holm p, and the text that says what it is."""
    models = sensitivity(design, spec)
    blocks = max(len(_full_blocks(design)), 1)
    lines = [
        tables.fill(
            "registered_sensitivity",
            family=len(primary),
            points=len(design),
            runs=len(design) * blocks,
            seeds=blocks,
            df=(len(design) - 1) * (blocks - 1),
        ),
        "",
        tables.SENSITIVITY,
    ]

    def cells(m):  # one model's difference, its CI, p and Holm p
        return [tables.signed_cell(m.difference), tables.ci_cell(m), tables.p_cell(m.p), tables.p_cell(m.p_holm)]

    rows = [
        [
            i,
            label,
            *cells(models["welch"][label]),
            *cells(models["two_way"][label]),
            tables.p_cell(primary[label].p_holm),
        ]
        for i, (label, _, _) in enumerate(spec["contrasts"], 1)
    ]
    return [*lines, markdown_table(SENSITIVITY_TITLES, rows, "rl" + "r" * (len(SENSITIVITY_TITLES) - 2))]


def _batches(results: list[dict], spec: dict, seeds: Sequence[int]) -> str:
    """Which batch (commit × CPU kind) ran the analysed runs: one, as registered, or each named."""
    values = {value for _, a, b in spec["contrasts"] for value in (a, b)}
    analysed = [r for r in results if r["value"] in values and r["seed"] in seeds]
    counts = Counter(tables.batch_label(r) for r in analysed)
    if len(counts) == 1:
        return f"All {len(analysed)} runs in one batch: {next(iter(counts))}."
    runs = "; ".join(f"{label}: {counts[label]}" for label in sorted(counts))
    return f"**The runs span {len(counts)} batches** ({runs})."
