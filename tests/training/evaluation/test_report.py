"""The metrics.jsonl summary table."""

import json

from training.evaluation import report


def test_curve_table_pairs_each_evaluation_with_the_training_record_before_it(tmp_path):
    records = [
        {"step": 5, "loss": 4.0, "tokens_per_s": 1000.0},
        {"step": 10, "loss": 3.5, "tokens_per_s": 1200.0},
        {"step": 10, "split": "val", "loss": 2.0, "perplexity": 7.389, "bleu": 12.345},
        {"step": 15, "loss": 3.0, "tokens_per_s": 1300.0},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    rows = report.curve_table(tmp_path).splitlines()
    assert len(rows) == 3
    assert rows[2] == "| 10 | 2.000 | 7.39 | 12.35 | 3.500 | 1,200 |"
