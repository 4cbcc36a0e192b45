"""The sweep tables: the paper's Table 3 numbers beside each row (Vaswani et al. 2017, rows A and B, newstest2013),
the machines, the reading, and sweeps over names (attention types) as well as counts."""

from sweeps import tables


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
    runs = [{"value": 8, "seed": s, "commit": "a" * 40, "dirty": False, "test_bleu": 30.0 + s, **m}
            for s, m in enumerate([{"machine": epyc}, {}, {"machine": epyc}, {"machine": xeon}])]
    [row] = tables.aggregate(runs)
    assert row["machines"] == "AMD EPYC (no native bf16) × 2, unrecorded × 1, Intel(R) Xeon(R) Processor (native bf16) × 1"
    assert tables.machine_label("gpu|NVIDIA H200|AMD EPYC, no native bf16|jax 0.12.0.1|jaxlib 0.12.0.1") == "NVIDIA H200"
    table = tables.markdown([row], {"key": "h", "reference": 8})
    assert table.splitlines()[0].endswith("| commits | machines |")
    assert table.splitlines()[2].endswith("| aaaaaaaaaa | AMD EPYC (no native bf16) × 2, unrecorded × 1, Intel(R) Xeon(R) Processor (native bf16) × 1 |")


def test_the_reading_says_what_holds_in_every_seed_pair():
    rows = [{"value": 1, "test_bleu_mean": 39.0, "p_values": [0.01, 0.03, 0.2]},
            {"value": 4, "test_bleu_mean": 39.5, "p_values": [0.001, 0.04]},
            {"value": 8, "test_bleu_mean": 40.0},
            {"value": 16, "test_bleu_mean": 40.3, "p_values": [0.02, 0.049]},
            {"value": 32, "test_bleu_mean": 39.1}]
    lines = tables.reading_markdown(rows, {"key": "h", "reference": 8}).splitlines()
    body = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]] for line in lines if line.startswith("| ") and line[2].isdigit()}
    assert body["1"] == ["-1.00", "2 of 3", "no difference that holds in every seed pair", "-0.9"]  # paper: 24.9 vs 25.8
    assert body["4"] == ["-0.50", "2 of 2", "**lower** (every seed pair)", "-0.3"]
    assert body["16"] == ["+0.30", "2 of 2", "**higher** (every seed pair)", "+0.0"]
    assert body["32"] == ["-0.90", "0 of 0", "no seed pair to test", "-0.4"]
    assert "8" not in body
    assert tables.reading_markdown(rows[:2], {"key": "h", "reference": 8}) == ""  # no reference row yet


def test_a_sweep_over_names_gets_its_table_and_plot(tmp_path):
    runs = [{"value": name, "seed": seed, "parameters": 100 + i, "test_bleu": 30.0 + i + seed, "dev_bleu": 29.0 + i,
             "dev_perplexity": 6.0 - i, "test_perplexity": 6.5 - i, "kv_cache_bytes_per_token": 512.0 / (i + 1),
             "decode_tokens_per_s_beam1": 900.0, "decode_tokens_per_s_beam4": 200.0}
            for i, name in enumerate(["softmax", "performer", "mla"]) for seed in (0, 1)]
    rows = tables.aggregate(runs, {"performer": [0.01, 0.02], "mla": [0.2, 0.01]})
    spec = {"key": "attention", "reference": "softmax"}
    table = tables.markdown(rows, spec).splitlines()
    assert table[0].startswith("| attention_type | parameters | dev PPL |") and "KV-cache bytes/token" in table[0]
    assert table[3].startswith("| performer | 101 |") and "| 0.010 / 0.020 | 2 |" in table[3]
    assert "| mla | +2.00 | 1 of 2 | no difference that holds in every seed pair | – |" in tables.reading_markdown(rows, spec)
    tables.plot(rows, "attention", tmp_path / "family.png")
    assert (tmp_path / "family.png").stat().st_size > 0
