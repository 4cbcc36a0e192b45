"""The sweep tables: the paper's Table 3 numbers beside each row (Vaswani et al. 2017, rows A and B, newstest2013),
the machines, the seed-level table and the contrasts, per-seed CSV columns, and sweeps over names (attention types)
as well as counts; the batches of every seed and the sensitivity analyses, against SciPy's paired t and a pooled t
worked by hand."""

import math

import numpy as np
from scipy import stats

from sweeps import significance, tables


def test_paper_numbers_match_rows_by_head_count_and_by_dk_over_dv():
    assert tables.paper_numbers("h", {"value": 16}) == (4.91, 25.8)
    assert tables.paper_numbers("h", {"value": 2}) is None  # not in the paper
    # rows B at d_v = 64: d_k = 16 and 32; this codebase's d_v = 32 matches them at d_k = 8 and 16
    assert tables.paper_numbers("dk", {"value": 8, "head_dim": 8, "v_head_dim": 32}) == (5.16, 25.1)
    assert tables.paper_numbers("dk", {"value": 16, "head_dim": 16, "v_head_dim": 32}) == (5.01, 25.4)
    assert tables.paper_numbers("dk", {"value": 32, "head_dim": 32, "v_head_dim": 32}) == (4.92, 25.8)
    assert tables.paper_numbers("kv", {"value": 2}) is None


def test_rows_name_the_machines_their_runs_were_timed_on():
    xeon = "cpu|cpu|Intel(R) Xeon(R) Processor, native bf16|jax 0.12.0.1|jaxlib 0.12.0.1"
    epyc = "cpu|cpu|AMD EPYC, no native bf16|jax 0.12.0.1|jaxlib 0.12.0.1"
    runs = [
        {"value": 8, "seed": s, "commit": "a" * 40, "dirty": False, "test_bleu": 30.0 + s, **m}
        for s, m in enumerate([{"machine": epyc}, {}, {"machine": epyc}, {"machine": xeon}])
    ]
    [row] = tables.aggregate(runs)
    assert (
        row["machines"] == "AMD EPYC (no native bf16) × 2, unrecorded × 1, Intel(R) Xeon(R) Processor (native bf16) × 1"
    )
    assert (
        tables.machine_label("gpu|NVIDIA H200|AMD EPYC, no native bf16|jax 0.12.0.1|jaxlib 0.12.0.1") == "NVIDIA H200"
    )
    table = tables.markdown([row], {"key": "h", "reference": 8})
    assert table.splitlines()[0].endswith("| commits | machines |")
    assert table.splitlines()[2].endswith(
        "| aaaaaaaaaa | AMD EPYC (no native bf16) × 2, unrecorded × 1, Intel(R) Xeon(R) Processor (native bf16) × 1 |"
    )


def cells_of(table: str) -> dict[str, list[str]]:
    """A markdown table's body rows by their first cell."""
    return {
        line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
        for line in table.splitlines()
        if line.startswith("| ") and not line.startswith("| ---")
    }


def test_the_seed_level_table_leads_with_difference_ci_effect_holm_equivalence_and_steps():
    # Hand-worked: h = 1 is [37, 38, 39] against h = 8's [40, 41, 42]: difference -3, se sqrt(2/3), Welch df 4,
    # 95 % CI -3 -+ 2.776 x 0.8165 = [-5.27, -0.73], Hedges' g -3 x (1 - 3/15) = -2.40, p 0.0213 (scipy:
    # ttest_ind(equal_var=False)); equivalence p max(t4.sf((-3 + 0.5) / se), t4.cdf((-3 - 0.5) / se)) = 0.981.
    # h = 16's seeds equal h = 8's: difference 0, p 1, g 0, yet not equivalent (too few seeds). Holm over the
    # table's 3 planned comparisons (h = 2, not run yet, counts as p = 1): 3 x 0.0213 = 0.064, so h = 1 is not
    # yet lower; and 1; its equivalence p 0.981 x 3 caps at 1.
    results = [
        {
            "value": v,
            "seed": s,
            "step": 4000 - 400 * (s == 1 and v == 8),
            "num_train_steps": 4000,
            "test_bleu": base + s,
            "num_heads": v,
            "head_dim": 256 // v,
            "v_head_dim": 256 // v,
        }
        for v, base in ((1, 37.0), (8, 40.0), (16, 40.0))
        for s in range(3)
    ]
    spec = {"key": "h", "reference": 8, "values": [1, 2, 8, 16], "test_split": "test"}
    table = tables.seed_markdown(results, spec)
    assert table.startswith("## Test BLEU against h = 8, over seeds (the primary result)\n")
    secondary = tables.seed_markdown(results, spec, primary=False)  # beside a registered analysis
    assert secondary.startswith("## Test BLEU against h = 8, over seeds (secondary: the registered analysis above")
    # the secondary table gives no verdict (the registered analysis does), and its marker says which it is
    assert table.splitlines()[2] == tables.PRIMARY and secondary.splitlines()[2] == tables.SECONDARY
    assert {cells_of(secondary)[v][9] for v in ("1", "16")} == {tables.NO_VERDICT} and "**Reading.**" not in secondary
    header = [c.strip() for c in table.splitlines()[3].strip("|").split("|")]
    assert header[:7] == [
        "h",
        "seeds",
        "test BLEU (mean)",
        "difference (BLEU)",
        "95 % CI",
        "Hedges' g",
        "p (Welch, two-sided)",
    ]
    body = cells_of(table)
    assert body["1"][:8] == ["3", "38.00", "-3.00", "[-5.27, -0.73]", "-2.40", "0.021", "0.064", "1.000"]
    assert body["1"][9:] == ["undetermined", "4,000 / 4,000 / 4,000 of 4,000", "-0.9"]  # the paper: 24.9 vs 25.8
    assert body["2"][:2] == ["0", "not run yet"]
    assert body["8"][:3] == ["3", "41.00", "reference"] and body["8"][-2] == "4,000 / 3,600 / 4,000 of 4,000"
    assert body["16"][2:6] == ["+0.00", "[-2.27, +2.27]", "+0.00", "1.000"] and body["16"][9] == "undetermined"
    assert "**Reading.** Undetermined: h = 1, 16." in table
    done = tables.seed_markdown(results, {**spec, "values": [1, 8, 16]})  # once h = 2 leaves the plan: 2 x 0.0213
    assert cells_of(done)["1"][6] == "0.043" and "**Reading.** Lower: h = 1. Undetermined: h = 16." in done
    assert tables.seed_markdown(results[:3], spec) == ""  # no reference seeds yet
    assert header[-2] == "scored steps (seed 0 / 1 / ...)"
    fresh = tables.seed_markdown([{**r, "seed": r["seed"] + 10} for r in results], spec)  # seeds 10-12
    assert "| scored steps (seed 10 / 11 / ...) |" in fresh.splitlines()[3]


def test_contrasts_get_their_own_table_and_missing_points_read_not_run_yet():
    results = [
        {"value": v, "seed": s, "test_bleu": b + 0.1 * s}
        for v, b in (("h8_dk32", 40.0), ("h32_dk8", 38.5))
        for s in range(3)
    ]
    spec = {
        "key": "shape",
        "reference": "h8_dk32",
        "values": ["h8_dk32", "h8_dk8", "h32_dk8", "h32_dk16"],
        "contrasts": [
            ["more heads at a fixed head size", "h8_dk8", "h32_dk8"],
            ["all of rows A's step", "h8_dk32", "h32_dk8"],
            ["the paper's head size at h = 32", "h32_dk8", "h32_dk16"],
        ],
    }
    body = cells_of(tables.contrasts_markdown(results, spec))
    assert body["more heads at a fixed head size"][:3] == ["h8_dk8 → h32_dk8", "–", "h8_dk8 not run yet"]
    assert body["the paper's head size at h = 32"][2] == "h32_dk16 not run yet"
    # the one testable comparison (Holm over one is the raw p): [38.5, 38.6, 38.7] - [40.0, 40.1, 40.2] = -1.5,
    # se sqrt(2 x 0.01 / 3) = 0.0816, df 4: -1.5 -+ 2.776 x 0.0816 = [-1.73, -1.27]
    ready = body["all of rows A's step"]
    assert (
        ready[:4] == ["h8_dk32 → h32_dk8", "3 → 3", "-1.50", "[-1.73, -1.27]"]
        and ready[5] == ready[6] == "< 0.001"
        and ready[-1] == "**lower**"
    )
    secondary = tables.contrasts_markdown(results, spec, primary=False)  # beside a registered analysis
    assert cells_of(secondary)["all of rows A's step"][-1] == tables.NO_VERDICT and tables.SECONDARY in secondary
    assert tables.contrasts_markdown(results, {**spec, "contrasts": []}) == ""
    seeds = cells_of(tables.seed_markdown(results, spec))
    assert seeds["h8_dk8"][:2] == ["0", "not run yet"] and seeds["h32_dk16"][:2] == ["0", "not run yet"]


def test_csv_rows_hold_no_single_seeds_value_unlabelled(tmp_path):
    runs = [
        {"value": 8, "seed": s, "step": (4000, 3600, 4000)[s], "test_bleu": 40.0 + s, "parameters": 5} for s in range(3)
    ]
    [row] = tables.aggregate(runs, {8: {0: 0.5, 1: 0.01, 2: 0.2}})
    assert "step" not in row and "test_bleu" not in row and "seed" not in row  # they differ by seed
    assert (row["step_seed1"], row["test_bleu_seed2"], row["test_bleu_mean"], row["parameters"]) == (
        3600,
        42.0,
        41.0,
        5,
    )
    assert row["p_values"] == [0.5, 0.01, 0.2] and row["p_seed1"] == 0.01
    tables.write_csv([row], tmp_path / "t.csv")
    header = (tmp_path / "t.csv").read_text().splitlines()[0].split(",")
    assert (
        "step" not in header
        and "test_bleu" not in header
        and {"step_seed0", "test_bleu_seed1", "p_seed2"} <= set(header)
    )


def test_a_sweep_over_names_gets_its_table_and_plot(tmp_path):
    runs = [
        {
            "value": name,
            "seed": seed,
            "parameters": 100 + i,
            "test_bleu": 30.0 + i + seed,
            "dev_bleu": 29.0 + i,
            "dev_perplexity": 6.0 - i,
            "test_perplexity": 6.5 - i,
            "kv_cache_bytes_per_token": 512.0 / (i + 1),
            "decode_tokens_per_s_beam1": 900.0,
            "decode_tokens_per_s_beam4": 200.0,
        }
        for i, name in enumerate(["softmax", "performer", "mla"])
        for seed in (0, 1)
    ]
    rows = tables.aggregate(runs, {"performer": [0.01, 0.02], "mla": [0.2, 0.01]})
    spec = {"key": "attention", "reference": "softmax"}
    table = tables.markdown(rows, spec).splitlines()
    assert table[0].startswith("| attention_type | parameters | dev PPL |") and "KV-cache bytes/token" in table[0]
    assert table[3].startswith("| performer | 101 |") and "| 0.010 / 0.020 | 2 |" in table[3]
    assert "| 0.0001 / 0.200 | 2 |" in tables.markdown(
        tables.aggregate(runs, {"mla": [0.0001, 0.2]}), spec
    )  # a number, 4 places
    seeds = cells_of(tables.seed_markdown(runs, {**spec, "values": ["softmax", "performer", "mla"]}))
    assert seeds["mla"][:3] == ["2", "32.50", "+2.00"] and seeds["mla"][-1] == ""  # no steps recorded in these runs
    tables.plot(rows, "attention", tmp_path / "family.png")
    assert (tmp_path / "family.png").stat().st_size > 0


EPYC3 = "cpu|cpu|AMD EPYC, no native bf16|jax 0.12.0.1|jaxlib 0.12.0.1|matmul auto"
EPYC4 = "cpu|cpu|AMD EPYC, native bf16|jax 0.12.0.1|jaxlib 0.12.0.1"


def test_a_batch_is_commit_by_cpu_kind_and_says_unrecorded_where_a_field_is_missing():
    assert (
        tables.batch_label({"commit": "e6da489b99" + "0" * 30, "dirty": False, "machine": EPYC3})
        == "e6da489 × AMD EPYC (no native bf16)"
    )
    assert tables.batch_label({"commit": "c45d1bca88" + "0" * 30, "dirty": False}) == "c45d1bc × unrecorded"
    assert tables.batch_label({"machine": EPYC4}) == "unrecorded × AMD EPYC (native bf16)"
    assert (
        tables.batch_label({"commit": "a" * 40, "dirty": True, "machine": EPYC4})
        == "aaaaaaa (dirty) × AMD EPYC (native bf16)"
    )
    runs = [
        {"value": v, "seed": s, "test_bleu": 39.0, "commit": c * 40, "dirty": False, **m}
        for v, s, c, m in (
            (8, 0, "a", {}),
            (8, 1, "b", {"machine": EPYC4}),
            (1, 0, "b", {"machine": EPYC4}),
            (1, 1, "b", {"machine": EPYC3}),
        )
    ]
    assert tables.batch_letters(runs) == {
        "aaaaaaa × unrecorded": "A",
        "bbbbbbb × AMD EPYC (native bf16)": "B",
        "bbbbbbb × AMD EPYC (no native bf16)": "C",
    }
    legend = cells_of(tables.batches_markdown(runs, {"key": "h", "values": [1, 8]}))
    # the legend lists each batch's seeds by point in the sweep's order, its letters as the runs first meet them
    assert legend["B"] == ["bbbbbbb × AMD EPYC (native bf16)", "1: 0; 8: 1"] and legend["A"] == [
        "aaaaaaa × unrecorded",
        "8: 0",
    ]
    per_seed = [
        line.split("|")[-2].strip()
        for line in tables.per_seed_markdown(runs, {"key": "h"}).splitlines()
        if line.startswith("| 1 |")
    ]
    assert per_seed == ["B", "C"]
    assert [tables._letter(i) for i in (0, 25, 26, 27)] == ["A", "Z", "AA", "AB"]


def sensitivity_fixture():
    """h = 8 (5 seeds, batches A A A B B), h = 1 (3 seeds, all B), h = 16 (5 seeds, A A A B B); h = 2 planned,
    not run."""
    rng = np.random.default_rng(6)
    shared = rng.normal(0, 0.4, 5)  # what a seed's data order does to every point
    results = []
    for value, mean, seeds in ((8, 39.5, 5), (1, 39.0, 3), (16, 38.9, 5)):
        for s in range(seeds):
            batch = (
                {"commit": "b" * 40, "machine": EPYC3}
                if s >= 3 or value == 1
                else {"commit": "a" * 40, "machine": EPYC4}
            )
            results.append(
                {
                    "value": value,
                    "seed": s,
                    "dirty": False,
                    "test_bleu": float(mean + shared[s] + rng.normal(0, 0.2)),
                    **batch,
                }
            )
    return results, {"key": "h", "reference": 8, "values": [1, 2, 8, 16]}


def test_sensitivity_tables_match_scipys_paired_t_and_a_pooled_t_by_hand_with_holm_over_the_primary_family():
    results, spec = sensitivity_fixture()
    bleu = {v: {r["seed"]: r["test_bleu"] for r in results if r["value"] == v} for v in (1, 8, 16)}
    text = tables.sweep_sensitivity_markdown(results, spec)
    assert text.startswith("## Sensitivity (no verdicts)")
    rows = cells_of(text)
    # seeds as blocks: SciPy's paired t over the seeds both have; Holm over the primary family's 3 (h = 2 planned)
    paired = {
        v: stats.ttest_rel([bleu[v][s] for s in sorted(bleu[v])], [bleu[8][s] for s in sorted(bleu[v])])
        for v in (1, 16)
    }
    paired_holm = significance.holm([paired[1].pvalue, paired[16].pvalue], planned=3)
    # one pooled variance: the within-point sum of squares over N - G = 13 - 3 df
    groups = {v: np.array(list(b.values())) for v, b in bleu.items()}
    s2 = sum(((g - g.mean()) ** 2).sum() for g in groups.values()) / 10
    pooled = {
        v: 2 * stats.t.sf(abs(groups[v].mean() - groups[8].mean()) / math.sqrt(s2 * (1 / len(groups[v]) + 1 / 5)), 10)
        for v in (1, 16)
    }
    pooled_holm = significance.holm([pooled[1], pooled[16]], planned=3)
    primary = tables.reference_comparisons(results, spec)
    for i, v in enumerate((1, 16)):
        row = rows[f"h = 8 → {v}"]
        assert row[5] == tables.p_cell(paired[v].pvalue) and row[6] == tables.p_cell(paired_holm[i])
        ci = paired[v].confidence_interval(0.95)
        assert row[4] == f"[{ci.low:+.2f}, {ci.high:+.2f}]"
        assert row[8] == tables.p_cell(pooled[v]) and row[9] == tables.p_cell(pooled_holm[i])
        assert row[10] == tables.p_cell(
            primary[v].p_holm
        )  # the primary Holm p beside them, as the primary table has it
    # batches: h = 8 is A A A B B; h = 1 B B B (its seeds 3-4 absent: 3 pairs, none in one batch); h = 16 as h = 8
    assert rows["h = 8 → 1"][:3] == ["A A A B B → B B B", "yes", "0–2 (0 in one batch)"]
    assert rows["h = 8 → 16"][:3] == ["A A A B B → A A A B B", "yes", "0–4 (5 in one batch)"]
    assert "h = 8 → 2" not in rows  # not run yet: no row
    assert (
        "all 13 runs of the 3 points" in text
        and "10 df" in text
        and "Holm over the same family as the primary table's" in text
    )
    assert "**Batches.** Within one batch: none. Crossing batches: h = 8 → 1; h = 8 → 16." in text


def test_sensitivity_of_contrasts_is_its_own_family_and_one_batch_reads_no():
    runs = [
        {
            "value": v,
            "seed": s,
            "commit": "c" * 40,
            "machine": EPYC3,
            "test_bleu": b + 0.1 * s + 0.05 * (s == 1) * (v == "y"),
        }
        for v, b in (("x", 40.0), ("y", 38.5), ("z", 38.0))
        for s in range(3)
    ]
    spec = {"key": "shape", "reference": "x", "values": ["x", "y", "z"], "contrasts": [["y to z", "y", "z"]]}
    text = tables.sweep_sensitivity_markdown(runs, spec)
    row = cells_of(text.split("The decomposition:")[1])["y to z"]
    y, z = [[r["test_bleu"] for r in runs if r["value"] == v] for v in "yz"]
    assert row[1] == "no" and row[2] == "0–2 (3 in one batch)"
    assert row[5] == row[6] == tables.p_cell(stats.ttest_rel(z, y).pvalue)  # a family of one: Holm is the raw p
    assert "Within one batch: shape = x → y; shape = x → z; y to z. Crossing batches: none." in text


def test_the_detectable_difference_names_its_holm_level():
    results, spec = sensitivity_fixture()
    table = tables.seed_markdown(results, spec)
    assert "detectable difference (80 % power at Holm's α / m)" in table.splitlines()[3]
    assert "a two-sided t test at 0.05 / 3 = 0.0167 (Holm's strictest step over this table's comparisons)" in table
    compared = tables.reference_comparisons(results, spec)
    assert (
        cells_of(table)["1"][8]
        == f"{significance.minimum_detectable_difference(compared[1].se, compared[1].df, 0.05 / 3):.2f}"
    )


def test_collect_keeps_a_written_reading_above_its_marker_and_nothing_else(tmp_path):
    path = tmp_path / "sweep.md"
    assert tables.kept_reading(path) == ""  # no table yet
    path.write_text("## Test BLEU\n\n| old table |\n")
    assert tables.kept_reading(path) == ""  # a generated table without a reading: rewritten whole
    path.write_text(f"# Reading\n\nh = 1 is lower.\n\n{tables.READING_END}\n\n## Test BLEU\n\n| old table |\n")
    assert tables.kept_reading(path) == f"# Reading\n\nh = 1 is lower.\n\n{tables.READING_END}\n\n"
