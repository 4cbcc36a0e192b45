"""The metrics a run logs every `log_every_steps`: the steps' timings, losses and compiles since the last line.

`Window` collects them step by step and `flush` turns them into one metrics record; `compile_summary` says what a
run compiled and loaded from the persistent cache.
"""

from __future__ import annotations

import math

import numpy as np

from training.core import compile_cache


def compile_summary(totals: dict) -> str:
    return (
        f"{totals['compiled']} programs compiled in {totals['compile_s']:.1f}s, "
        f"{totals['cache_loaded']} loaded from the persistent cache in {totals['cache_load_s']:.1f}s"
    )


class Window:
    """Accumulates per-step timings and metrics between two log lines, and the compiles since the last one."""

    def __init__(self, compiles: compile_cache.CompileCounter):
        self.rows, self.compiles, self.first_step_s = [], compiles, None
        self.compiled_before = compiles.totals()

    def add(self, data_s, step_s, tokens, padding, metrics):
        self.rows.append(
            (
                data_s,
                step_s,
                tokens,
                padding,
                float(metrics["loss"]),
                float(metrics["nll"]),
                float(metrics.get("grad_norm", math.nan)),
            )
        )

    def flush(self, step, learning_rate) -> dict:
        data_s, step_s, tokens, padding, loss, nll, grad_norm = np.array(self.rows).T
        self.rows = []
        total = data_s.sum() + step_s.sum()
        # the logged (last) step's norm on every platform: a GPU or TPU computes it on that step alone
        # (backends.grad_norm_every_step), so a CPU's other steps' norms are left out and the metric means one thing
        last_norm = grad_norm[-1]
        return {
            "step": step,
            "loss": float(loss.mean()),
            "nll": float(nll.mean()),
            "learning_rate": learning_rate,
            **({} if np.isnan(last_norm) else {"grad_norm": float(last_norm)}),
            "tokens_per_s": float(tokens.sum() / total),
            "step_time_s": float(total / len(loss)),
            "data_fraction": float(data_s.sum() / total),
            "padding_fraction": float(padding.mean()),
            **self._compiled_since_last(),
        }

    def _compiled_since_last(self) -> dict:
        """XLA compiles and cache loads since the previous record; the first record also has `first_step_s`."""
        totals, before = self.compiles.totals(), self.compiled_before
        self.compiled_before = totals
        since = {k: totals[k] - before[k] for k in ("compiled", "compile_s", "cache_loaded")}
        first, self.first_step_s = self.first_step_s, None
        return since if first is None else {**since, "first_step_s": first}
