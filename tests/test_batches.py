"""Tests for transformer/data/batches.py: training batches by (seed, step), host rows, validation batches."""

import numpy as np
import pytest

from transformer.data.batches import batch_at, eval_batches


TOKENS = np.arange(1000, dtype=np.uint16)  # token i at position i: windows show their start


def test_batch_at_is_a_function_of_seed_and_step():
    kwargs = dict(batch_size=8, seq_len=16)
    x, y = batch_at(TOKENS, seed=0, step=5, **kwargs)
    assert x.shape == y.shape == (8, 16) and x.dtype == y.dtype == np.int32
    np.testing.assert_array_equal(x[:, 1:], y[:, :-1])  # targets are the inputs shifted by one
    np.testing.assert_array_equal(y, x + 1)
    np.testing.assert_array_equal(x, batch_at(TOKENS, seed=0, step=5, **kwargs)[0])
    assert not np.array_equal(x, batch_at(TOKENS, seed=0, step=6, **kwargs)[0])
    assert not np.array_equal(x, batch_at(TOKENS, seed=1, step=5, **kwargs)[0])


def test_batch_at_reaches_both_ends():
    tokens = np.arange(20, dtype=np.uint16)
    starts = {int(batch_at(tokens, seed=0, step=s, batch_size=4, seq_len=16)[0][i, 0])
              for s in range(50) for i in range(4)}
    assert starts == {0, 1, 2, 3}  # last start 3: window 3..19 ends at the last token


def test_host_slices_concatenate_to_the_global_batch():
    kwargs = dict(seed=3, step=7, batch_size=8, seq_len=16)
    whole = batch_at(TOKENS, **kwargs)
    parts = [batch_at(TOKENS, **kwargs, host_index=h, host_count=2) for h in range(2)]
    assert parts[0][0].shape == (4, 16)
    for i in range(2):
        np.testing.assert_array_equal(np.concatenate([p[i] for p in parts]), whole[i])


def test_batch_errors_name_the_numbers():
    with pytest.raises(ValueError, match="batch_size=6 is not divisible by host_count=4"):
        batch_at(TOKENS, seed=0, step=0, batch_size=6, seq_len=8, host_index=0, host_count=4)
    with pytest.raises(ValueError, match="10 tokens, fewer than seq_len \\+ 1 = 17"):
        batch_at(TOKENS[:10], seed=0, step=0, batch_size=2, seq_len=16)


def test_eval_batches_are_fixed_and_spread_over_the_tokens():
    batches = eval_batches(TOKENS, num_batches=3, batch_size=4, seq_len=16)
    assert len(batches) == 3
    again = eval_batches(TOKENS, num_batches=3, batch_size=4, seq_len=16)
    for (x, y), (x2, y2) in zip(batches, again):
        assert x.shape == (4, 16)
        np.testing.assert_array_equal(x, x2)
        np.testing.assert_array_equal(y, x + 1)
    starts = np.concatenate([x[:, 0] for x, _ in batches])
    assert starts[0] == 0 and starts[-1] == len(TOKENS) - 17  # first and last possible windows
    assert np.all(np.abs(np.diff(starts) - np.diff(starts).mean()) <= 1)  # evenly spaced
    halves = [eval_batches(TOKENS, num_batches=3, batch_size=4, seq_len=16, host_index=h,
                           host_count=2) for h in range(2)]
    for b in range(3):
        joined = np.concatenate([halves[0][b][0], halves[1][b][0]])
        np.testing.assert_array_equal(joined, batches[b][0])
