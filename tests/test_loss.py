"""Tests for transformer/loss.py: the cross-entropy objective."""

import jax
import jax.numpy as jnp
import numpy as np

from transformer.loss import cross_entropy


def test_cross_entropy_matches_numpy():
    logits = jax.random.normal(jax.random.key(0), (2, 3, 5), jnp.bfloat16)
    targets = jnp.array([[0, 1, 4], [2, 3, 3]])
    lg = np.asarray(logits, np.float32)
    logp = lg - np.log(np.exp(lg).sum(-1, keepdims=True))
    expected = -np.take_along_axis(logp, np.asarray(targets)[..., None], -1).mean()
    got = cross_entropy(logits, targets)
    assert got.dtype == jnp.float32
    np.testing.assert_allclose(got, expected, rtol=1e-5)
