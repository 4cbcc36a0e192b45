"""Descriptive head statistics over a dev subset, a dominant-role label per head, a table and a map.

Shares are the mean, over real query tokens, of the attention weight a query puts on:
  previous / same / next -- key position i-1 / i / i+1 (self-attention only);
  first                  -- the first key (the source's first token, or BOS in the decoder);
  anchor                 -- the first key, EOS and punctuation keys together ("sink" tokens);
  diagonal               -- cross-attention only: keys within 1 position of the monotone
                            diagonal j = i (S - 1) / (T - 1) for target length T, source length S.
entropy is the mean entropy of a query's weights (nats); entropy_norm divides it by log(number
of keys the query may attend) (1 = uniform). All statistics skip queries that may attend only
one key (the decoder's first position), whose weights say nothing about the head.
"""

from __future__ import annotations

import unicodedata
from pathlib import Path

import numpy as np

from analysis import heads, tables
from analysis.plotting import plt, save
from models.tokens import EOS_ID, PAD_ID
from training.data.batching import dev_batches

SHARES = ("previous", "same", "next", "first", "anchor", "diagonal")
STATS = (*SHARES, "entropy", "entropy_norm")
# A head is labelled with its largest share among these when that share reaches ROLE_THRESHOLD;
# otherwise "broad" if entropy_norm >= BROAD_THRESHOLD, else "mixed".
ROLES = ("previous", "same", "next", "anchor", "diagonal")
ROLE_THRESHOLD = 0.5
BROAD_THRESHOLD = 0.75
LABELS = (*ROLES, "broad", "mixed")


def batch_sums(weights, query_valid, key_valid, anchor_keys, *, causal: bool, cross: bool):
    """Sums and counts of every statistic for one batch: ({stat: [H]}, {stat: count}).

    weights: [B, H, Lq, Lk]; query_valid [B, Lq], key_valid [B, Lk], anchor_keys [B, Lk]: bool.
    Statistics that do not apply (positions in cross-attention, diagonal in self-attention)
    get count 0.
    """
    w = np.asarray(weights, np.float64)
    _, _, lq, lk = w.shape
    qv, kv = np.asarray(query_valid, bool), np.asarray(key_valid, bool)
    i, j = np.arange(lq)[:, None], np.arange(lk)[None, :]
    allowed = qv[:, :, None] & kv[:, None, :] & ((j <= i) if causal else True)  # [B, Lq, Lk]
    first = np.zeros(lk, bool)
    first[0] = True
    selectors = {"first": first & allowed, "anchor": (anchor_keys[:, None, :] | first) & allowed}
    if cross:
        src_len, tgt_len = kv.sum(1)[:, None, None], qv.sum(1)[:, None, None]
        centre = i * (src_len - 1) / np.maximum(tgt_len - 1, 1)
        selectors["diagonal"] = (np.abs(j - centre) <= 1.0) & allowed
    else:
        for name, offset in (("previous", -1), ("same", 0), ("next", 1)):
            selectors[name] = (j == i + offset) & allowed
    n_keys = allowed.sum(-1)
    wide = qv & (n_keys >= 2)  # a query with a single key to attend says nothing about the head
    sums, counts = {}, {}
    for name in SHARES:
        if name not in selectors:
            sums[name], counts[name] = np.zeros(w.shape[1]), 0
            continue
        rows = selectors[name].any(-1) & wide  # queries for which the statistic is defined
        sums[name] = np.einsum("bhqk,bqk->h", w, selectors[name] & rows[:, :, None])
        counts[name] = int(rows.sum())
    plogp = np.where(w > 0, w * np.log(np.where(w > 0, w, 1.0)), 0.0)
    entropy = -plogp.sum(-1)  # [B, H, Lq]
    sums["entropy"], counts["entropy"] = np.einsum("bhq,bq->h", entropy, wide), int(wide.sum())
    ratio = entropy / np.log(np.maximum(n_keys, 2))[:, None, :]
    sums["entropy_norm"], counts["entropy_norm"] = np.einsum("bhq,bq->h", ratio, wide), int(wide.sum())
    return sums, counts


def label(stats: dict) -> str:
    """The dominant role of one head from its statistics (see ROLE_THRESHOLD, BROAD_THRESHOLD)."""
    shares = {r: stats[r] for r in ROLES if not np.isnan(stats[r])}
    best = max(shares, key=shares.get)
    if shares[best] >= ROLE_THRESHOLD:
        return best
    return "broad" if stats["entropy_norm"] >= BROAD_THRESHOLD else "mixed"


def anchor_ids(vocab) -> np.ndarray:
    """[vocab] bool: EOS and pieces made only of punctuation (after the word-start mark)."""
    table = np.zeros(vocab.get_piece_size(), bool)
    for i in range(vocab.get_piece_size()):
        text = vocab.id_to_piece(i).replace("\u2581", "")
        table[i] = bool(text) and all(unicodedata.category(c).startswith("P") for c in text)
    table[EOS_ID] = True
    return table


def head_statistics(run, corpus) -> list[dict]:
    """One row per (kind, layer, head): the statistics over `corpus` (teacher-forced references) and a label."""
    anchors = anchor_ids(run.vocab)
    totals: dict = {}
    for batch in dev_batches(run.config, run.vocab, corpus):
        weights = heads.attention_weights(run.model, run.params, batch["src"], batch["tgt_in"])
        src_valid, tgt_valid = batch["src"] != PAD_ID, batch["tgt_in"] != PAD_ID
        args = {
            "encoder_self": (src_valid, src_valid, anchors[batch["src"]], False, False),
            "decoder_self": (tgt_valid, tgt_valid, anchors[batch["tgt_in"]], True, False),
            "decoder_cross": (tgt_valid, src_valid, anchors[batch["src"]], False, True),
        }
        for kind, (qv, kv, anchor, causal, cross) in args.items():
            for layer, w in enumerate(weights[kind]):
                sums, counts = batch_sums(w, qv, kv, anchor, causal=causal, cross=cross)
                total = totals.setdefault((kind, layer), ({s: 0.0 for s in STATS}, {s: 0 for s in STATS}))
                for s in STATS:
                    total[0][s] = total[0][s] + sums[s]
                    total[1][s] += counts[s]
    return [
        {"kind": kind, "layer": layer, "head": head, **stats, "label": label(stats)}
        for (kind, layer), (sums, counts) in totals.items()
        for head, stats in enumerate(means(sums, counts))
    ]


def means(sums, counts) -> list[dict]:
    """Per head {stat: mean} from accumulated `batch_sums` output (NaN where a statistic does not apply)."""
    num_heads = len(sums["entropy"])
    return [{s: float(sums[s][h] / counts[s]) if counts[s] else float("nan") for s in STATS} for h in range(num_heads)]


def write_table(rows, csv_path: Path, md_path: Path) -> None:
    tables.write(rows, ["kind", "layer", "head", *STATS, "label"], csv_path, md_path)


def plot_map(rows, path: Path) -> Path:
    """Layer x head grid per attention kind, coloured by label; each cell names the largest role share and
    entropy_norm."""
    kinds = list(heads.MODULES)
    layers = 1 + max(r["layer"] for r in rows)
    num_heads = 1 + max(r["head"] for r in rows)
    colours = plt.get_cmap("tab10")
    fig, axes = plt.subplots(
        1, len(kinds), figsize=(1.3 * num_heads * len(kinds) + 1, 1.0 * layers + 1.2), squeeze=False
    )
    for ax, kind in zip(axes[0], kinds):
        grid = np.zeros((layers, num_heads, 3))
        for r in (r for r in rows if r["kind"] == kind):
            grid[r["layer"], r["head"]] = colours(LABELS.index(r["label"]))[:3]
            top = max((role for role in ROLES if not np.isnan(r[role])), key=lambda role: r[role])
            text = f"{r['label']}\n{top} {r[top]:.2f}\nentropy {r['entropy_norm']:.2f}"
            ax.text(r["head"], r["layer"], text, ha="center", va="center", fontsize=7)
        ax.imshow(grid, aspect="auto", alpha=0.55)
        ax.set_xticks(range(num_heads), [f"h{h}" for h in range(num_heads)])
        ax.set_yticks(range(layers), [f"layer {i}" for i in range(layers)])
        ax.set_title(kind, fontsize=9)
    fig.suptitle(
        f"dominant role (share >= {ROLE_THRESHOLD}; else broad if entropy_norm >= {BROAD_THRESHOLD}, else mixed)",
        fontsize=9,
    )
    fig.tight_layout()
    return save(fig, path)
