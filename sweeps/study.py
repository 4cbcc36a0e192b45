"""Several sweeps' comparisons read as one study, with one Holm family over all of them.

Each sweep's table adjusts over its own comparisons (sweeps/tables/). A reading that draws on several
tables at once (results/table3.md: rows A, rows B, KV sharing, head size, budget) makes all of their
comparisons, so `study_comparisons` adjusts them together: a verdict that holds here holds for the whole
study. A study config names them: `STUDY_NAME` (the file), optionally `STUDY_TITLE`, and
`STUDY = ((sweep name, from value, to value), ...)` (configs/table3_preset.py). A comparison whose sweep
or seeds are not stored yet (fewer than two a side: no Welch test) counts as p = 1 (`significance.holm`'s
`planned`), so a verdict does not weaken as the study fills up. Beside it, as each sweep's table has them:
the batch (commit × CPU kind) of every seed and the two sensitivity analyses (no verdicts) over the same
family, the pooled variance over every distinct point the study compares (a run copied into several
sweeps counts once, as the point it ran as). Its prose is sweeps/templates/study.md (`tables.fill`).

    python sweep.py study --config configs/table3_preset.py    # RESULTS_DIR/STUDY_NAME.md
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from sweeps import significance, store, tables
from training.core.markdown import markdown_table

Comparison = tuple[str, int | str, int | str]  # (sweep name, from value, to value)


def study_comparisons(
    results_dir: Path, study: Sequence[Comparison]
) -> dict[Comparison, significance.SeedComparison | None]:
    """Each comparison of `study` (to's seeds against from's, over seeds), Holm-adjusted over the whole study;
    None where either side has no stored seed."""
    _check_study(study)
    bleu = {name: tables.bleu_by_value(results) for name, (_, results) in _stored(results_dir, study).items()}
    tests = {
        c: significance.compare_seeds(bleu[c[0]][c[2]], bleu[c[0]][c[1]])
        for c in study
        if c[1] in bleu[c[0]] and c[2] in bleu[c[0]]
    }
    adjusted = significance.adjust(tests, planned=len(study))
    return {c: adjusted.get(c) for c in study}


def _stored(results_dir: Path, study: Sequence[Comparison]) -> dict[str, tuple[dict, list[dict]]]:
    """{sweep name: (its spec, its stored results)} for every sweep `study` names; ({}, []) for one not started
    (its comparisons are planned, not tested)."""
    out = {}
    for name in dict.fromkeys(name for name, _, _ in study):
        sweep_dir = Path(results_dir) / name
        spec = store.read_spec(sweep_dir) if (sweep_dir / store.SPEC_FILE).exists() else {}
        out[name] = (spec, store.load_results(sweep_dir, spec) if spec else [])
    return out


def origin(name: str, key: str, result: dict) -> str:
    """The point a run ran as, "sweep/point" ("heads/h8"): a run copied from another sweep (`shared_from`)
    counts as its origin's point, so that one run enters the study's pooled variance once."""
    if "shared_from" in result:
        return result["shared_from"].rsplit("/", 1)[0]
    return f"{name}/{store.point_label(key, result['value'])}"


def study_groups(
    results_dir: Path, study: Sequence[Comparison]
) -> tuple[dict[Comparison, tuple[str, str]], dict[str, list[dict]]]:
    """The study's comparisons as pairs of points ({comparison: (from point, to point)}, `origin`'s names) and
    the runs of every point they compare ({point: its runs, each once}); a comparison a side of which has no
    stored run is left out."""
    stored = _stored(results_dir, study)
    points, groups = {}, {}
    for name, start, to in study:
        spec, results = stored[name]
        sides = []
        for value in (start, to):
            runs = [r for r in results if r["value"] == value]
            if runs:
                point = origin(name, spec["key"], runs[0])
                groups.setdefault(point, {}).update({r["seed"]: r for r in runs})
                sides.append(point)
        if len(sides) == 2:
            points[(name, start, to)] = tuple(sides)
    return points, {point: [by_seed[seed] for seed in sorted(by_seed)] for point, by_seed in groups.items()}


def _check_study(study: Sequence[Comparison]) -> None:
    if not study:
        raise ValueError("STUDY must name at least one (sweep name, from value, to value), got none")
    for c in study:
        if not (isinstance(c, tuple) and len(c) == 3 and isinstance(c[0], str) and c[1] != c[2]):
            raise ValueError(
                f"STUDY entries must be (sweep name, from value, to value) with two different values, got {c!r}"
            )
    if len(set(study)) != len(study):
        raise ValueError(f"STUDY names a comparison twice: {sorted({c for c in study if study.count(c) > 1}, key=str)}")


def study_markdown(results_dir: Path, study: Sequence[Comparison], title: str) -> str:
    compared = study_comparisons(results_dir, study)
    n = len(study)
    rows = []
    for (name, start, to), test in compared.items():
        if test is None:
            rows.append([name, f"{start} → {to}", "–", "not run yet"] + [""] * len(tables.COMPARISON_TITLES))
            continue
        means = f"{statistics.fmean(test.reference):.2f} → {statistics.fmean(test.point):.2f}"
        seeds = f"{len(test.reference)} → {len(test.point)}"
        rows.append([name, f"{start} → {to}", seeds, means, *tables.comparison_cells(test)])
    titles = ["sweep", "from → to", "seeds", "test BLEU (from → to)", *tables.COMPARISON_TITLES]
    lines = [
        f"# {title}: every comparison, one Holm family over {n}\n",
        tables.PRIMARY,
        markdown_table(titles, rows, "llrr" + tables.COMPARISON_ALIGN),
    ]
    note = tables.fill(
        "study", n=n, margin=f"{significance.MARGIN:g}", detectable=tables.detectable_text(n, f"the study's {n}")
    )
    lines.append(f"\n{note}\n")
    return "\n".join(lines) + "\n" + study_sensitivity_markdown(results_dir, study, compared)


def study_sensitivity_markdown(
    results_dir: Path, study: Sequence[Comparison], compared: dict[Comparison, significance.SeedComparison | None]
) -> str:
    """The study's batches and its sensitivity table (`tables.sensitivity_table`), Holm over the whole study,
    the pooled variance over every distinct point the study compares; "" before any comparison has runs."""
    points, groups = study_groups(results_dir, study)
    if not points:
        return ""
    label = {c: f"{c[0]}: {c[1]} → {c[2]}" for c in points}
    letters = tables.batch_letters([r for runs in groups.values() for r in runs])
    comparisons = {label[c]: pair for c, pair in points.items()}
    lines = [
        "## Sensitivity (no verdicts): seeds as blocks, one pooled variance\n",
        *tables.sensitivity_table(
            comparisons, groups, len(study), {label[c]: compared[c] for c in points if compared[c]}, letters
        ),
        "",
        tables.sensitivity_text(f"the study's {len(study)}", sum(map(len, groups.values())), len(groups)),
        "",
        tables.batch_summary(comparisons, groups),
        "",
    ]
    return tables.batches_legend(groups, "point", letters) + "\n".join(lines)


def write(results_dir: Path, module: ModuleType) -> Path:
    """Write RESULTS_DIR/STUDY_NAME.md for a study config (`STUDY_NAME`, `STUDY`)."""
    for field in ("STUDY_NAME", "STUDY"):
        if not hasattr(module, field):
            raise ValueError(
                f"{module.__file__} has no {field}: a study config sets STUDY_NAME and STUDY = ((sweep, from, to), ...)"
            )
    path = Path(results_dir) / f"{module.STUDY_NAME}.md"
    path.write_text(study_markdown(results_dir, tuple(module.STUDY), getattr(module, "STUDY_TITLE", module.STUDY_NAME)))
    return path
