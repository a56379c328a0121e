"""Tests for transformer/training/muon.py: the same updates as optax's Muon with its shape scale, each
matrix read as it lies."""


import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from optax.contrib import MuonDimensionNumbers

from transformer import training
from transformer.model.config import ModelConfig
from transformer.training.muon import fans, orthogonalize, scale_by_muon, scale_by_shape
from transformer.training.optimizer import muon_dimension_numbers, muon_labels

CFG = ModelConfig(vocab_size=64, max_seq_len=16, d_model=32, num_layers=2, num_heads=4)


def optax_muon(beta: float) -> optax.GradientTransformation:
    """optax's scale_by_muon, then our shape scale (optax.contrib.muon's, which it does not export)."""
    return optax.chain(
        optax.contrib.scale_by_muon(beta=beta, nesterov=True, weight_dimension_numbers=muon_dimension_numbers),
        scale_by_shape(muon_dimension_numbers))


@pytest.mark.parametrize("variant", [
    dict(scan_layers=True),  # W [L, ...]: a batch of L matrices
    dict(scan_layers=False, num_kv_heads=2, activation="swiglu"),
    dict(scan_layers=False, attention="mla", kv_latent_dim=16, q_latent_dim=24, position="rope", rope_head_dim=4),
])
def test_three_updates_equal_optax_muon_with_its_shape_scale(variant):
    cfg = CFG.replace(**variant)
    params = training.init_params(cfg, jax.random.key(0))
    labels = muon_labels(params)
    assert jax.tree.leaves(labels).count("muon") >= 6 * (1 if cfg.scan_layers else 2)
    ours = optax.partition({"muon": optax.chain(scale_by_muon(0.9, muon_dimension_numbers),
                                                scale_by_shape(muon_dimension_numbers)), "adamw": optax.identity()}, labels)
    theirs = optax.partition({"muon": optax_muon(0.9), "adamw": optax.identity()}, labels)
    s_ours, s_theirs = ours.init(params), theirs.init(params)
    for step in range(3):
        grads = jax.tree.map(lambda p, i=step: jax.random.normal(jax.random.key(i), p.shape), params)
        u_ours, s_ours = jax.jit(ours.update)(grads, s_ours)
        u_theirs, s_theirs = jax.jit(theirs.update)(grads, s_theirs)
        for a, b in zip(jax.tree.leaves(u_ours), jax.tree.leaves(u_theirs)):
            np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-5)
    # the same state layout as optax's: a checkpoint of either restores into the other
    assert jax.tree.structure(s_ours) == jax.tree.structure(s_theirs)


def test_orthogonalize_reads_a_tall_matrix_as_its_transpose_without_turning_it():
    x = jax.random.normal(jax.random.key(0), (3, 48, 16))  # tall: the Gram matrix on the right
    np.testing.assert_allclose(orthogonalize(x), orthogonalize(x.swapaxes(1, 2)).swapaxes(1, 2), rtol=1e-4, atol=1e-5)
    s = np.linalg.svd(np.asarray(orthogonalize(x)), compute_uv=False)
    assert np.all((s > 0.6) & (s < 1.3)), s
    primitives = {e.primitive.name for e in jax.make_jaxpr(orthogonalize)(x).jaxpr.eqns}
    assert "dot_general" in primitives and "transpose" not in primitives


def test_a_matrix_is_read_as_out_by_in_and_other_axis_orders_are_refused():
    w_o = MuonDimensionNumbers(reduction_axis=(-2, -1), output_axis=(-3,))  # a scanned W_o [L, D, H, Kv]
    assert fans((2, 32, 4, 8), w_o) == (32, 32)
    fc_in = jnp.ones((128, 32))  # W_fc_in [4D, D]: x sqrt(4)
    scaled, _ = scale_by_shape(lambda u: MuonDimensionNumbers((-1,), (-2,))).update(fc_in, None)
    np.testing.assert_array_equal(scaled, 2 * fc_in)
    with pytest.raises(ValueError, match=r"\[..., out axes, in axes\]"):
        fans((8, 4), MuonDimensionNumbers(reduction_axis=(0,), output_axis=(1,)))
