"""Does a sweep point's test BLEU differ from the reference point's, and by how much? (docs/sweeps.md, "Significance")

Primary, seed level (`compare_seeds`, `table_comparisons`): the unit of replication is the training
run. A point's seeds and the reference's seeds are compared as two independent samples of "train this
config once and score it" (Welch's t on per-seed test BLEU), although they are not quite independent:
seed k fixes the data order of every point that runs it (a different width makes the same
initialisation seed a different initialisation, but the batches come in the same order), so seed k
of one point and seed k of another covary (across rows A's five seeds, h = 32 and d_k = 8 each
correlate about +0.8 with h = 8). Welch gives the mean difference, its 95 % confidence interval and
a two-sided p (unequal variances: a point can be noisier than the reference); Hedges' g is the
effect size (the difference in pooled seed sds, with the small-sample correction); Holm's step-down
adjustment runs over one table's comparisons; TOST at ±`MARGIN` BLEU tests equivalence; the minimum
detectable difference is what this many seeds find with `POWER` at Holm's strictest level over the
family, two-sided `ALPHA` / m for m comparisons (`adjust`). A verdict is "lower" or "higher"
(Holm-adjusted two-sided p < ALPHA), "equivalent within ±MARGIN" (Holm-adjusted TOST p < ALPHA), else
"undetermined".

Sensitivity, no verdicts (`paired_seeds`, `pooled_contrasts`): the same comparisons under two other
models of the seeds, Holm over the same family (`adjust`). Seeds as blocks: a paired t test over the
seeds both points have, since a seed fixes the data order. One pooled variance: a residual variance
pooled over every point of a table (one-way ANOVA's), each contrast's t against it with its df.

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
import numbers
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from sacrebleu.metrics import BLEU
from sacrebleu.significance import PairedTest
from scipy import optimize, stats

from sweeps import store

RESAMPLES = 1000  # paired bootstrap resamples (sacreBLEU's default)
AR_TRIALS = 10000  # approximate randomization trials (sacreBLEU's default for --paired-ar)
ALPHA = 0.05  # two-sided test level, after Holm's adjustment
POWER = 0.8  # for the minimum detectable difference (at Holm's strictest level over its family: `adjust`)
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
    `tost_p` the equivalence p at ±MARGIN; `mdd` the minimum detectable difference at the two-sided level
    `mdd_alpha` (ALPHA for one comparison alone; `adjust` sets Holm's strictest step, ALPHA / m, over a
    family of m). NaN where fewer than two seeds on either side leave no variance to test with.
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
    mdd_alpha: float = ALPHA

    def with_holm(self, p_holm: float, tost_p_holm: float, family: int) -> SeedComparison:
        """This comparison as one of a Holm family of `family` comparisons: its adjusted p-values, and its
        detectable difference at the family's strictest Holm level, ALPHA / family."""
        level = ALPHA / family
        return dataclasses.replace(
            self,
            p_holm=p_holm,
            tost_p_holm=tost_p_holm,
            mdd_alpha=level,
            mdd=minimum_detectable_difference(self.se, self.df, level),
        )

    @property
    def verdict(self) -> str:
        if self.p_holm < ALPHA:
            return "lower" if self.difference < 0 else "higher"
        if self.tost_p_holm < ALPHA:
            return VERDICTS[2]
        return "undetermined"


@dataclasses.dataclass(frozen=True)
class Sensitivity:
    """One comparison under a sensitivity analysis's model of the seeds (`paired_seeds`, `pooled_contrasts`):
    no verdict, only the numbers beside the primary analysis's. difference = mean(to) - mean(from) (paired:
    the mean of the per-seed differences over `seeds`, the seeds both sides have), its two-sided CI
    (ci_low, ci_high), standard error `se`, degrees of freedom `df`, two-sided `p`, and `p_holm` once
    `adjust` has run over the family. NaN where the model leaves no variance to test with.
    """

    difference: float
    ci_low: float
    ci_high: float
    se: float
    df: float
    p: float
    seeds: tuple[int, ...] = ()
    p_holm: float = math.nan
    tost_p: ClassVar[float] = math.nan  # no equivalence test here: `adjust` treats every comparison alike

    def with_holm(self, p_holm: float, tost_p_holm: float, family: int) -> Sensitivity:
        """This comparison as one of a Holm family (`family` and `tost_p_holm` are not used: no verdict here)."""
        return dataclasses.replace(self, p_holm=p_holm)


def welch(
    point: Sequence[float], reference: Sequence[float], confidence: float = 0.95
) -> tuple[float, float, float, float, float, float]:
    """(difference, ci_low, ci_high, se, df, two-sided p) of mean(point) - mean(reference), Welch's t test."""
    point, reference = _check_samples(point, reference)
    n1, n2 = len(point), len(reference)
    difference = statistics.fmean(point) - statistics.fmean(reference)
    if n1 < 2 or n2 < 2:
        return difference, math.nan, math.nan, math.nan, math.nan, math.nan
    v1, v2 = statistics.variance(point) / n1, statistics.variance(reference) / n2
    se = math.sqrt(v1 + v2)
    if se == 0:  # every seed alike on both sides: no spread to test against
        return difference, math.nan, math.nan, math.nan, math.nan, math.nan
    df = (v1 + v2) ** 2 / (v1**2 / (n1 - 1) + v2**2 / (n2 - 1))  # Welch-Satterthwaite
    t = difference / se
    half = stats.t.ppf(0.5 + confidence / 2, df) * se
    return difference, float(difference - half), float(difference + half), se, df, float(2 * stats.t.sf(abs(t), df))


def hedges_g(point: Sequence[float], reference: Sequence[float]) -> float:
    """(mean(point) - mean(reference)) / pooled sample sd, times Hedges' correction 1 - 3 / (4 (n1 + n2) - 9)."""
    point, reference = _check_samples(point, reference)
    n1, n2 = len(point), len(reference)
    if n1 < 2 or n2 < 2:
        return math.nan
    pooled = math.sqrt(
        ((n1 - 1) * statistics.variance(point) + (n2 - 1) * statistics.variance(reference)) / (n1 + n2 - 2)
    )
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
    delta * se, where the t statistic's noncentral t distribution (df, noncentrality delta) puts `power`
    beyond the critical values +-t_{1 - alpha/2}. Exact, where the normal-shift rule (t_{1 - alpha/2} +
    t_{power}) * se falls short of `power` at small df and small alpha (0.72 at df 4 and alpha 0.05 / 16)."""
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
    if not 0 < power < 1:
        raise ValueError(f"power must be in (0, 1), got {power!r}")
    if not (se > 0 and df > 0):
        return math.nan
    critical = stats.t.ppf(1 - alpha / 2, df)

    def shortfall(delta: float) -> float:  # both tails; the lower one as the upper tail of -delta (stable)
        return stats.nct.sf(critical, df, delta) + stats.nct.sf(critical, df, -delta) - power

    high = critical + stats.t.ppf(power, df)  # the normal-shift rule: at or below the exact delta
    while shortfall(high) < 0:
        high *= 2
    return float(optimize.brentq(shortfall, 0.0, high, xtol=1e-12, rtol=1e-12) * se)


def holm(p_values: Sequence[float], planned: int = 0) -> list[float]:
    """Holm's step-down adjusted p-values, in the input's order. NaN (an untested comparison) stays NaN.

    `planned`: the number of comparisons the table sets out to make, when more than are tested (points not
    run yet): they count as p = 1, so a verdict reached on a partial table does not weaken as it fills up.
    """
    tested = sorted((p, i) for i, p in enumerate(p_values) if not math.isnan(p))
    m = family_size(p_values, planned)
    adjusted = [math.nan] * len(p_values)
    running = 0.0
    for rank, (p, i) in enumerate(tested):
        running = max(running, min(1.0, (m - rank) * p))
        adjusted[i] = running
    return adjusted


def family_size(p_values: Sequence[float], planned: int = 0) -> int:
    """The m of Holm's adjustment: the comparisons tested (p not NaN), or `planned` if more (at least 1)."""
    return max(1, sum(not math.isnan(p) for p in p_values), planned)


def compare_seeds(point: Sequence[float], reference: Sequence[float]) -> SeedComparison:
    """One point against the reference (unadjusted: `table_comparisons` adds Holm's adjustment)."""
    point, reference = _check_samples(point, reference)
    difference, low, high, se, df, p = welch(point, reference)
    return SeedComparison(
        point,
        reference,
        difference,
        low,
        high,
        se,
        df,
        p,
        hedges_g(point, reference),
        tost_p(difference, se, df),
        minimum_detectable_difference(se, df),
    )


def adjust(
    compared: Mapping[Any, SeedComparison | Sensitivity], planned: int = 0
) -> dict[Any, SeedComparison | Sensitivity]:
    """`compared` with Holm's adjustment over its comparisons (at least `planned` of them), separately for the
    difference tests and the equivalence tests: one family, whatever the keys name (values, contrasts, a study).
    A SeedComparison's detectable difference moves to the family's strictest Holm level, ALPHA / m."""
    tests = list(compared.values())
    family = family_size([c.p for c in tests], planned)
    p_holm = holm([c.p for c in tests], planned)
    tost_holm = holm([c.tost_p for c in tests], planned)
    return {key: c.with_holm(p, t, family) for (key, c), p, t in zip(compared.items(), p_holm, tost_holm)}


def table_comparisons(
    points: Mapping[int | str, Sequence[float]], reference: Sequence[float], planned: int = 0
) -> dict[int | str, SeedComparison]:
    """Every point of one table against the reference, Holm-adjusted over the table's comparisons (`adjust`)."""
    return adjust({value: compare_seeds(bleu, reference) for value, bleu in points.items()}, planned)


def paired_seeds(point: Mapping[int, float], reference: Mapping[int, float], confidence: float = 0.95) -> Sensitivity:
    """Seeds as blocks: the paired t test of point - reference over the seeds both have ({seed: test BLEU}
    each), two-sided, with its `confidence` interval. A seed fixes the data order, so seed k of the two
    points shares it; the seeds only one side has are left out. NaN with fewer than two shared seeds or
    every paired difference alike."""
    for name, sample in (("point", point), ("reference", reference)):
        if not isinstance(sample, Mapping):
            raise ValueError(f"{name} must map seed -> per-seed BLEU, got {type(sample).__name__}")
        _check_sample(name, list(sample.values()))
    seeds = tuple(sorted(set(point) & set(reference)))
    differences = [float(point[s]) - float(reference[s]) for s in seeds]
    difference = statistics.fmean(differences) if differences else math.nan
    if len(seeds) < 2 or statistics.stdev(differences) == 0:
        return Sensitivity(difference, math.nan, math.nan, math.nan, math.nan, math.nan, seeds)
    se = statistics.stdev(differences) / math.sqrt(len(seeds))
    return Sensitivity(difference, *_t_test(difference, se, len(seeds) - 1, confidence), seeds)


def paired_comparison(point: Mapping[int, float], reference: Mapping[int, float]) -> SeedComparison:
    """Seeds as blocks, as a primary analysis (a registered design: `sweeps.registered`): the paired t test of
    point - reference ({seed: test BLEU} each, the same seeds on both sides), two-sided, its 95 % interval,
    TOST at ±MARGIN and the detectable difference on the paired standard error sd(d) / sqrt(n), n - 1 df.
    Unadjusted (`adjust` adds Holm's); `hedges_g` is NaN (no between-run effect size for paired runs)."""
    blocked = paired_seeds(point, reference)  # checks both samples
    if set(point) != set(reference):
        raise ValueError(
            f"a paired comparison needs the same seeds on both sides, got point {sorted(point)} "
            f"and reference {sorted(reference)}"
        )
    return SeedComparison(
        tuple(float(point[s]) for s in blocked.seeds),
        tuple(float(reference[s]) for s in blocked.seeds),
        blocked.difference,
        blocked.ci_low,
        blocked.ci_high,
        blocked.se,
        blocked.df,
        blocked.p,
        math.nan,
        tost_p(blocked.difference, blocked.se, blocked.df),
        minimum_detectable_difference(blocked.se, blocked.df),
    )


def pooled_contrasts(
    groups: Mapping[Any, Sequence[float]], contrasts: Mapping[Any, tuple[Any, Any]], confidence: float = 0.95
) -> dict[Any, Sensitivity]:
    """One pooled variance: each contrast (from, to) of `groups` (point -> per-seed BLEU) as mean(to) -
    mean(from), tested against one residual variance pooled over every group, s^2 = the sum of squares about
    each group's own mean / (N - G) for N runs in G groups (one-way ANOVA's within-group mean square), with
    se = s sqrt(1/n_from + 1/n_to) and N - G degrees of freedom; two-sided, with its `confidence` interval.
    It assumes every point as noisy as every other (Welch does not) and gains degrees of freedom from the
    points the contrast does not involve. NaN where N - G is 0 or every group's seeds agree."""
    samples = {key: _check_sample(f"groups[{key!r}]", sample) for key, sample in groups.items()}
    _check_contrasts(contrasts, samples)
    df = sum(len(x) for x in samples.values()) - len(samples)
    squares = sum(sum((v - statistics.fmean(x)) ** 2 for v in x) for x in samples.values())
    s = math.sqrt(squares / df) if df > 0 else math.nan
    out = {}
    for label, (start, to) in contrasts.items():
        difference = statistics.fmean(samples[to]) - statistics.fmean(samples[start])
        se = s * math.sqrt(1 / len(samples[start]) + 1 / len(samples[to]))
        out[label] = (
            Sensitivity(difference, *_t_test(difference, se, df, confidence))
            if se > 0
            else Sensitivity(difference, math.nan, math.nan, math.nan, math.nan, math.nan)
        )
    return out


def blocked_contrasts(
    groups: Mapping[Any, Mapping[int, float]], contrasts: Mapping[Any, tuple[Any, Any]], confidence: float = 0.95
) -> dict[Any, Sensitivity]:
    """A two-way additive model, point + seed block, fitted to every run of `groups` (point -> {seed: test BLEU},
    the same seeds for every point: a complete block design). Each contrast (from, to) is mean(to) - mean(from)
    (the seed effects cancel in a complete design), tested against the model's residual variance, s^2 = the sum
    of (y_ps - mean_p - mean_s + grand mean)^2 over the P points and S seeds / ((P - 1)(S - 1)), with
    se = s sqrt(2 / S) and (P - 1)(S - 1) degrees of freedom; two-sided, with its `confidence` interval. Like
    the paired test it removes what a seed shares across points; like one pooled variance it assumes every
    point as noisy as every other and gains degrees of freedom from the points the contrast does not involve.
    With two points it is the paired t test. NaN where the residual variance is 0."""
    for key, sample in groups.items():
        if not isinstance(sample, Mapping):
            raise ValueError(f"groups[{key!r}] must map seed -> per-seed BLEU, got {type(sample).__name__}")
        _check_sample(f"groups[{key!r}]", list(sample.values()))
    seed_sets = {key: sorted(sample) for key, sample in groups.items()}
    seeds = next(iter(seed_sets.values()), [])
    if len(groups) < 2 or len(seeds) < 2 or any(s != seeds for s in seed_sets.values()):
        raise ValueError(
            "a two-way (point + seed) model needs two or more points with the same two or more seeds each, "
            f"got seeds {seed_sets}"
        )
    _check_contrasts(contrasts, groups)
    y = np.array([[float(groups[key][seed]) for seed in seeds] for key in groups])  # points x seeds
    residuals = y - y.mean(axis=1, keepdims=True) - y.mean(axis=0, keepdims=True) + y.mean()
    df = (y.shape[0] - 1) * (y.shape[1] - 1)
    s = math.sqrt(float((residuals**2).sum()) / df)
    row = {key: i for i, key in enumerate(groups)}
    out = {}
    for label, (start, to) in contrasts.items():
        difference = float(y[row[to]].mean() - y[row[start]].mean())
        se = s * math.sqrt(2 / len(seeds))
        out[label] = (
            Sensitivity(difference, *_t_test(difference, se, df, confidence), tuple(seeds))
            if se > 0
            else Sensitivity(difference, math.nan, math.nan, math.nan, math.nan, math.nan, tuple(seeds))
        )
    return out


def _check_contrasts(contrasts: Mapping[Any, tuple[Any, Any]], groups: Mapping[Any, object]) -> None:
    """ValueError unless every contrast is (from, to), two keys of `groups`."""
    for label, pair in contrasts.items():
        if not (isinstance(pair, tuple) and len(pair) == 2 and all(side in groups for side in pair)):
            raise ValueError(
                f"contrasts[{label!r}] must be (from, to), two keys of groups {sorted(map(str, groups))}, got {pair!r}"
            )


def _t_test(difference: float, se: float, df: float, confidence: float) -> tuple[float, float, float, float, float]:
    """(ci_low, ci_high, se, df, two-sided p) of a t statistic difference / se on df degrees of freedom."""
    half = stats.t.ppf(0.5 + confidence / 2, df) * se
    return (
        float(difference - half),
        float(difference + half),
        se,
        float(df),
        float(2 * stats.t.sf(abs(difference / se), df)),
    )


def _check_samples(point, reference) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Both samples as floats (`_check_sample`)."""
    return _check_sample("point", point), _check_sample("reference", reference)


def _check_sample(name: str, sample) -> tuple[float, ...]:
    """`sample` as floats: one or more finite real numbers (Python's or NumPy's ints and floats, such as
    numpy.float32); a boolean is refused (True is not a BLEU score, though Python counts it an int)."""
    if isinstance(sample, (str, bytes)) or not isinstance(sample, Sequence | np.ndarray) or len(sample) < 1:
        raise ValueError(f"{name} must be one or more finite per-seed BLEU scores, got {sample!r}")
    for i, x in enumerate(sample):
        if isinstance(x, bool | np.bool_):
            raise ValueError(f"{name}[{i}] is the boolean {x!r}: {name} must be finite per-seed BLEU scores (numbers)")
        if not (isinstance(x, numbers.Real) and math.isfinite(x)):
            raise ValueError(f"{name} must be one or more finite per-seed BLEU scores, got {list(sample)!r}")
    return tuple(float(x) for x in sample)


def _paired_test(baseline, system, references, test_type: str, samples: int) -> float:
    if not len(baseline) == len(system) == len(references):
        raise ValueError(
            f"baseline, system and references must be the same sentences: got {len(baseline)}, {len(system)} "
            f"and {len(references)} lines"
        )
    logger = logging.getLogger("sacrebleu")  # it narrates each test at INFO; a table takes dozens
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        test = PairedTest(
            [("baseline", list(baseline)), ("system", list(system))],
            {"BLEU": BLEU()},
            [list(references)],
            test_type=test_type,
            n_samples=samples,
        )
        _, scores = test()
    finally:
        logger.setLevel(level)
    return scores["BLEU"][1].p_value


def paired_bootstrap(
    baseline: Sequence[str], system: Sequence[str], references: Sequence[str], resamples: int = RESAMPLES
) -> float:
    """sacreBLEU's paired bootstrap p (`--paired-bs`; 13a, cased, one reference): one-sided in effect."""
    return _paired_test(baseline, system, references, "bs", resamples)


def paired_randomization(
    baseline: Sequence[str], system: Sequence[str], references: Sequence[str], trials: int = AR_TRIALS
) -> float:
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
            hypotheses = [
                _lines(store.point_path(sweep_dir, spec["key"], v, seed) / store.hypotheses_name(split))
                for v in (spec["reference"], value)
            ]
            p_values[value][seed] = paired_randomization(*hypotheses, references)
    return p_values


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").split("\n")[:-1]
