"""Run metrics to `metrics.jsonl` (one JSON object per record) and TensorBoard, from process 0 only."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import jax
from tensorboardX import SummaryWriter

from training.core import files


class MetricsWriter:
    def __init__(self, workdir: str | Path, resume_step: int = 0):
        """Records after `resume_step` (logged before an interruption, redone now) and a torn last line are dropped,
        from metrics.jsonl and from what TensorBoard shows."""
        self.enabled = jax.process_index() == 0
        self.records: list[dict] = []  # those kept (process 0)
        if self.enabled:
            path = Path(workdir) / "metrics.jsonl"
            records = files.read_jsonl(path) if path.exists() else []
            kept = self.records = [r for r in records if r["step"] <= resume_step]
            if len(kept) < len(records):  # never cut silently
                logging.warning(
                    "%s: %d records after step %d dropped (those steps are redone)",
                    path,
                    len(records) - len(kept),
                    resume_step,
                )
            files.write_atomic(path, "".join(json.dumps(r) + "\n" for r in kept))
            self.jsonl = open(path, "a", encoding="utf-8")
            # The records after `resume_step` are redone: a SessionLog.START at the next step, written first, makes
            # TensorBoard hide the points this workdir's earlier event files hold from that step on, as the
            # rewrite above drops them from metrics.jsonl (a fresh run's start hides nothing).
            self.tensorboard = SummaryWriter(str(Path(workdir) / "tensorboard"), purge_step=resume_step + 1)

    def write(self, record: dict) -> None:
        """`record` holds `step` and scalars; `split` (if present) prefixes the TensorBoard tags."""
        if not self.enabled:
            return
        try:
            self.jsonl.write(json.dumps(record) + "\n")
            self.jsonl.flush()
        except OSError as error:  # a full disk: one error naming the file
            if refusal := files.naming(error, self.jsonl.name):
                raise refusal from error
            raise
        prefix = record.get("split", "train")
        for name, value in record.items():
            if name not in ("step", "split") and isinstance(value, (int, float)):
                self.tensorboard.add_scalar(f"{prefix}/{name}", value, record["step"])
        self.tensorboard.flush()

    def close(self) -> None:
        if self.enabled:
            self.jsonl.close()
            self.tensorboard.close()
