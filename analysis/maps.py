"""Per-layer, per-head attention heatmaps for one sentence, with the tokens on the axes."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from analysis import heads
from analysis.plotting import plt, save
from models.tokens import BOS_ID
from training.evaluation import translate

TITLES = {
    "encoder_self": "encoder self-attention (query: source, key: source)",
    "decoder_self": "decoder self-attention (query: target input, key: target input)",
    "decoder_cross": "cross-attention (query: target input, key: source)",
}


def sentence_maps(run, sentence: str) -> tuple[dict[str, np.ndarray], list[str], list[str]]:
    """({kind: [num_layers, H, Lq, Lk]}, source pieces, target-input pieces) for `sentence`.

    The target is the model's own greedy translation, fed teacher-forced after BOS, so the
    decoder maps show what the model attends to while producing its output.
    """
    config, model = run.config, run.model
    src = run.vocab.encode(sentence.strip())[: model.config.max_len]
    if not src:
        raise ValueError(f"the sentence {sentence!r} has no tokens")
    hyp = translate.translate(
        model,
        run.params,
        [src],
        beam_size=1,
        alpha=config.eval.alpha,
        max_extra_length=config.eval.max_extra_length,
        bucket_lengths=config.data.bucket_lengths,
        rows=1,
    )[0]
    tgt_in = [BOS_ID, *hyp][: model.config.max_len]
    weights = heads.attention_weights(model, run.params, np.array([src], np.int32), np.array([tgt_in], np.int32))
    pieces = lambda ids: [run.vocab.id_to_piece(int(t)) for t in ids]
    return {k: w[:, 0] for k, w in weights.items()}, pieces(src), pieces(tgt_in)


def plot(weights: np.ndarray, query_tokens, key_tokens, title: str, path: Path) -> Path:
    """A num_layers x H grid of heatmaps of `weights` [num_layers, H, Lq, Lk] (rows: queries)."""
    layers, num_heads, lq, lk = weights.shape
    cell = 0.5 + 0.17 * max(lq, lk)
    fig, axes = plt.subplots(layers, num_heads, figsize=(cell * num_heads, cell * layers), squeeze=False)
    for i in range(layers):
        for h in range(num_heads):
            ax = axes[i, h]
            ax.imshow(weights[i, h], vmin=0.0, vmax=1.0, cmap="viridis", aspect="equal")
            ax.set_title(f"layer {i} head {h}", fontsize=8)
            ax.set_xticks(range(lk), key_tokens if i == layers - 1 else [""] * lk, rotation=90, fontsize=6)
            ax.set_yticks(range(lq), query_tokens if h == 0 else [""] * lq, fontsize=6)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return save(fig, path)


def render(run, sentence: str, out_dir: Path, prefix: str = "maps") -> list[Path]:
    """One PNG per attention kind: `out_dir/{prefix}_{kind}.png`."""
    weights, src, tgt_in = sentence_maps(run, sentence)
    axes = {"encoder_self": (src, src), "decoder_self": (tgt_in, tgt_in), "decoder_cross": (tgt_in, src)}
    return [plot(weights[kind], *axes[kind], TITLES[kind], out_dir / f"{prefix}_{kind}.png") for kind in heads.MODULES]
