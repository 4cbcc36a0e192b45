"""Role statistics on hand-built attention matrices."""

import numpy as np
import pytest

from analysis import roles

L = 6


def stats_of(matrix, *, causal=False, cross=False, anchors=None, lq=None):
    """Statistics of one head whose weights are `matrix` [Lq, Lk] for a single unpadded sentence."""
    lq, lk = matrix.shape
    anchors = np.zeros((1, lk), bool) if anchors is None else anchors[None]
    sums, counts = roles.batch_sums(
        matrix[None, None], np.ones((1, lq), bool), np.ones((1, lk), bool), anchors, causal=causal, cross=cross
    )
    (stats,) = roles.means(sums, counts)
    return stats


def test_identity_is_same_token():
    stats = stats_of(np.eye(L))
    assert stats["same"] == pytest.approx(1.0) and stats["previous"] == 0.0 and stats["next"] == 0.0
    assert stats["entropy"] == pytest.approx(0.0)
    assert roles.label(stats) == "same"


def test_shifted_identity_is_previous_token():
    matrix = np.eye(L, k=-1)
    matrix[0, 0] = 1.0  # the first query has no previous token
    stats = stats_of(matrix)
    assert stats["previous"] == pytest.approx(1.0)  # over the L - 1 queries that have one
    assert stats["same"] == pytest.approx(1 / L)
    assert roles.label(stats) == "previous"


def test_next_token_and_causal_decoder_skip_the_single_key_query():
    matrix = np.eye(L, k=1)
    matrix[-1, -1] = 1.0
    assert roles.label(stats_of(matrix)) == "next"
    causal = np.tril(np.ones((L, L))) / np.arange(1, L + 1)[:, None]  # uniform over the visible prefix
    stats = stats_of(causal, causal=True)
    # queries 1..L-1 (query 0 sees one key and is skipped): weight 1/(i+1) on each of i and i-1
    assert stats["same"] == pytest.approx(np.mean(1 / np.arange(2, L + 1)))
    assert stats["entropy_norm"] == pytest.approx(1.0) and np.isnan(stats["next"])
    assert roles.label(stats) == "broad"


def test_first_token_and_punctuation_are_anchors():
    matrix = np.zeros((L, L))
    matrix[:, 0], matrix[:, -1] = 0.3, 0.7  # the last key is a full stop
    anchors = np.zeros(L, bool)
    anchors[-1] = True
    stats = stats_of(matrix, anchors=anchors)
    assert stats["first"] == pytest.approx(0.3) and stats["anchor"] == pytest.approx(1.0)
    assert roles.label(stats) == "anchor"


def test_cross_attention_diagonal_uses_the_length_ratio():
    tgt, src = 4, 7  # diagonal key for query i: 2 i
    matrix = np.zeros((tgt, src))
    matrix[np.arange(tgt), 2 * np.arange(tgt)] = 1.0
    stats = stats_of(matrix, cross=True)
    assert stats["diagonal"] == pytest.approx(1.0) and np.isnan(stats["same"])
    assert roles.label(stats) == "diagonal"
    off = np.zeros((tgt, src))
    off[:, -1] = 1.0  # always the last source token: on the diagonal only for the last query
    assert stats_of(off, cross=True)["diagonal"] == pytest.approx(1 / tgt)


def test_padding_is_ignored():
    matrix = np.eye(L)
    sums, counts = roles.batch_sums(
        np.stack([matrix, np.ones((L, L)) / L])[:, None],
        np.array([[True] * L, [False] * L]),
        np.array([[True] * L, [False] * L]),
        np.zeros((2, L), bool),
        causal=False,
        cross=False,
    )
    assert roles.means(sums, counts)[0]["same"] == pytest.approx(1.0)
