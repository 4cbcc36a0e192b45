"""experiments.associative_recall's task generator: every query's target is the value stored in the pair token of
its key."""

import numpy as np
import pytest

from experiments.associative_recall import make_batch, vocabulary


def test_rows_hold_one_pair_token_per_key_and_queries_answered_by_them():
    vocab = vocabulary(num_keys=4, num_values=3, num_noise=2)
    # ids, by hand: keys 1-4, values 5-7, pair tokens 8-19 (key-major), noise 20-21
    assert vocab["size"] == 22
    tokens, targets, asked = make_batch(np.random.default_rng(0), vocab, rows=6, length=20, pairs=3, queries=2)
    assert tokens.shape == targets.shape == asked.shape == (6, 20) and tokens.dtype == np.int32
    for row, target, query in zip(tokens, targets, asked):
        assert list(np.flatnonzero(query)) == [18, 19]
        stored = [t for t in row[:18] if 8 <= t <= 19]
        assert len(stored) == 3 and set(row[:18]) - set(stored) <= {20, 21}  # the rest is noise
        lookup = {1 + (t - 8) // 3: 5 + (t - 8) % 3 for t in stored}
        assert len(lookup) == 3  # distinct keys
        assert [lookup[k] for k in row[18:]] == list(target[18:])


def test_a_row_too_short_for_its_pairs_and_queries_is_refused_by_name():
    with pytest.raises(ValueError, match="length = 4, pairs = 4, queries = 1"):
        make_batch(np.random.default_rng(0), vocabulary(10, 10, 3), rows=1, length=4, pairs=4, queries=1)
