"""Prune heads in steps and record dev BLEU and loss: by importance, at random, and by reverse importance.

Pruning a head zeroes its W^O rows (`heads.zero_heads`), which is exactly a `head_mask` gate of 0
on its output (tested), so the ordinary decoders score the pruned model.
"""

from __future__ import annotations

import json
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
    candidates = [
        (k, i, h) for k in kinds for i in range(importance[k].shape[0]) for h in range(importance[k].shape[1])
    ]
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
            rows.append(
                {
                    "order": order,
                    "fraction": count / len(sequence),
                    "pruned": count,
                    **cache[removed],
                    "heads": " ".join(f"{k}:{i}.{h}" for k, i, h in sequence[:count]),
                }
            )
    return rows


def held_out_test(
    run, importance, kinds, corpus, *, fraction: float = 0.5, beam_size: int = 4, seed: int = 0
) -> list[dict]:
    """The unpruned model against `fraction` of the heads of `kinds` pruned in importance and in random
    order, on `corpus` (held out from the importance sentences).

    Returns (rows, outputs): rows {model, pruned, of, bleu, delta, p_bootstrap, p_randomization}, with
    sacreBLEU's paired bootstrap p (one-sided in effect) and its paired approximate randomization p
    (two-sided) of the pruned model against the unpruned one; outputs {model: {"hypotheses": lines,
    "heads": the pruned heads as "kind:layer.head"}} so that the comparison can be re-derived."""
    if not 0 < fraction < 1:
        raise ValueError(f"fraction must be in (0, 1), got {fraction}")
    src_ids = run.vocab.encode(list(corpus.src))
    config = run.config

    def hypotheses(params) -> list[str]:
        return run.vocab.decode(
            translate.translate(
                run.model,
                params,
                src_ids,
                beam_size=beam_size,
                alpha=config.eval.alpha,
                max_extra_length=config.eval.max_extra_length,
                bucket_lengths=config.data.bucket_lengths,
            )
        )

    full = hypotheses(run.params)
    full_bleu = translate.corpus_bleu(full, corpus.tgt)[0]
    rows = [
        {
            "model": "unpruned",
            "pruned": 0,
            "of": 0,
            "bleu": full_bleu,
            "delta": 0.0,
            "p_bootstrap": float("nan"),
            "p_randomization": float("nan"),
        }
    ]
    outputs = {"unpruned": {"hypotheses": full, "heads": []}}
    for order in ("importance", "random"):
        sequence = removal_order(importance, order, kinds, seed)
        count = int(round(fraction * len(sequence)))
        removed = tuple(sorted(sequence[:count]))
        pruned = hypotheses(heads.zero_heads(run.params, heads.mask_without(run.model.config, removed)))
        bleu = translate.corpus_bleu(pruned, corpus.tgt)[0]
        rows.append(
            {
                "model": f"{order} order",
                "pruned": count,
                "of": len(sequence),
                "bleu": bleu,
                "delta": bleu - full_bleu,
                "p_bootstrap": significance.paired_bootstrap(full, pruned, corpus.tgt),
                "p_randomization": significance.paired_randomization(full, pruned, corpus.tgt),
            }
        )
        outputs[f"{order} order"] = {"hypotheses": pruned, "heads": [f"{k}:{i}.{h}" for k, i, h in removed]}
        logging.info("held-out test, %d of %d heads pruned in %s order: %s", count, len(sequence), order, rows[-1])
    return rows, outputs


HELD_OUT_FIELDS = ["model", "pruned", "of", "bleu", "delta", "p_bootstrap", "p_randomization"]


def write_outputs(outputs: dict, stem: Path) -> list[Path]:
    """Each model's hypotheses (`STEM.MODEL.txt`, one line per test sentence) and the pruned heads of
    each (`STEM.heads.json`), so that the held-out comparison can be re-scored without the checkpoint."""
    paths = []
    for model, out in outputs.items():
        path = stem.with_name(f"{stem.name}.{model.replace(' ', '_')}.txt")
        path.write_text("".join(line + "\n" for line in out["hypotheses"]), encoding="utf-8")
        paths.append(path)
    heads_path = stem.with_name(f"{stem.name}.heads.json")
    heads_path.write_text(json.dumps({m: out["heads"] for m, out in outputs.items()}, indent=1) + "\n")
    return paths + [heads_path]


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
