"""Prune heads in steps and record dev BLEU and loss: by importance, at random, and by reverse importance.

Pruning a head zeroes its W^O rows (`heads.zero_heads`), which is exactly a `head_mask` gate of 0
on its output (tested), so the ordinary decoders score the pruned model.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from analysis import heads, tables
from analysis.plotting import plt, save
from training.evaluation import translate
from sweeps import significance

ORDERS = ("importance", "random", "reverse")


def removal_order(importance: dict[str, np.ndarray], order: str, kinds, seed: int = 0) -> list[tuple[str, int, int]]:
    """The heads of `kinds` in the order they are pruned.

    importance: least important first (ties by position); reverse: most important first;
    random: a permutation drawn from `seed`.
    """
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
    unknown = [k for k in kinds if k not in importance]
    if unknown or not kinds:
        raise ValueError(f"kinds must be a non-empty subset of {tuple(importance)}, got {list(kinds)}")
    candidates = [(k, i, h) for k in kinds for i in range(importance[k].shape[0]) for h in range(importance[k].shape[1])]
    if order == "random":
        return [candidates[i] for i in np.random.default_rng(seed).permutation(len(candidates))]
    scores = np.array([importance[k][i, h] for k, i, h in candidates])
    ranked = np.argsort(scores if order == "importance" else -scores, kind="stable")
    return [candidates[i] for i in ranked]


def prune_curves(run, score, importance, kinds, *, steps: int = 10, seed: int = 0) -> list[dict]:
    """Rows {order, fraction, pruned, loss, bleu, heads} for fractions 0, 1/steps, ..., 1 of the heads in `kinds`.

    score: params -> {"loss", "bleu"} (e.g. `workdir.scorer`); equal masks are scored once.
    """
    cache: dict = {}
    rows = []
    for order in ORDERS:
        sequence = removal_order(importance, order, kinds, seed)
        for step in range(steps + 1):
            count = int(round(step / steps * len(sequence)))
            removed = tuple(sorted(sequence[:count]))
            if removed not in cache:
                cache[removed] = score(heads.zero_heads(run.params, heads.mask_without(run.model.config, removed)))
                logging.info("pruned %d heads (%s order): %s", count, order, cache[removed])
            rows.append({
                "order": order, "fraction": count / len(sequence), "pruned": count, **cache[removed],
                "heads": " ".join(f"{k}:{i}.{h}" for k, i, h in sequence[:count]),
            })
    return rows


def held_out_test(run, importance, kinds, corpus, *, fraction: float = 0.5, beam_size: int = 4, seed: int = 0) -> list[dict]:
    """The unpruned model against `fraction` of the heads of `kinds` pruned in importance and in random
    order, on `corpus` (held out from the importance sentences): rows {model, pruned, of, bleu,
    delta, p}, p = sacreBLEU's paired bootstrap of the pruned model's BLEU against the unpruned one's."""
    if not 0 < fraction < 1:
        raise ValueError(f"fraction must be in (0, 1), got {fraction}")
    src_ids = run.vocab.encode(list(corpus.src))
    config = run.config

    def hypotheses(params) -> list[str]:
        return run.vocab.decode(translate.translate(
            run.model, params, src_ids, beam_size=beam_size, alpha=config.eval.alpha,
            max_extra_length=config.eval.max_extra_length, bucket_lengths=config.data.bucket_lengths))

    full = hypotheses(run.params)
    full_bleu = translate.corpus_bleu(full, corpus.tgt)[0]
    rows = [{"model": "unpruned", "pruned": 0, "of": 0, "bleu": full_bleu, "delta": 0.0, "p": float("nan")}]
    for order in ("importance", "random"):
        sequence = removal_order(importance, order, kinds, seed)
        count = int(round(fraction * len(sequence)))
        pruned = hypotheses(heads.zero_heads(run.params, heads.mask_without(run.model.config, tuple(sorted(sequence[:count])))))
        bleu = translate.corpus_bleu(pruned, corpus.tgt)[0]
        rows.append({"model": f"{order} order", "pruned": count, "of": len(sequence), "bleu": bleu,
                     "delta": bleu - full_bleu, "p": significance.paired_bootstrap(full, pruned, corpus.tgt)})
        logging.info("held-out test, %d of %d heads pruned in %s order: %s", count, len(sequence), order, rows[-1])
    return rows


HELD_OUT_FIELDS = ["model", "pruned", "of", "bleu", "delta", "p"]


def write_csv(rows, path: Path) -> Path:
    tables.write(rows, ["order", "fraction", "pruned", "bleu", "loss", "heads"], csv_path=path)
    return path


def plot(rows, path: Path, title: str) -> Path:
    """BLEU and dev loss against the fraction of heads pruned, one curve per order."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.4))
    for order, style in zip(ORDERS, ("o-", "s--", "^:")):
        mine = [r for r in rows if r["order"] == order]
        x = [r["fraction"] for r in mine]
        left.plot(x, [r["bleu"] for r in mine], style, label=order, markersize=4)
        right.plot(x, [r["loss"] for r in mine], style, label=order, markersize=4)
    left.set(xlabel="fraction of heads pruned", ylabel="dev BLEU")
    right.set(xlabel="fraction of heads pruned", ylabel="dev loss (NLL/token)", yscale="log")
    left.legend(fontsize=8)
    for ax in (left, right):
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return save(fig, path)
