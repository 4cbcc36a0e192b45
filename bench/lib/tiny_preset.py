"""The Table 3 preset at a tiny model size, and a log handler that keeps a run's own lines to read back."""

from __future__ import annotations

import logging

TINY_MODEL = dict(d_model=32, num_heads=4, mlp_dim=64)


def tiny_preset(packed: bool, steps: int, train_limit: int = 0, vocab_size: int | None = None):
    """The Table 3 preset (configs/table3_preset.py) at a tiny model size, `steps` steps, the first
    `train_limit` training pairs (0: all); `vocab_size` None: the preset's own."""
    from configs import default, table3_preset

    config = table3_preset.apply(default.get_config("h=4"), packed=packed)
    table3_preset.set_steps(config, steps)
    config.log_every_steps = max(1, steps // 10)
    config.data.train_limit = train_limit
    if vocab_size:
        config.data.vocab_size = vocab_size
    config.model.update(TINY_MODEL)
    return config


class LogLines(logging.Handler):
    """Every log record's (time, message), kept in order (to read a run's own lines back)."""

    def __init__(self):
        super().__init__()
        self.records: list[tuple[float, str]] = []

    def emit(self, record):
        self.records.append((record.created, record.getMessage()))

    @property
    def lines(self) -> list[str]:
        return [message for _, message in self.records]
