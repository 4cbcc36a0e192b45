"""metrics.jsonl survives a write cut off mid-record: the torn line is dropped with a warning, nothing else."""

import json
import logging

from training.core.metrics import MetricsWriter
from training.evaluation import report

RECORDS = ['{"step": 5, "loss": 2.0}', '{"step": 10, "loss": 1.5}', '{"step": 10, "split": "val", "loss": 1.7, "perplexity": 5.5, "bleu": 3.0}']


def test_a_torn_last_line_is_dropped_with_a_warning_and_the_run_goes_on(tmp_path, caplog):
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(RECORDS) + '\n{"step": 15, "lo', encoding="utf-8")  # disk full mid-record
    with caplog.at_level(logging.WARNING):
        writer = MetricsWriter(tmp_path, resume_step=10)
    writer.write({"step": 15, "loss": 1.2})
    writer.close()
    steps = [json.loads(line)["step"] for line in path.read_text().splitlines()]
    assert steps == [5, 10, 10, 15]
    assert "metrics.jsonl" in caplog.text and "line 4" in caplog.text


def test_the_report_reads_a_file_with_a_torn_last_line(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("\n".join(RECORDS) + '\n{"st', encoding="utf-8")
    train, evals = report.read_metrics(tmp_path)
    assert [r["step"] for r in train] == [5, 10] and [r["step"] for r in evals] == [10]


def test_the_start_up_rewrite_leaves_no_partial_file(tmp_path, monkeypatch):
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(RECORDS) + "\n", encoding="utf-8")
    writes = []
    monkeypatch.setattr("os.replace", lambda src, dst: (writes.append((str(src), str(dst))), __import__("shutil").move(src, dst)))
    MetricsWriter(tmp_path, resume_step=5).close()
    assert writes and writes[0][1] == str(path)  # kept records go to a temporary file, then replace the old one
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [5]
