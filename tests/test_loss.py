"""Tests for transformer/training/loss.py: the cross-entropy objective."""

import jax
import jax.numpy as jnp
import numpy as np

from transformer.data.batches import IGNORED
from transformer.training.loss import cross_entropy


def test_cross_entropy_matches_numpy():
    logits = jax.random.normal(jax.random.key(0), (2, 3, 5), jnp.bfloat16)
    targets = jnp.array([[0, 1, 4], [2, 3, 3]])
    lg = np.asarray(logits, np.float32)
    logp = lg - np.log(np.exp(lg).sum(-1, keepdims=True))
    expected = -np.take_along_axis(logp, np.asarray(targets)[..., None], -1).mean()
    got = cross_entropy(logits, targets)
    assert got.dtype == jnp.float32
    np.testing.assert_allclose(got, expected, rtol=1e-5)


def test_ignored_targets_are_left_out_of_the_mean():
    logits = jax.random.normal(jax.random.key(1), (2, 4, 5))
    targets = jnp.array([[0, IGNORED, 4, IGNORED], [IGNORED, 3, IGNORED, IGNORED]])
    lg = np.asarray(logits)
    logp = lg - np.log(np.exp(lg).sum(-1, keepdims=True))
    expected = -np.mean([logp[0, 0, 0], logp[0, 2, 4], logp[1, 1, 3]])
    np.testing.assert_allclose(cross_entropy(logits, targets), expected, rtol=1e-5)
    assert float(cross_entropy(logits, jnp.full((2, 4), IGNORED))) == 0.0  # nothing graded: no NaN
