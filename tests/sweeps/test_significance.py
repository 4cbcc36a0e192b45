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
    done = subprocess.run([sys.executable, "-m", "sacrebleu", "ref.txt", "-i", "base.txt", "sys.txt", f"--paired-{test}",
                           f"--paired-{test}-n", "1000" if test == "bs" else "10000", "-m", "bleu", "-f", "json"], cwd=tmp_path, capture_output=True, text=True, check=True)
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
# se = sqrt(1/3 + 1/3) = 0.8165, Welch df = (2/3)^2 / (2 (1/3)^2 / 2) = 4, pooled sd 1, Hedges' g = -3 (1 - 3/15) = -2.4.


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


def test_minimum_detectable_difference_has_the_stated_power():
    assert significance.minimum_detectable_difference(math.sqrt(2 / 3), 4.0) == pytest.approx(
        (2.7764451051977934 + 0.9409645772351816) * math.sqrt(2 / 3), rel=1e-9)  # t_{0.975, 4} + t_{0.8, 4}
    for n in (3, 5, 10):  # two-sided power of a t test shifted by the MDD, from the noncentral t: ~0.8
        se, df = math.sqrt(2 * 0.25 / n), 2 * n - 2
        shift = significance.minimum_detectable_difference(se, df) / se
        critical = stats.t.ppf(0.975, df)
        power = stats.nct.sf(critical, df, shift) + stats.nct.cdf(-critical, df, shift)
        assert power == pytest.approx(0.8, abs=0.01)


def test_table_comparisons_adjust_over_the_table_and_give_the_verdicts():
    reference = [40.0, 40.2, 39.8, 40.1, 39.9]
    points = {"far": [38.0, 38.2, 37.8, 38.1, 37.9],  # 2 BLEU lower, tiny spread
              "close": [40.02, 40.18, 39.83, 40.1, 39.91],  # within ±0.5 and tight
              "noisy": [39.0, 41.0, 38.5, 41.5, 40.0],  # wide: neither
              "one": [40.0]}  # one seed: untested
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
