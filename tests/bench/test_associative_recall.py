"""bench.associative_recall's task generator: every query's target is the value written right after its key."""

import numpy as np
import pytest

from bench.associative_recall import make_batch, vocabulary


def test_rows_hold_distinct_keys_their_values_and_queries_answered_by_them():
    vocab = vocabulary(num_keys=10, num_values=10, num_noise=3)
    tokens, targets, asked = make_batch(np.random.default_rng(0), vocab, rows=4, length=20, pairs=5, queries=3)
    assert tokens.shape == targets.shape == asked.shape == (4, 20) and tokens.dtype == np.int32
    for row, target, query in zip(tokens, targets, asked):
        keys, values = row[0:10:2], row[1:10:2]
        assert len(set(keys)) == 5 and set(keys) <= set(range(1, 11)) and set(values) <= set(range(11, 21))
        assert set(row[10:17]) <= {21, 22, 23}  # noise between the pairs and the queries
        assert list(np.flatnonzero(query)) == [17, 18, 19]
        lookup = dict(zip(keys, values))
        assert [lookup[k] for k in row[17:]] == list(target[17:])


def test_a_row_too_short_for_its_pairs_and_queries_is_refused_by_name():
    with pytest.raises(ValueError, match="length = 8, pairs = 4, queries = 1"):
        make_batch(np.random.default_rng(0), vocabulary(10, 10, 3), rows=1, length=8, pairs=4, queries=1)
