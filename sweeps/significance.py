"""Does a sweep point's test BLEU differ from the reference point's, and by how much? (docs/sweeps.md, "Significance")

Primary, seed level (`compare_seeds`, `table_comparisons`): the unit of replication is the training
run. A point's seeds and the reference's seeds are two independent samples of "train this config
once and score it": seed k of one point shares no more with seed k of another than any other pair
does (the data order is one draw of many; a different width makes the same initialisation seed a
different initialisation), so the seeds are not paired. Welch's t on per-seed test BLEU gives the
mean difference, its 95 % confidence interval and a two-sided p (unequal variances: a point can be
noisier than the reference); Hedges' g is the effect size (the difference in pooled seed sds, with
the small-sample correction); Holm's step-down adjustment runs over one table's comparisons;
TOST at ±`MARGIN` BLEU tests equivalence; the minimum detectable difference is what this many seeds
would find with `POWER` at the two-sided `ALPHA`. A verdict is "lower" or "higher" (Holm-adjusted
two-sided p < ALPHA), "equivalent within ±MARGIN" (Holm-adjusted TOST p < ALPHA), else "undetermined".

Secondary, per seed pair (`paired_randomization`, `seed_pair_p_values`): sacreBLEU's paired
approximate randomization (`sacrebleu --paired-ar`, two-sided: it compares |BLEU difference|),
seed k of the point against seed k of the reference on the same test sentences. It treats the two
trained models as fixed, so it tests the test set's sampling, not the configuration.
`paired_bootstrap` (sacreBLEU's Moses-style paired bootstrap) stays for the pruning analysis; its
p counts one tail of the centred resamples and reads as one-sided.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sacrebleu.metrics import BLEU
from sacrebleu.significance import PairedTest
from scipy import stats

from sweeps import store

RESAMPLES = 1000  # paired bootstrap resamples (sacreBLEU's default)
AR_TRIALS = 10000  # approximate randomization trials (sacreBLEU's default for --paired-ar)
ALPHA = 0.05  # two-sided test level, after Holm's adjustment
POWER = 0.8  # for the minimum detectable difference
# The equivalence margin, in BLEU: about one seed's sd on this preset (re-running one config moves test BLEU
# 0.3-0.8), so a difference inside it is smaller than what re-training the same config produces; and half
# the smallest difference the BLEU literature treats as visible to people (~1 BLEU, Mathur et al. 2020).
MARGIN = 0.5
VERDICTS = ("lower", "higher", f"equivalent within ±{MARGIN:g}", "undetermined")


@dataclasses.dataclass(frozen=True)
class SeedComparison:
    """A point against the reference, over seeds: `point` and `reference` are their per-seed test BLEU.

    difference = mean(point) - mean(reference), with its two-sided 95 % CI (ci_low, ci_high), the Welch
    standard error `se` and degrees of freedom `df`; `p` the two-sided Welch p; `hedges_g` the effect size;
    `tost_p` the equivalence p at ±MARGIN; `mdd` the minimum detectable difference. NaN where fewer than
    two seeds on either side leave no variance to test with.
    """

    point: tuple[float, ...]
    reference: tuple[float, ...]
    difference: float
    ci_low: float
    ci_high: float
    se: float
    df: float
    p: float
    hedges_g: float
    tost_p: float
    mdd: float
    p_holm: float = math.nan
    tost_p_holm: float = math.nan

    @property
    def verdict(self) -> str:
        if self.p_holm < ALPHA:
            return "lower" if self.difference < 0 else "higher"
        if self.tost_p_holm < ALPHA:
            return VERDICTS[2]
        return "undetermined"


def welch(point: Sequence[float], reference: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float, float, float, float]:
    """(difference, ci_low, ci_high, se, df, two-sided p) of mean(point) - mean(reference), Welch's t test."""
    _check_samples(point, reference)
    n1, n2 = len(point), len(reference)
    difference = statistics.fmean(point) - statistics.fmean(reference)
    if n1 < 2 or n2 < 2:
        return difference, math.nan, math.nan, math.nan, math.nan, math.nan
    v1, v2 = statistics.variance(point) / n1, statistics.variance(reference) / n2
    se = math.sqrt(v1 + v2)
    if se == 0:  # every seed alike on both sides: no spread to test against
        return difference, math.nan, math.nan, math.nan, math.nan, math.nan
    df = (v1 + v2) ** 2 / (v1 ** 2 / (n1 - 1) + v2 ** 2 / (n2 - 1))  # Welch-Satterthwaite
    t = difference / se
    half = stats.t.ppf(0.5 + confidence / 2, df) * se
    return difference, float(difference - half), float(difference + half), se, df, float(2 * stats.t.sf(abs(t), df))


def hedges_g(point: Sequence[float], reference: Sequence[float]) -> float:
    """(mean(point) - mean(reference)) / pooled sample sd, times Hedges' correction 1 - 3 / (4 (n1 + n2) - 9)."""
    _check_samples(point, reference)
    n1, n2 = len(point), len(reference)
    if n1 < 2 or n2 < 2:
        return math.nan
    pooled = math.sqrt(((n1 - 1) * statistics.variance(point) + (n2 - 1) * statistics.variance(reference)) / (n1 + n2 - 2))
    if pooled == 0:
        return math.nan
    return (statistics.fmean(point) - statistics.fmean(reference)) / pooled * (1 - 3 / (4 * (n1 + n2) - 9))


def tost_p(difference: float, se: float, df: float, margin: float = MARGIN) -> float:
    """Two one-sided tests of |true difference| >= margin: the larger of the two one-sided p-values."""
    if not margin > 0:
        raise ValueError(f"margin must be > 0 BLEU, got {margin!r}")
    if not (se > 0 and df > 0):
        return math.nan
    above_lower = stats.t.sf((difference + margin) / se, df)  # H0: difference <= -margin
    below_upper = stats.t.cdf((difference - margin) / se, df)  # H0: difference >= +margin
    return float(max(above_lower, below_upper))


def minimum_detectable_difference(se: float, df: float, alpha: float = ALPHA, power: float = POWER) -> float:
    """The difference a two-sided level-`alpha` t test with this se and df finds with probability `power`:
    (t_{1 - alpha/2} + t_{power}) * se (the usual normal-shift approximation, with t quantiles)."""
    if not (se > 0 and df > 0):
        return math.nan
    return float((stats.t.ppf(1 - alpha / 2, df) + stats.t.ppf(power, df)) * se)


def holm(p_values: Sequence[float], planned: int = 0) -> list[float]:
    """Holm's step-down adjusted p-values, in the input's order. NaN (an untested comparison) stays NaN.

    `planned`: the number of comparisons the table sets out to make, when more than are tested (points not
    run yet): they count as p = 1, so a verdict reached on a partial table does not weaken as it fills up.
    """
    tested = sorted((p, i) for i, p in enumerate(p_values) if not math.isnan(p))
    m = max(len(tested), planned)
    adjusted = [math.nan] * len(p_values)
    running = 0.0
    for rank, (p, i) in enumerate(tested):
        running = max(running, min(1.0, (m - rank) * p))
        adjusted[i] = running
    return adjusted


def compare_seeds(point: Sequence[float], reference: Sequence[float]) -> SeedComparison:
    """One point against the reference (unadjusted: `table_comparisons` adds Holm's adjustment)."""
    difference, low, high, se, df, p = welch(point, reference)
    return SeedComparison(tuple(point), tuple(reference), difference, low, high, se, df, p, hedges_g(point, reference),
                          tost_p(difference, se, df), minimum_detectable_difference(se, df))


def adjust(compared: Mapping[Any, SeedComparison], planned: int = 0) -> dict[Any, SeedComparison]:
    """`compared` with Holm's adjustment over its comparisons (at least `planned` of them), separately for the
    difference tests and the equivalence tests: one family, whatever the keys name (values, contrasts, a study)."""
    p_holm = holm([c.p for c in compared.values()], planned)
    tost_holm = holm([c.tost_p for c in compared.values()], planned)
    return {key: dataclasses.replace(c, p_holm=p, tost_p_holm=t) for (key, c), p, t in zip(compared.items(), p_holm, tost_holm)}


def table_comparisons(points: Mapping[int | str, Sequence[float]], reference: Sequence[float],
                      planned: int = 0) -> dict[int | str, SeedComparison]:
    """Every point of one table against the reference, Holm-adjusted over the table's comparisons (`adjust`)."""
    return adjust({value: compare_seeds(bleu, reference) for value, bleu in points.items()}, planned)


def _check_samples(point, reference) -> None:
    for name, sample in (("point", point), ("reference", reference)):
        if len(sample) < 1 or not all(isinstance(x, (int, float)) and math.isfinite(x) for x in sample):
            raise ValueError(f"{name} must be one or more finite per-seed BLEU scores, got {list(sample)!r}")


def _paired_test(baseline, system, references, test_type: str, samples: int) -> float:
    if not len(baseline) == len(system) == len(references):
        raise ValueError(f"baseline, system and references must be the same sentences: got {len(baseline)}, {len(system)} "
                         f"and {len(references)} lines")
    logger = logging.getLogger("sacrebleu")  # it narrates each test at INFO; a table takes dozens
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        test = PairedTest([("baseline", list(baseline)), ("system", list(system))], {"BLEU": BLEU()}, [list(references)],
                          test_type=test_type, n_samples=samples)
        _, scores = test()
    finally:
        logger.setLevel(level)
    return scores["BLEU"][1].p_value


def paired_bootstrap(baseline: Sequence[str], system: Sequence[str], references: Sequence[str], resamples: int = RESAMPLES) -> float:
    """sacreBLEU's paired bootstrap p (`--paired-bs`; 13a, cased, one reference): one-sided in effect."""
    return _paired_test(baseline, system, references, "bs", resamples)


def paired_randomization(baseline: Sequence[str], system: Sequence[str], references: Sequence[str], trials: int = AR_TRIALS) -> float:
    """Two-sided p of "system's corpus BLEU differs from baseline's only by chance", sacreBLEU's paired
    approximate randomization (`--paired-ar`, its fixed seed; 13a, cased, one reference)."""
    return _paired_test(baseline, system, references, "ar", trials)


def seed_pair_p_values(sweep_dir: Path, spec: dict, results: list[dict]) -> dict[int | str, dict[int, float]]:
    """{value: {seed k: two-sided p of the point's seed k against the reference's seed k}}; {} without a test split."""
    split = spec.get("test_split")
    references_file = store.references_path(sweep_dir, split) if split else None
    if references_file is None or not references_file.exists():
        return {}
    references = _lines(references_file)
    reference_seeds = {r["seed"] for r in results if r["value"] == spec["reference"]}
    p_values = {}
    for value in dict.fromkeys(r["value"] for r in results):
        if value == spec["reference"]:
            continue
        p_values[value] = {}
        for seed in sorted(r["seed"] for r in results if r["value"] == value and r["seed"] in reference_seeds):
            hypotheses = [_lines(store.point_path(sweep_dir, spec["key"], v, seed) / store.hypotheses_name(split))
                          for v in (spec["reference"], value)]
            p_values[value][seed] = paired_randomization(*hypotheses, references)
    return p_values


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").split("\n")[:-1]
