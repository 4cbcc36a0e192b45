"""Several sweeps' comparisons read as one study, with one Holm family over all of them.

Each sweep's table adjusts over its own comparisons (sweeps/tables.py). A reading that draws on several
tables at once (results/table3.md: rows A, rows B, KV sharing, head size, budget) makes all of their
comparisons, so `study_comparisons` adjusts them together: a verdict that holds here holds for the whole
study. A study config names them: `STUDY_NAME` (the file), optionally `STUDY_TITLE`, and
`STUDY = ((sweep name, from value, to value), ...)` (configs/table3_preset.py). A comparison whose sweep
or seeds are not stored yet (fewer than two a side: no Welch test) counts as p = 1 (`significance.holm`'s
`planned`), so a verdict does not weaken as the study fills up.

    python sweep.py --study configs/table3_preset.py    # RESULTS_DIR/STUDY_NAME.md
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from sweeps import significance, store, tables

Comparison = tuple[str, int | str, int | str]  # (sweep name, from value, to value)


def study_comparisons(results_dir: Path, study: Sequence[Comparison]) -> dict[Comparison, significance.SeedComparison | None]:
    """Each comparison of `study` (to's seeds against from's, over seeds), Holm-adjusted over the whole study;
    None where either side has no stored seed."""
    _check_study(study)
    bleu = {name: _stored_bleu(Path(results_dir) / name) for name in dict.fromkeys(name for name, _, _ in study)}
    tests = {c: significance.compare_seeds(bleu[c[0]][c[2]], bleu[c[0]][c[1]])
             for c in study if c[1] in bleu[c[0]] and c[2] in bleu[c[0]]}
    adjusted = significance.adjust(tests, planned=len(study))
    return {c: adjusted.get(c) for c in study}


def _stored_bleu(sweep_dir: Path) -> dict[int | str, list[float]]:
    if not (sweep_dir / store.SPEC_FILE).exists():
        return {}  # not started yet: its comparisons are planned, not tested
    return tables.bleu_by_value(store.load_results(sweep_dir, store.read_spec(sweep_dir)))


def _check_study(study: Sequence[Comparison]) -> None:
    if not study:
        raise ValueError("STUDY must name at least one (sweep name, from value, to value), got none")
    for c in study:
        if not (isinstance(c, tuple) and len(c) == 3 and isinstance(c[0], str) and c[1] != c[2]):
            raise ValueError(f"STUDY entries must be (sweep name, from value, to value) with two different values, got {c!r}")
    if len(set(study)) != len(study):
        raise ValueError(f"STUDY names a comparison twice: {sorted({c for c in study if study.count(c) > 1}, key=str)}")


def study_markdown(results_dir: Path, study: Sequence[Comparison], title: str) -> str:
    compared = study_comparisons(results_dir, study)
    n = len(study)
    lines = [f"# {title}: every comparison, one Holm family over {n}\n",
             "| sweep | from → to | seeds | test BLEU (from → to) | " + " | ".join(tables.COMPARISON_TITLES) + " |",
             "|---|---|---:|---:|" + "---:|" * (len(tables.COMPARISON_TITLES) - 1) + "---|"]
    for c, test in compared.items():
        name, start, to = c
        if test is None:
            lines.append(f"| {name} | {start} → {to} | – | not run yet |" + " |" * len(tables.COMPARISON_TITLES))
            continue
        means = f"{statistics.fmean(test.reference):.2f} → {statistics.fmean(test.point):.2f}"
        lines.append(f"| {name} | {start} → {to} | {len(test.reference)} → {len(test.point)} | {means} | "
                     + " | ".join(tables.comparison_cells(test)) + " |")
    lines.append(f"""
Written by `python sweep.py --study` from the sweeps' stored results alone. Each row is one comparison of
the sweep's own table (its value against the reference, or a named contrast), over seeds: the difference
is the mean test BLEU of "to"'s seeds minus "from"'s, with Welch's 95 % interval, Hedges' g and Welch's
two-sided p, as in each sweep's table. Holm's adjustment runs over all {n} comparisons here (those not run
yet, or with fewer than two seeds a side, count as p = 1), for the difference and for the equivalence (TOST ±{significance.MARGIN:g} BLEU) tests alike;
each sweep's own table adjusts over its own comparisons only, so a verdict there can be "lower" and
"undetermined" here. A verdict that holds in this table holds for the study as a whole.
""")
    return "\n".join(lines)


def write(results_dir: Path, module: ModuleType) -> Path:
    """Write RESULTS_DIR/STUDY_NAME.md for a study config (`STUDY_NAME`, `STUDY`)."""
    for field in ("STUDY_NAME", "STUDY"):
        if not hasattr(module, field):
            raise ValueError(f"{module.__file__} has no {field}: a study config sets STUDY_NAME and STUDY = ((sweep, from, to), ...)")
    path = Path(results_dir) / f"{module.STUDY_NAME}.md"
    path.write_text(study_markdown(results_dir, tuple(module.STUDY), getattr(module, "STUDY_TITLE", module.STUDY_NAME)))
    return path
