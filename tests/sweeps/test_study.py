"""Several sweeps as one study: one Holm family over their comparisons (sweeps/study.py), against SciPy's
Welch test and Holm's adjustment worked by hand; the Table 3 study config names only stored sweeps' values; its
sensitivity analyses against SciPy's paired t and a pooled t by hand, a run shared between sweeps counted once."""

import json

import numpy as np
import pytest
from scipy import stats

from configs import table3_preset
from sweeps import schema, significance, store, study, tables
from tests.sweeps.test_tables import cells_of


def write_sweep(results_dir, name, key, reference, bleu):
    """A stored sweep: sweep.json and one result.json per value and seed (`bleu`: value -> per-seed test BLEU)."""
    sweep_dir = results_dir / name
    sweep_dir.mkdir(parents=True)
    (sweep_dir / store.SPEC_FILE).write_text(
        json.dumps({"name": name, "key": key, "values": list(bleu), "reference": reference})
    )
    for value, scores in bleu.items():
        for seed, score in enumerate(scores):
            path = store.point_path(sweep_dir, key, value, seed)
            path.mkdir(parents=True)
            (path / store.RESULT_FILE).write_text(json.dumps({"value": value, "seed": seed, "test_bleu": score}))


def test_one_holm_family_over_every_sweeps_comparisons_and_the_planned_ones(tmp_path):
    write_sweep(tmp_path, "heads", "h", 8, {8: [40.0, 41.0, 42.0], 1: [37.0, 38.0, 39.0], 16: [40.0, 41.5, 42.0]})
    write_sweep(tmp_path, "shape", "shape", "a", {"a": [40.0, 41.0, 42.0], "b": [38.0, 38.5, 39.5, 39.0]})
    planned = (("heads", 8, 1), ("heads", 8, 16), ("shape", "a", "b"), ("budget", "x", "y"))
    compared = study.study_comparisons(tmp_path, planned)
    raw = {
        c: stats.ttest_ind(*[[40.0, 41.0, 42.0], pt][::-1], equal_var=False).pvalue
        for c, pt in zip(planned, ([37.0, 38.0, 39.0], [40.0, 41.5, 42.0], [38.0, 38.5, 39.5, 39.0]))
    }
    for c, p in raw.items():
        assert compared[c].p == pytest.approx(p, rel=1e-9)
    assert compared[("budget", "x", "y")] is None  # its sweep is not stored: planned, counted as p = 1
    # Holm by hand over m = 4 (the untested one included): sorted raw p p1 <= p2 <= p3 get 4 p1, max(that, 3 p2),
    # max(that, 2 p3), each capped at 1
    order = sorted(raw, key=raw.get)
    expected, running = {}, 0.0
    for rank, c in enumerate(order):
        running = max(running, min(1.0, (4 - rank) * raw[c]))
        expected[c] = running
    for c in raw:
        assert compared[c].p_holm == pytest.approx(expected[c], rel=1e-9)
    # h = 1: p 0.0213 (tests/sweeps/test_tables.py's hand-worked case) is lower in its own table of 2 (0.043), not
    # in this study of 4 (0.085)
    assert raw[("heads", 8, 1)] == pytest.approx(0.0213, abs=1e-4) and compared[
        ("heads", 8, 1)
    ].p_holm == pytest.approx(4 * raw[("heads", 8, 1)])
    assert compared[("heads", 8, 1)].verdict == "undetermined"
    assert compared[("shape", "a", "b")].difference == pytest.approx(38.75 - 41.0)


def test_the_study_table_names_each_comparison_and_the_ones_not_run(tmp_path):
    write_sweep(tmp_path, "heads", "h", 8, {8: [40.0, 40.1, 40.2], 32: [38.5, 38.6, 38.7]})
    table = study.study_markdown(tmp_path, (("heads", 8, 32), ("heads_budget", "h8_8000", "h32_8000")), "T")
    assert table.startswith("# T: every comparison, one Holm family over 2\n")
    body = cells_of(table)["heads"]
    # [38.5, 38.6, 38.7] - [40.0, 40.1, 40.2] = -1.5, se sqrt(2 x 0.01 / 3), df 4: [-1.73, -1.27]; Holm over 2
    assert body[:5] == ["8 → 32", "3 → 3", "40.10 → 38.60", "-1.50", "[-1.73, -1.27]"] and body[-1] == "**lower**"
    assert cells_of(table)["heads_budget"][:3] == ["h8_8000 → h32_8000", "–", "not run yet"]


def test_a_bad_study_is_refused_naming_the_entry(tmp_path):
    with pytest.raises(ValueError, match="two different values, got \\('heads', 8, 8\\)"):
        study.study_comparisons(tmp_path, (("heads", 8, 8),))
    with pytest.raises(ValueError, match="names a comparison twice"):
        study.study_comparisons(tmp_path, (("heads", 8, 1), ("heads", 8, 1)))
    with pytest.raises(ValueError, match="at least one"):
        study.study_comparisons(tmp_path, ())
    config = tmp_path / "not_a_study.py"
    config.write_text("X = 1\n")
    with pytest.raises(ValueError, match="has no STUDY_NAME"):
        study.write(tmp_path, schema.import_file(config))


def test_table3s_study_names_values_its_sweeps_have_and_no_comparison_twice():
    configs = {
        "heads": "ablation_heads",
        "dk": "ablation_dk",
        "kv": "ablation_kv",
        "head_size": "ablation_head_size",
        "heads_budget": "ablation_heads_budget",
    }
    modules = {name: schema.load_module(f"configs/{file}.py") for name, file in configs.items()}
    for name, start, to in table3_preset.STUDY:
        assert modules[name].SWEEP_NAME == name and {start, to} <= set(modules[name].SWEEP_VALUES)
    runs = set()  # each side as the run it is: a value shared from another sweep counts as that sweep's
    for name, start, to in table3_preset.STUDY:
        shared = schema.shared_points(modules[name])
        pair = tuple(shared.get(v, (name, v)) for v in (start, to))
        assert pair not in runs, (name, start, to)
        runs.add(pair)


def test_the_studys_sensitivity_counts_a_shared_run_once_and_names_every_seeds_batch(tmp_path):
    machine = "cpu|cpu|AMD EPYC, no native bf16|jax 0.12.0.1|jaxlib 0.12.0.1"
    bleu = {
        ("heads", 8): [40.0, 41.0, 41.5],
        ("heads", 32): [38.5, 39.8, 40.0],
        ("shape", "h8_dk8"): [38.0, 38.4, 39.9],
    }
    for name, key, values in (("heads", "h", [8, 32]), ("shape", "shape", ["h8_dk32", "h8_dk8"])):
        (tmp_path / name).mkdir()
        (tmp_path / name / store.SPEC_FILE).write_text(
            json.dumps({"name": name, "key": key, "values": values, "reference": values[0]})
        )
        for value in values:
            for seed in range(3):
                result = {
                    "value": value,
                    "seed": seed,
                    "commit": ("a" if seed < 2 else "b") * 40,
                    "dirty": False,
                    "machine": machine,
                    "test_bleu": bleu.get((name, value), bleu[("heads", 8)])[seed],
                }
                if value == "h8_dk32":  # rows A's h = 8 run, copied
                    result["shared_from"] = f"heads/h8/seed{seed}"
                path = store.point_path(tmp_path / name, key, value, seed)
                path.mkdir(parents=True)
                (path / store.RESULT_FILE).write_text(json.dumps(result))
    plan = (("heads", 8, 32), ("shape", "h8_dk32", "h8_dk8"))
    table = study.study_markdown(tmp_path, plan, "T")
    # the pooled variance: 9 distinct runs of 3 points (shape's h8_dk32 is heads/h8), 6 df
    groups = [np.array(v) for v in bleu.values()]
    s2 = sum(((g - g.mean()) ** 2).sum() for g in groups) / 6
    assert "all 9 runs of the 3 points" in table and "6 df" in table
    rows = cells_of(table.split("## Sensitivity")[1])
    for label, (start, to) in {
        "heads: 8 → 32": (("heads", 8), ("heads", 32)),
        "shape: h8_dk32 → h8_dk8": (("heads", 8), ("shape", "h8_dk8")),
    }.items():
        a, b = np.array(bleu[start]), np.array(bleu[to])
        pooled = 2 * stats.t.sf(abs(b.mean() - a.mean()) / np.sqrt(s2 * 2 / 3), 6)
        assert rows[label][8] == tables.p_cell(pooled)
        assert rows[label][5] == tables.p_cell(stats.ttest_rel(b, a).pvalue)
        assert rows[label][:3] == ["A A B → A A B", "yes", "0–2 (3 in one batch)"]
    paired = [
        stats.ttest_rel(np.array(bleu[t]), np.array(bleu[("heads", 8)])).pvalue
        for t in (("heads", 32), ("shape", "h8_dk8"))
    ]
    assert [rows[label][6] for label in ("heads: 8 → 32", "shape: h8_dk32 → h8_dk8")] == [
        tables.p_cell(p) for p in significance.holm(paired)
    ]  # Holm over the study's 2
    legend = cells_of(table.split("## Batches")[1].split("## Sensitivity")[0])
    assert legend["A"] == [
        "aaaaaaa × AMD EPYC (no native bf16)",
        "heads/h8: 0, 1; heads/h32: 0, 1; shape/shape_h8_dk8: 0, 1",
    ]
    assert "at 0.05 / 2 = 0.0250 (Holm's strictest step over the study's 2)" in table
