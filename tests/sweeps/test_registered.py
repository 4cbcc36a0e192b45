"""The registered analysis (sweeps/registered.py): paired by seed against SciPy, Holm by hand, complete or refused."""

import json
import math
import types

import numpy as np
import pytest
from scipy import stats

from sweeps import registered, significance, store

CONTRASTS = [["shrink", "big", "small"], ["widen", "small", "wide"]]
SPEC = {"name": "blocked", "key": "shape", "values": ["big", "small", "wide"], "reference": "big", "seeds": 5}
SEEDS = [10, 11, 12, 13, 14]
MACHINE = "cpu|cpu|Intel(R) Xeon(R) Processor, native bf16|jax 0.12.1|jaxlib 0.12.1|matmul auto"


def runs(means, seeds=SEEDS, seed_sd=0.6, noise=0.15, commit="a" * 40):
    """Results as result.json holds them: each seed shifts every point alike (it fixes the data order)."""
    rng = np.random.default_rng(0)
    shared = {s: rng.normal(0.0, seed_sd) for s in seeds}
    return [
        {"value": v, "seed": s, "test_bleu": m + shared[s] + rng.normal(0, noise), "commit": commit, "machine": MACHINE}
        for v, m in means.items()
        for s in seeds
    ]


def test_a_paired_comparison_is_scipys_paired_t_with_tost_on_the_paired_error():
    rng = np.random.default_rng(3)
    shared = rng.normal(0, 0.5, 5)
    to = {s: 38.4 + shared[i] + rng.normal(0, 0.2) for i, s in enumerate(SEEDS)}
    start = {s: 39.0 + shared[i] + rng.normal(0, 0.2) for i, s in enumerate(SEEDS)}
    c = significance.paired_comparison(to, start)
    a, b = [to[s] for s in SEEDS], [start[s] for s in SEEDS]
    expected = stats.ttest_rel(a, b)
    assert c.p == pytest.approx(expected.pvalue, rel=1e-10) and c.df == 4
    ci = expected.confidence_interval(0.95)
    assert (c.ci_low, c.ci_high) == (pytest.approx(ci.low, rel=1e-10), pytest.approx(ci.high, rel=1e-10))
    m = significance.MARGIN  # TOST: two one-sided paired t tests against the margins
    lower = stats.ttest_rel([x + m for x in a], b, alternative="greater").pvalue
    upper = stats.ttest_rel([x - m for x in a], b, alternative="less").pvalue
    assert c.tost_p == pytest.approx(max(lower, upper), rel=1e-10)
    assert math.isnan(c.hedges_g) and c.point == tuple(a) and c.reference == tuple(b)
    with pytest.raises(ValueError, match="the same seeds on both sides"):
        significance.paired_comparison(to, {s: start[s] for s in SEEDS[:4]})


def test_contrasts_are_paired_by_seed_and_holm_adjusted_over_the_family():
    results = runs({"big": 39.0, "small": 37.5, "wide": 37.5})
    tests = registered.comparisons(results, {**SPEC, "contrasts": CONTRASTS}, SEEDS)
    bleu = {(r["value"], r["seed"]): r["test_bleu"] for r in results}
    p = {
        label: stats.ttest_rel([bleu[b, s] for s in SEEDS], [bleu[a, s] for s in SEEDS]).pvalue
        for label, a, b in CONTRASTS
    }
    small, large = sorted(p.values())  # Holm over two, by hand: 2 p_(1), then max(that, p_(2))
    holm = {label: (2 * small if q == small else max(2 * small, large)) for label, q in p.items()}
    for label, c in tests.items():
        assert c.p == pytest.approx(p[label], rel=1e-10) and c.p_holm == pytest.approx(min(1, holm[label]), rel=1e-10)
    assert tests["shrink"].verdict == "lower"
    assert tests["widen"].verdict in ("undetermined", f"equivalent within ±{significance.MARGIN:g}")


def test_an_incomplete_design_is_refused_naming_the_missing_runs():
    results = [r for r in runs({"big": 39.0, "small": 38.0, "wide": 38.0}) if (r["value"], r["seed"]) != ("wide", 13)]
    with pytest.raises(
        ValueError, match=r"not complete at seeds \[10, 11, 12, 13, 14\]: 1 run\(s\) missing \(wide seed 13\)"
    ):
        registered.comparisons(results, {**SPEC, "contrasts": CONTRASTS}, SEEDS)
    with pytest.raises(ValueError, match="names no contrasts"):
        registered.comparisons(results, SPEC, SEEDS)
    with pytest.raises(ValueError, match=r"--missing small:13: stored"):  # a run that is in is analysed
        registered.comparisons(results, {**SPEC, "contrasts": CONTRASTS}, SEEDS, [("wide", 13), ("small", 13)])


def test_a_run_declared_missing_removes_its_block_from_the_comparisons_it_enters():
    results = [r for r in runs({"big": 39.0, "small": 37.5, "wide": 37.5}) if (r["value"], r["seed"]) != ("wide", 13)]
    spec = {**SPEC, "contrasts": CONTRASTS}
    tests = registered.comparisons(results, spec, SEEDS, [("wide", 13)])
    bleu = {(r["value"], r["seed"]): r["test_bleu"] for r in results}
    four = [s for s in SEEDS if s != 13]
    p = {
        "shrink": stats.ttest_rel([bleu["small", s] for s in SEEDS], [bleu["big", s] for s in SEEDS]).pvalue,
        "widen": stats.ttest_rel([bleu["wide", s] for s in four], [bleu["small", s] for s in four]).pvalue,
    }
    assert tests["shrink"].df == 4 and tests["widen"].df == 3
    for label, q in p.items():
        assert tests[label].p == pytest.approx(q, rel=1e-10)
    # the two-way model keeps the seeds every point has (four); Welch every stored run
    models = registered.sensitivity(registered.registered_design(results, spec, SEEDS, [("wide", 13)]), spec)
    assert models["two_way"]["widen"].df == (3 - 1) * (4 - 1)
    welch = stats.ttest_ind([bleu["wide", s] for s in four], [bleu["small", s] for s in SEEDS], equal_var=False)
    assert models["welch"]["widen"].p == pytest.approx(welch.pvalue, rel=1e-9)
    # a contrast left with one block is untested, and Holm still runs over the registered family of two
    gone = [("wide", s) for s in (10, 11, 12, 13)]
    left = [r for r in results if (r["value"], r["seed"]) not in gone]
    untested = registered.comparisons(left, spec, SEEDS, gone)
    assert math.isnan(untested["widen"].p) and untested["widen"].verdict == "undetermined"
    assert untested["shrink"].p_holm == pytest.approx(min(1, 2 * p["shrink"]), rel=1e-10)
    # one seed left that every point has: the two-way model is not fitted ("–"), the rest still printed
    models = registered.sensitivity(registered.registered_design(left, spec, SEEDS, gone), spec)
    assert all(math.isnan(c.p) for c in models["two_way"].values()) and not math.isnan(models["welch"]["shrink"].p)
    assert "| 2 | widen | " in registered.markdown(left, spec, SEEDS, "results/prereg.md", gone, "never run")
    text = registered.markdown(results, spec, SEEDS, "results/prereg.md", [("wide", 13)], "stopped twice by the guard")
    assert "**Missing runs** (1, declared" in text and "wide seed 13. Why: stopped twice by the guard" in text


def test_the_cli_form_of_a_missing_run_names_a_value_and_a_seed(tmp_path):
    module = types.SimpleNamespace(SWEEP_NAME="blocked", SWEEP_VALUES=("big", "small", "wide"))
    assert registered.parse_run("wide:13", module) == ("wide", 13)
    assert registered.parse_run("2:1", types.SimpleNamespace(SWEEP_VALUES=(1, 2))) == (2, 1)  # as spelled there
    for bad in ("wide", "wide:x", "tall:13"):
        with pytest.raises(ValueError, match=f"--missing {bad!r}: expected VALUE:SEED"):
            registered.parse_run(bad, module)
    with pytest.raises(ValueError, match="--missing and --why go together"):
        registered.write(
            tmp_path, types.SimpleNamespace(SWEEP_NAME="blocked", SWEEP_PREREGISTRATION="p.md"), [("wide", 13)]
        )


def test_write_reads_the_stored_sweep_and_names_its_batches(tmp_path):
    spec = {**SPEC, "contrasts": CONTRASTS}
    sweep_dir = tmp_path / "blocked"
    store.write_spec(sweep_dir, spec)
    results = runs({"big": 39.0, "small": 37.5, "wide": 37.5})
    results[-1]["commit"] = "b" * 40  # one run on another commit
    for r in results:
        path = store.point_path(sweep_dir, spec["key"], r["value"], r["seed"])
        path.mkdir(parents=True)
        (path / store.RESULT_FILE).write_text(json.dumps(r))
    module = types.SimpleNamespace(SWEEP_NAME="blocked", SWEEP_FIRST_SEED=10, SWEEP_PREREGISTRATION="results/prereg.md")
    text = registered.write(tmp_path, module).read_text()
    assert text.startswith("# blocked: the registered analysis") and "results/prereg.md" in text
    assert "| 1 | shrink | big → small |" in text and "**lower**" in text
    assert "## Sensitivity analyses (registered; no verdicts)" in text and "(3 − 1)(5 − 1) = 8 df" in text
    rows = [line.split(" | ") for line in text.splitlines() if line.startswith("| 1 | shrink | ") and "→" not in line]
    assert len(rows) == 1 and len(rows[0]) == 11  # the sensitivity row: Welch and two-way beside the primary p
    assert "**The runs span 2 batches** (aaaaaaa × " in text and ": 14; bbbbbbb × " in text
    with pytest.raises(ValueError, match="registers no analysis"):
        registered.write(tmp_path, types.SimpleNamespace(SWEEP_NAME="blocked"))


def ols_contrast(design, start, to):
    """The reference: the two-way additive model fitted by least squares on a dummy-coded design matrix
    (intercept, point and seed indicators less one each); the contrast's estimate, se and df from
    s^2 (X'X)^-1, as any regression package computes them."""
    points, seeds = list(design), sorted(next(iter(design.values())))
    rows, y = [], []
    for i, point in enumerate(points):
        for j, seed in enumerate(seeds):
            rows.append(
                [1.0] + [float(i == k) for k in range(1, len(points))] + [float(j == k) for k in range(1, len(seeds))]
            )
            y.append(design[point][seed])
    X, y = np.array(rows), np.array(y)
    beta, rss, rank, _ = np.linalg.lstsq(X, y, rcond=None)
    df = len(y) - rank
    cov = float(rss[0]) / df * np.linalg.inv(X.T @ X)
    c = np.zeros(X.shape[1])
    for point, sign in ((to, 1.0), (start, -1.0)):
        if points.index(point) > 0:
            c[points.index(point)] += sign
    estimate, se = float(c @ beta), float(np.sqrt(c @ cov @ c))
    return estimate, se, df, 2 * stats.t.sf(abs(estimate / se), df)


def test_the_two_way_model_is_a_least_squares_fit_of_point_and_seed_block():
    results = runs({"big": 39.0, "small": 37.9, "wide": 38.3, "other": 38.8})
    design = {
        v: {r["seed"]: r["test_bleu"] for r in results if r["value"] == v} for v in ("big", "small", "wide", "other")
    }
    contrasts = {"shrink": ("big", "small"), "widen": ("small", "wide"), "back": ("wide", "big")}
    tests = significance.blocked_contrasts(design, contrasts)
    for label, (start, to) in contrasts.items():
        estimate, se, df, p = ols_contrast(design, start, to)
        c = tests[label]
        assert c.difference == pytest.approx(estimate, rel=1e-9) and c.se == pytest.approx(se, rel=1e-9)
        assert c.df == df == 12 and c.p == pytest.approx(p, rel=1e-9)  # (4 - 1)(5 - 1)
        half = stats.t.ppf(0.975, df) * se
        assert (c.ci_low, c.ci_high) == (pytest.approx(estimate - half), pytest.approx(estimate + half))
    # with two points, the two-way model is the paired t test
    two = significance.blocked_contrasts({k: design[k] for k in ("big", "small")}, {"shrink": ("big", "small")})
    paired = stats.ttest_rel([design["small"][s] for s in SEEDS], [design["big"][s] for s in SEEDS])
    assert two["shrink"].p == pytest.approx(paired.pvalue, rel=1e-9) and two["shrink"].df == 4


@pytest.mark.parametrize(
    "design, contrasts, message",
    [
        ({"a": {1: 1.0, 2: 2.0}, "b": {1: 1.0, 3: 2.0}}, {"x": ("a", "b")}, "the same two or more seeds"),
        ({"a": {1: 1.0, 2: 2.0}}, {"x": ("a", "a")}, "two or more points"),
        ({"a": {1: 1.0, 2: 2.0}, "b": {1: 1.0, 2: 3.0}}, {"x": ("a", "c")}, r"contrasts\['x'\] must be \(from, to\)"),
        ({"a": [1.0, 2.0], "b": {1: 1.0, 2: 3.0}}, {"x": ("a", "b")}, r"groups\['a'\] must map seed"),
        ({"a": {1: True, 2: 2.0}, "b": {1: 1.0, 2: 3.0}}, {"x": ("a", "b")}, r"groups\['a'\]"),
    ],
)
def test_the_two_way_model_refuses_an_incomplete_or_malformed_design(design, contrasts, message):
    with pytest.raises(ValueError, match=message):
        significance.blocked_contrasts(design, contrasts)


def test_the_sensitivity_analyses_are_welch_and_the_two_way_model_holm_adjusted_over_the_contrasts():
    results = runs({"big": 39.0, "small": 37.5, "wide": 37.5})
    spec = {**SPEC, "contrasts": CONTRASTS}
    models = registered.sensitivity(registered.registered_design(results, spec, SEEDS), spec)
    bleu = {(r["value"], r["seed"]): r["test_bleu"] for r in results}
    welch = {
        label: stats.ttest_ind([bleu[b, s] for s in SEEDS], [bleu[a, s] for s in SEEDS], equal_var=False).pvalue
        for label, a, b in CONTRASTS
    }
    design = {v: {s: bleu[v, s] for s in SEEDS} for v in ("big", "small", "wide")}
    two_way = {label: ols_contrast(design, a, b)[3] for label, a, b in CONTRASTS}
    for model, p in (("welch", welch), ("two_way", two_way)):
        small, large = sorted(p.values())  # Holm over two, by hand
        for label, q in p.items():
            c = models[model][label]
            assert c.p == pytest.approx(q, rel=1e-9)
            assert c.p_holm == pytest.approx(min(1, 2 * small if q == small else max(2 * small, large)), rel=1e-9)
