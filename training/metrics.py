"""Run metrics to `metrics.jsonl` (one JSON object per record) and TensorBoard, from process 0 only."""

from __future__ import annotations

import json
from pathlib import Path

import jax
from tensorboardX import SummaryWriter


class MetricsWriter:
    def __init__(self, workdir: str | Path):
        self.enabled = jax.process_index() == 0
        if self.enabled:
            self.jsonl = open(Path(workdir) / "metrics.jsonl", "a", encoding="utf-8")
            self.tensorboard = SummaryWriter(str(Path(workdir) / "tensorboard"))

    def write(self, record: dict) -> None:
        """`record` holds `step` and scalars; `split` (if present) prefixes the TensorBoard tags."""
        if not self.enabled:
            return
        self.jsonl.write(json.dumps(record) + "\n")
        self.jsonl.flush()
        prefix = record.get("split", "train")
        for name, value in record.items():
            if name not in ("step", "split") and isinstance(value, (int, float)):
                self.tensorboard.add_scalar(f"{prefix}/{name}", value, record["step"])
        self.tensorboard.flush()

    def close(self) -> None:
        if self.enabled:
            self.jsonl.close()
            self.tensorboard.close()
