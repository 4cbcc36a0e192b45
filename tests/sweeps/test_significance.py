"""The significance helpers: the seed-level statistics against hand-worked numbers and SciPy, the per-pair tests
against sacreBLEU's own command line (`sacrebleu --paired-bs`, `--paired-ar`) on a small fixture."""

import json
import random
import subprocess
import sys

import math

import numpy as np
import pytest
from scipy import stats

from sweeps import significance, store

WORDS = "a man in a red shirt is riding a bike down the street while two dogs watch from the grass".split()


def fixture(n=60, seed=0):
    """References and two systems: the baseline drops one word in a few sentences, the other in most."""
    rng = random.Random(seed)
    references = [" ".join(rng.sample(WORDS, 10)) for _ in range(n)]

    def corrupt(rate):
        out = []
        for sentence in references:
            words = sentence.split()
            if rng.random() < rate:
                del words[rng.randrange(len(words))]
            out.append(" ".join(words))
        return out

    return references, corrupt(0.2), corrupt(0.6), corrupt(0.2)


def sacrebleu_cli_p_value(tmp_path, references, baseline, system, test="bs"):
    for name, lines in (("ref", references), ("base", baseline), ("sys", system)):
        (tmp_path / f"{name}.txt").write_text("".join(line + "\n" for line in lines))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "sacrebleu",
            "ref.txt",
            "-i",
            "base.txt",
            "sys.txt",
            f"--paired-{test}",
            f"--paired-{test}-n",
            "1000" if test == "bs" else "10000",
            "-m",
            "bleu",
            "-f",
            "json",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout)[1]["BLEU"]["p_value"]


def test_paired_bootstrap_matches_sacrebleu_cli(tmp_path):
    references, baseline, system, similar = fixture()
    expected = sacrebleu_cli_p_value(tmp_path, references, baseline, system)
    assert significance.paired_bootstrap(baseline, system, references) == pytest.approx(expected, abs=1e-12)
    assert expected < 0.05  # the fixture's difference is a real one ...
    chance = sacrebleu_cli_p_value(tmp_path, references, baseline, similar)
    assert significance.paired_bootstrap(baseline, similar, references) == pytest.approx(chance, abs=1e-12)
    assert chance > 0.05  # ... and one of chance only


def test_seed_pairs_compare_seed_k_with_reference_seed_k(tmp_path):
    references, baseline, system, _ = fixture()
    spec = {"key": "h", "reference": 8, "test_split": "test"}
    store.references_path(tmp_path, "test").write_text("".join(r + "\n" for r in references))
    hyps = {(8, 0): baseline, (8, 1): system, (4, 0): system, (4, 1): system, (4, 2): baseline}  # h4 seed 2 has no pair
    for (value, seed), lines in hyps.items():
        path = store.point_path(tmp_path, "h", value, seed) / store.hypotheses_name("test")
        path.parent.mkdir(parents=True)
        path.write_text("".join(line + "\n" for line in lines))
    results = [{"value": v, "seed": s} for v, s in hyps]
    p = significance.seed_pair_p_values(tmp_path, spec, results)
    assert list(p) == [4] and len(p[4]) == 2
    # the per-pair column is two-sided: sacreBLEU's paired approximate randomization, as `sacrebleu --paired-ar` runs it
    assert p[4][0] == pytest.approx(sacrebleu_cli_p_value(tmp_path, references, baseline, system, "ar"), abs=1e-12)
    assert p[4][1] == pytest.approx(sacrebleu_cli_p_value(tmp_path, references, system, system, "ar"), abs=1e-12)
    assert p[4][0] < 0.05


def test_mismatched_lengths_are_named():
    with pytest.raises(ValueError, match="same sentences"):
        significance.paired_bootstrap(["a b"], ["a b", "c"], ["a b"])


def test_paired_randomization_is_two_sided():
    references, baseline, system, _ = fixture()
    # |difference| is the statistic: swapping the systems gives the same p (a one-sided test would not)
    forward = significance.paired_randomization(baseline, system, references, trials=2000)
    backward = significance.paired_randomization(system, baseline, references, trials=2000)
    assert forward == pytest.approx(backward, abs=2e-3) and forward < 0.05


# Seed level. Hand-worked: point [1, 2, 3] against reference [4, 5, 6]: difference -3, each variance 1, so
# se = sqrt(1/3 + 1/3) = 0.8165, Welch df = (2/3)^2 / (2 (1/3)^2 / 2) = 4, pooled sd 1,
# Hedges' g = -3 (1 - 3/15) = -2.4.


def test_welch_against_hand_worked_numbers_and_scipy():
    difference, low, high, se, df, p = significance.welch([1.0, 2.0, 3.0], [4.0, 5.0, 6.0])
    assert (difference, df) == (pytest.approx(-3.0), pytest.approx(4.0))
    assert se == pytest.approx(math.sqrt(2 / 3), rel=1e-12)
    half = 2.7764451051977934 * math.sqrt(2 / 3)  # t_{0.975, 4}, from a table: 2.776
    assert (low, high) == (pytest.approx(-3 - half, rel=1e-9), pytest.approx(-3 + half, rel=1e-9))
    assert p == pytest.approx(stats.ttest_ind([1, 2, 3], [4, 5, 6], equal_var=False).pvalue, rel=1e-12)
    rng = np.random.default_rng(0)
    for n1, n2 in ((3, 3), (5, 3), (2, 7)):
        a, b = list(rng.normal(39.5, 0.6, n1)), list(rng.normal(40.0, 0.3, n2))
        d, low, high, se, df, p = significance.welch(a, b)
        reference = stats.ttest_ind(a, b, equal_var=False)
        assert p == pytest.approx(reference.pvalue, rel=1e-10) and df == pytest.approx(reference.df, rel=1e-10)
        ci = reference.confidence_interval(0.95)
        assert (low, high) == (pytest.approx(ci.low, rel=1e-10), pytest.approx(ci.high, rel=1e-10))
        assert d / se == pytest.approx(reference.statistic, rel=1e-10)


def test_hedges_g_hand_worked():
    assert significance.hedges_g([1.0, 2.0, 3.0], [4.0, 5.0, 6.0]) == pytest.approx(-2.4)
    # unequal sizes: [0, 2] (var 2) vs [1, 1, 4] (var 3): pooled var (2 + 6) / 3, d = (1 - 2) / 1.633, J = 1 - 3/11
    assert significance.hedges_g([0.0, 2.0], [1.0, 1.0, 4.0]) == pytest.approx(-1 / math.sqrt(8 / 3) * (1 - 3 / 11))
    assert math.isnan(significance.hedges_g([1.0], [2.0, 3.0]))


def test_holm_hand_worked():
    # sorted: 0.005 x 4 = 0.02, 0.01 x 3 = 0.03, 0.03 x 2 = 0.06, 0.04 x 1 = 0.04 -> kept monotone at 0.06
    assert significance.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    adjusted = significance.holm([0.2, math.nan, 0.01])  # an untested comparison does not count: m = 2
    assert adjusted[0] == pytest.approx(0.2) and math.isnan(adjusted[1]) and adjusted[2] == pytest.approx(0.02)
    assert significance.holm([0.6, 0.7]) == pytest.approx([1.0, 1.0])
    # a table that plans 3 comparisons but has run 2: the missing one counts (as p = 1), m = 3
    adjusted = significance.holm([0.025, math.nan, 0.2], planned=3)
    assert adjusted[0] == pytest.approx(0.075) and math.isnan(adjusted[1]) and adjusted[2] == pytest.approx(0.4)
    # hand-worked: sorted 0.025 x 3 = 0.075, 0.2 x 2 = 0.4 (the planned third, p = 1, x 1 = 1)


def test_tost_against_scipy_one_sided_tests_on_shifted_samples():
    rng = np.random.default_rng(1)
    a, b = list(rng.normal(40.0, 0.2, 5)), list(rng.normal(40.1, 0.2, 5))
    difference, _, _, se, df, _ = significance.welch(a, b)
    m = significance.MARGIN
    lower = stats.ttest_ind([x + m for x in a], b, equal_var=False, alternative="greater").pvalue
    upper = stats.ttest_ind([x - m for x in a], b, equal_var=False, alternative="less").pvalue
    assert significance.tost_p(difference, se, df) == pytest.approx(max(lower, upper), rel=1e-10)
    # TOST at level 0.05 is the 90 % CI inside (-m, +m)
    ci90 = stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.90)
    assert (significance.tost_p(difference, se, df) < 0.05) == (-m < ci90.low and ci90.high < m)
    with pytest.raises(ValueError, match="margin"):
        significance.tost_p(0.0, 1.0, 4.0, margin=0.0)


def two_sided_power(delta, df, alpha):
    """Power of a two-sided level-alpha t test whose statistic has noncentrality delta (both tails, SciPy's nct)."""
    critical = stats.t.ppf(1 - alpha / 2, df)
    return stats.nct.sf(critical, df, delta) + stats.nct.cdf(-critical, df, delta)


# statsmodels 0.15.0, TTestIndPower().solve_power(effect_size=None, nobs1=n, ratio=n2 / n, alpha=0.05 / m, power=0.8):
# the effect size, in pooled sds, a two-sample t test detects with 80 % power ((n, n2, m): d). At (3, 3, 16) its
# solver stops short (5.50, whose power by its own TTestIndPower().power is 0.64); there its power() at this
# module's 6.5083026 is 0.8000000 (STATSMODELS_POWER)
STATSMODELS_EFFECT_SIZES = {
    (3, 3, 1): 3.070892269599019,
    (3, 3, 3): 4.183960545558761,
    (5, 5, 1): 2.024440145655355,
    (5, 5, 3): 2.5093697528659935,
    (5, 5, 16): 3.3144050993659526,
    (10, 10, 1): 1.324947368330822,
    (10, 10, 3): 1.5744417669374757,
    (10, 10, 16): 1.9354156421598645,
    (5, 3, 1): 2.458832394325171,
    (5, 3, 5): 3.4816224626957935,
}
# statsmodels 0.15.0, TTestIndPower().power(effect_size=6.508302600127136, nobs1=3, ratio=1, alpha=0.05 / 16)
STATSMODELS_POWER = ((3, 16, 6.508302600127136), 0.7999999999999993)


def test_minimum_detectable_difference_against_statsmodels_and_the_noncentral_t():
    # with unit sd on both sides the pooled t's se is sqrt(1/n1 + 1/n2) and df n1 + n2 - 2: the detectable
    # difference is statsmodels' effect size (its solver stops at about 1e-8)
    for (n1, n2, m), effect in STATSMODELS_EFFECT_SIZES.items():
        se, df = math.sqrt(1 / n1 + 1 / n2), n1 + n2 - 2
        assert significance.minimum_detectable_difference(se, df, alpha=0.05 / m) == pytest.approx(effect, rel=1e-6)
    (n, m, effect), power = STATSMODELS_POWER
    assert significance.minimum_detectable_difference(math.sqrt(2 / n), 2 * n - 2, alpha=0.05 / m) == pytest.approx(
        effect, rel=1e-7
    )
    assert power == pytest.approx(0.8, abs=1e-12)
    for se, df, alpha in (
        (math.sqrt(2 / 3), 4.0, 0.05),
        (0.3, 2.5, 0.05 / 16),
        (0.2, 7.3, 0.01),
        (1.0, 40.0, 0.05 / 3),
    ):
        mdd = significance.minimum_detectable_difference(se, df, alpha)
        assert two_sided_power(mdd / se, df, alpha) == pytest.approx(0.8, abs=1e-9)
    # the normal-shift rule (t_{1 - alpha/2} + t_power) se falls short where the level is small and df few
    assert two_sided_power(stats.t.ppf(1 - 0.05 / 32, 4) + stats.t.ppf(0.8, 4), 4, 0.05 / 16) < 0.73
    assert math.isnan(significance.minimum_detectable_difference(0.0, 4.0))
    with pytest.raises(ValueError, match="alpha must be in"):
        significance.minimum_detectable_difference(1.0, 4.0, alpha=0.0)


def test_the_detectable_difference_is_at_the_familys_strictest_holm_level():
    rng = np.random.default_rng(3)
    reference = list(rng.normal(39.5, 0.5, 5))
    points = {v: list(rng.normal(39.0, 0.4, n)) for v, n in ((1, 3), (2, 5), (4, 3))}
    for planned, m in ((0, 3), (5, 5)):  # m: the family's size, its planned comparisons where more than are run
        compared = significance.table_comparisons(points, reference, planned=planned)
        for value, c in compared.items():
            assert c.mdd_alpha == pytest.approx(0.05 / m)
            welch = stats.ttest_ind(points[value], reference, equal_var=False)
            assert c.df == pytest.approx(welch.df, rel=1e-10)
            assert two_sided_power(c.mdd / c.se, welch.df, 0.05 / m) == pytest.approx(0.8, abs=1e-9)
            alone = significance.compare_seeds(points[value], reference)  # one comparison alone: at 0.05
            assert alone.mdd_alpha == 0.05 and alone.mdd < c.mdd
            assert (c.p, c.difference) == (alone.p, alone.difference)  # the primary test itself does not move


def test_samples_accept_numpy_numbers_and_refuse_booleans_naming_the_argument():
    point32 = np.array([38.95, 38.93, 38.94], dtype=np.float32)
    reference = [38.35, 38.36, 38.08, 37.60, 37.63]
    compared = significance.compare_seeds(list(point32), reference)  # numpy.float32 scalars
    expected = stats.ttest_ind(point32.astype(np.float64), reference, equal_var=False)
    assert compared.p == pytest.approx(expected.pvalue, rel=1e-10) and all(type(x) is float for x in compared.point)
    assert significance.welch(point32, np.array(reference))[5] == pytest.approx(expected.pvalue, rel=1e-10)
    assert significance.hedges_g([np.int64(1), np.int32(2), 3], [4.0, 5.0, 6.0]) == pytest.approx(
        -2.4
    )  # hand-worked above
    for bad, name in (([True, 39.0], "point"), ([np.bool_(False), 39.0], "point")):
        with pytest.raises(ValueError, match=f"{name}\\[0\\] is the boolean"):
            significance.compare_seeds(bad, reference)
    with pytest.raises(ValueError, match="reference\\[1\\] is the boolean"):
        significance.welch([39.0, 38.0], [39.0, True])
    with pytest.raises(ValueError, match="point must be one or more finite per-seed BLEU scores"):
        significance.compare_seeds([39.0, math.nan], reference)
    with pytest.raises(ValueError, match="reference must be one or more finite"):
        significance.hedges_g([39.0], "39")


def test_paired_seeds_against_scipy_ttest_rel_over_the_shared_seeds():
    rng = np.random.default_rng(4)
    shared = rng.normal(0.0, 0.5, 8)  # a seed's data order moves both points alike
    point = {s: 38.5 + shared[s] + rng.normal(0, 0.2) for s in range(5)}
    reference = {s: 39.5 + shared[s] + rng.normal(0, 0.2) for s in (0, 1, 2, 4, 7)}  # seeds 3 and 7 unpaired
    c = significance.paired_seeds(point, reference)
    seeds = [0, 1, 2, 4]
    expected = stats.ttest_rel([point[s] for s in seeds], [reference[s] for s in seeds])
    assert c.seeds == (0, 1, 2, 4) and c.df == 3
    assert c.p == pytest.approx(expected.pvalue, rel=1e-10) and c.difference / c.se == pytest.approx(
        expected.statistic, rel=1e-10
    )
    ci = expected.confidence_interval(0.95)
    assert (c.ci_low, c.ci_high) == (pytest.approx(ci.low, rel=1e-10), pytest.approx(ci.high, rel=1e-10))
    # the blocks take out the shared seed variance: Welch on the same seeds finds the difference less sure
    assert c.p < stats.ttest_ind([point[s] for s in seeds], [reference[s] for s in seeds], equal_var=False).pvalue
    one = significance.paired_seeds({0: 39.0, 1: 38.0}, {1: 39.0, 2: 38.0})  # one shared seed: no variance
    assert one.seeds == (1,) and one.difference == -1.0 and math.isnan(one.p)
    with pytest.raises(ValueError, match="must map seed -> per-seed BLEU"):
        significance.paired_seeds([39.0, 38.0], {0: 39.0})


def test_pooled_contrasts_against_a_pooled_t_by_hand_and_scipy():
    groups = {"a": [39.8, 40.2, 39.5, 40.1, 39.4], "b": [38.1, 38.6, 38.2], "c": [39.6, 40.4, 39.9], "d": [41.0]}
    contrasts = {"b - a": ("a", "b"), "c - b": ("b", "c"), "d - a": ("a", "d")}
    got = significance.pooled_contrasts(groups, contrasts)
    values = {k: np.array(v) for k, v in groups.items()}
    df = sum(map(len, values.values())) - len(values)  # 12 runs in 4 groups: 8 df ("d", one seed, adds none)
    s2 = sum(((v - v.mean()) ** 2).sum() for v in values.values()) / df
    # one-way ANOVA agrees: SciPy's F is the between-group mean square over this within-group one
    between = sum(len(v) * (v.mean() - np.concatenate(list(values.values())).mean()) ** 2 for v in values.values()) / (
        len(values) - 1
    )
    assert between / s2 == pytest.approx(stats.f_oneway(*values.values()).statistic, rel=1e-10)
    for label, (start, to) in contrasts.items():
        difference = values[to].mean() - values[start].mean()
        se = math.sqrt(s2 * (1 / len(values[start]) + 1 / len(values[to])))
        t = difference / se
        assert got[label].df == df and got[label].difference == pytest.approx(difference, rel=1e-12)
        assert got[label].p == pytest.approx(2 * stats.t.sf(abs(t), df), rel=1e-10)
        half = stats.t.ppf(0.975, df) * se
        assert (got[label].ci_low, got[label].ci_high) == (
            pytest.approx(difference - half),
            pytest.approx(difference + half),
        )
    # two groups alone: the pooled model is Student's t
    two = significance.pooled_contrasts({k: groups[k] for k in "ab"}, {"x": ("a", "b")})["x"]
    assert two.p == pytest.approx(stats.ttest_ind(groups["b"], groups["a"], equal_var=True).pvalue, rel=1e-10)
    with pytest.raises(ValueError, match="contrasts\\['y'\\] must be \\(from, to\\)"):
        significance.pooled_contrasts(groups, {"y": ("a", "z")})
    with pytest.raises(ValueError, match="groups\\['b'\\]\\[0\\] is the boolean"):
        significance.pooled_contrasts({"a": [1.0, 2.0], "b": [True, 2.0]}, {})


def test_sensitivity_tests_take_holm_over_the_same_family():
    rng = np.random.default_rng(5)
    reference = {s: x for s, x in enumerate(rng.normal(39.5, 0.5, 5))}
    points = {v: {s: x for s, x in enumerate(rng.normal(39.0, 0.5, 3))} for v in (1, 2, 4)}
    paired = significance.adjust({v: significance.paired_seeds(p, reference) for v, p in points.items()}, planned=5)
    raw = [paired[v].p for v in points]
    assert [paired[v].p_holm for v in points] == pytest.approx(significance.holm(raw, planned=5))
    # Holm by hand over m = 5: the smallest raw p times 5
    assert min(paired[v].p_holm for v in points) == pytest.approx(min(1.0, 5 * min(raw)))
    groups = {0: list(reference.values()), **{v: list(p.values()) for v, p in points.items()}}
    pooled = significance.adjust(significance.pooled_contrasts(groups, {v: (0, v) for v in points}), planned=5)
    assert [pooled[v].p_holm for v in points] == pytest.approx(
        significance.holm([pooled[v].p for v in points], planned=5)
    )
    assert not hasattr(paired[1], "verdict")  # a sensitivity analysis gives no verdict


def test_table_comparisons_adjust_over_the_table_and_give_the_verdicts():
    reference = [40.0, 40.2, 39.8, 40.1, 39.9]
    points = {
        "far": [38.0, 38.2, 37.8, 38.1, 37.9],  # 2 BLEU lower, tiny spread
        "close": [40.02, 40.18, 39.83, 40.1, 39.91],  # within ±0.5 and tight
        "noisy": [39.0, 41.0, 38.5, 41.5, 40.0],  # wide: neither
        "one": [40.0],
    }  # one seed: untested
    compared = significance.table_comparisons(points, reference)
    raw = [compared[v].p for v in ("far", "close", "noisy")]
    assert [compared[v].p_holm for v in ("far", "close", "noisy")] == pytest.approx(significance.holm(raw))
    assert compared["far"].verdict == "lower" and compared["far"].difference == pytest.approx(-2.0)
    assert compared["close"].verdict == "equivalent within ±0.5"
    assert compared["noisy"].verdict == "undetermined"
    assert compared["one"].verdict == "undetermined" and math.isnan(compared["one"].p)
    assert compared["far"].p_holm == pytest.approx(min(1.0, 3 * compared["far"].p))  # the smallest of 3 tested, x 3
    with pytest.raises(ValueError, match="finite per-seed BLEU"):
        significance.compare_seeds([], reference)
