"""metrics.jsonl survives a write cut off mid-record: the torn line is dropped with a warning, nothing else."""

import json
import logging

import pytest

from training.core import files
from training.core.metrics import MetricsWriter
from training.evaluation import report

RECORDS = [
    '{"step": 5, "loss": 2.0}',
    '{"step": 10, "loss": 1.5}',
    '{"step": 10, "split": "val", "loss": 1.7, "perplexity": 5.5, "bleu": 3.0}',
]


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
    monkeypatch.setattr(
        "os.replace", lambda src, dst: (writes.append((str(src), str(dst))), __import__("shutil").move(src, dst))
    )
    MetricsWriter(tmp_path, resume_step=5).close()
    assert writes and writes[0][1] == str(path)  # kept records go to a temporary file, then replace the old one
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [5]


@pytest.mark.parametrize(
    "content, expected",
    [
        (
            b'{"step": 5}\n\xff\xfe\n{"step": 10}\n',
            r"metrics.jsonl line 2 is not UTF-8",
        ),  # a damaged byte, not a torn end
        (b'{"step": 5}\n{"loss": 1.0}\n', r"metrics.jsonl line 2 holds an object without an int 'step'"),
        (b"[1, 2]\n", r"metrics.jsonl line 1 holds a JSON list; expected a metrics record"),
    ],
)
def test_a_metrics_file_that_is_not_records_is_one_error_naming_the_file_and_line(tmp_path, content, expected):
    (tmp_path / "metrics.jsonl").write_bytes(content)
    with pytest.raises(ValueError, match=expected):
        files.read_jsonl(tmp_path / "metrics.jsonl")
    with pytest.raises(ValueError, match=expected):  # the run's start reads it the same way
        MetricsWriter(tmp_path, resume_step=10)


def test_a_last_line_cut_inside_a_character_is_dropped_as_torn(tmp_path):
    (tmp_path / "metrics.jsonl").write_bytes('{"step": 5}\n{"step": 10, "split": "v\u00e4'.encode()[:-1])
    assert [r["step"] for r in files.read_jsonl(tmp_path / "metrics.jsonl")] == [5]
