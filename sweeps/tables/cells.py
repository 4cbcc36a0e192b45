"""How a comparison reads in a table: its cells (differences, intervals, p values, the verdict), the columns
they fill, and the markers that say which analysis a table belongs to.
"""

from __future__ import annotations

import math

from sweeps import significance

# Each comparison table carries one of these markers on the line above its header, so that a reading can be checked
# against where its figures come from: verdict words (lower, higher, equivalent) belong to the primary analysis
# alone (tests/sweeps/test_readings.py). Secondary and sensitivity tables give no verdicts.
PRIMARY = "<!-- analysis: primary (verdicts) -->"
SECONDARY = "<!-- analysis: secondary (no verdicts) -->"
SENSITIVITY = "<!-- analysis: sensitivity (no verdicts) -->"
NO_VERDICT = "secondary: no verdict"  # the verdict cell of a secondary table


def p_cell(p: float) -> str:
    """A p value as the tables print it: 3 decimals, "< 0.001" below, "–" for NaN (not tested)."""
    return "–" if math.isnan(p) else "< 0.001" if p < 0.001 else f"{p:.3f}"


def pair_p(p: float) -> str:
    """A per-pair randomization p: 3 decimals, 4 below 0.001 (its floor is 1 / (trials + 1), 0.0001)."""
    return f"{p:.4f}" if p < 0.001 else f"{p:.3f}"


def signed_cell(x: float, fmt: str = ".2f") -> str:
    """A difference with its sign ("–" for NaN)."""
    return "–" if math.isnan(x) else f"{x:+{fmt}}"


def verdict_cell(c: significance.SeedComparison, primary: bool = True) -> str:
    """A comparison's verdict as a table prints it (bold where it is a difference); `NO_VERDICT` where the table is
    not the primary analysis."""
    if not primary:
        return NO_VERDICT
    return f"**{c.verdict}**" if c.verdict in ("lower", "higher") else c.verdict


def comparison_cells(c: significance.SeedComparison, primary: bool = True) -> list[str]:
    ci = "–" if math.isnan(c.ci_low) else f"[{c.ci_low:+.2f}, {c.ci_high:+.2f}]"
    return [
        signed_cell(c.difference),
        ci,
        signed_cell(c.hedges_g),
        p_cell(c.p),
        p_cell(c.p_holm),
        p_cell(c.tost_p_holm),
        "–" if math.isnan(c.mdd) else f"{c.mdd:.2f}",
        verdict_cell(c, primary),
    ]


COMPARISON_TITLES = [
    "difference (BLEU)",
    "95 % CI",
    "Hedges' g",
    "p (Welch, two-sided)",
    "p, Holm",
    f"equivalence p (TOST ±{significance.MARGIN:g}), Holm",
    "detectable difference (80 % power at Holm's α / m)",
    "verdict",
]
COMPARISON_ALIGN = "r" * (len(COMPARISON_TITLES) - 1) + "l"  # the numbers right, the verdict left


def ci_cell(c) -> str:
    """A comparison's interval [low, high] ("–" where it has none)."""
    return "–" if math.isnan(c.ci_low) else f"[{c.ci_low:+.2f}, {c.ci_high:+.2f}]"
