"""metrics.jsonl survives a write cut off mid-record: the torn line is dropped with a warning, nothing else;
TensorBoard shows a resumed run's scalars as metrics.jsonl holds them, each step once."""

import json
import logging
import struct
import time
from pathlib import Path

import pytest
from tensorboardX.proto import event_pb2

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


def tensorboard_points(folder: Path) -> dict[str, dict[int, list[float]]]:
    """Each scalar tag's values by step as TensorBoard shows them: the event files read in name order (TensorBoard's
    directory loader), a SessionLog.START at step S hiding every point read before it at a step >= S (its event
    accumulator's purge of orphaned data, for files of version brain.Event:2, which tensorboardX writes)."""
    points: dict[str, dict[int, list[float]]] = {}
    for path in sorted(folder.glob("events.out.tfevents.*")):
        data, at = path.read_bytes(), 0
        while at < len(data):  # records: length (8 bytes), its CRC (4), the event, its CRC (4)
            (length,) = struct.unpack_from("<Q", data, at)
            event = event_pb2.Event.FromString(data[at + 12 : at + 12 + length])
            at += 12 + length + 4
            if event.HasField("session_log") and event.session_log.status == event_pb2.SessionLog.START:
                points = {tag: {s: v for s, v in by_step.items() if s < event.step} for tag, by_step in points.items()}
            for value in event.summary.value:
                points.setdefault(value.tag, {}).setdefault(event.step, []).append(value.simple_value)
    return points


def jsonl_points(workdir: Path) -> dict[str, dict[int, list[float]]]:
    """metrics.jsonl's scalars under the TensorBoard tags MetricsWriter gives them."""
    points: dict[str, dict[int, list[float]]] = {}
    for record in files.read_jsonl(workdir / "metrics.jsonl"):
        for name, value in record.items():
            if name not in ("step", "split") and isinstance(value, (int, float)):
                tag = f"{record.get('split', 'train')}/{name}"
                points.setdefault(tag, {}).setdefault(record["step"], []).append(value)
    return points


def assert_tensorboard_shows_the_jsonl(workdir: Path) -> None:
    """Every tag's steps once each in TensorBoard, with metrics.jsonl's values (float32 in the event files)."""
    shown, kept = tensorboard_points(workdir / "tensorboard"), jsonl_points(workdir)
    repeated = {tag: sorted(s for s, v in by_step.items() if len(v) > 1) for tag, by_step in shown.items()}
    assert not {tag: steps for tag, steps in repeated.items() if steps}, "steps shown more than once"
    assert {tag: sorted(by_step) for tag, by_step in shown.items()} == {t: sorted(b) for t, b in kept.items()}
    for tag, by_step in kept.items():
        for step, [value] in by_step.items():
            assert shown[tag][step][0] == pytest.approx(value, rel=1e-6), (tag, step)


def test_a_resumed_writer_shows_each_step_once_in_tensorboard_with_the_resumed_values(tmp_path):
    first = MetricsWriter(tmp_path)
    for record in ({"step": 5, "loss": 3.0}, {"step": 10, "loss": 2.0}, {"step": 10, "split": "val", "loss": 2.5}):
        first.write(record)
    first.write({"step": 15, "loss": 1.5})  # logged, then the run was killed before its checkpoint at 20
    first.close()
    time.sleep(1.05 - time.time() % 1)  # tensorboardX names an event file by the second it opens it
    resumed = MetricsWriter(tmp_path, resume_step=10)  # restored from the checkpoint at step 10
    for record in ({"step": 15, "loss": 1.25}, {"step": 20, "loss": 1.0}, {"step": 20, "split": "val", "loss": 1.75}):
        resumed.write(record)
    resumed.close()
    assert len(list((tmp_path / "tensorboard").iterdir())) == 2  # one event file per start
    assert_tensorboard_shows_the_jsonl(tmp_path)
    assert tensorboard_points(tmp_path / "tensorboard")["train/loss"] == {5: [3.0], 10: [2.0], 15: [1.25], 20: [1.0]}
