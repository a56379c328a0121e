"""Tests of transformer/analysis/attribution_patching.py: the estimate equals actual patching where the
metric is linear in the patched point (and differs where it is not); the gradients are those of the
metric; the whole estimate is one traced, compiled program; AtP*'s recomputed softmax moves the
estimate towards actual patching where the attention is saturated; bad inputs get one-line errors."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers.decoder import BASE, jit, random_params
from tests.helpers.marks import first_fast
from tests.test_capture import model
from tests.test_patching import pair
from transformer import ModelConfig
from transformer.analysis import attribution_patching as atp
from transformer.analysis import patching
from transformer.analysis.capture import capture
from transformer.analysis.patching import logit_difference
from transformer.model import edits
from transformer.model.decoder import Decoder

TOL = dict(rtol=1e-4, atol=1e-4)


def linear_metric(logits: jax.Array) -> jax.Array:
    """A fixed linear function of every logit [B, T, V]: sum of logits * W, W drawn once."""
    return (logits * jax.random.normal(jax.random.key(7), logits.shape)).sum()


@pytest.mark.parametrize("scan_layers", first_fast([False, True]))  # make test: the loop; test-all: the scan too
def test_the_estimate_is_actual_patching_where_the_metric_is_linear_in_the_point(scan_layers):
    """Truly linear: the logits are h E^T of the final norm's output h (tied embeddings, no soft-cap), so a
    logit difference, or any fixed linear function of the logits, is linear in final_norm.out; and a
    post-norm model has no final norm, so its last layer's resid_post meets only the head. There a
    first-order step is the whole change: every cell equals its patch. One layer down the norms and the
    attention are in between, and the estimate is off (the test can tell)."""
    cfg, params = model("mha", scan_layers)
    clean, corrupted = pair()
    metric = logit_difference(jnp.array([1, 2]), jnp.array([3, 4]))

    @jit
    def grids(p):
        at_norm = [[f(p, cfg, clean, corrupted, m, "final_norm.out", axes=(1,)) for f in (patching.patch_point, atp.attribute)]
                   for m in (metric, linear_metric)]  # grids [T]
        return at_norm, [f(p, cfg, clean, corrupted, metric) for f in (patching.patch_heads, atp.attribute_heads)]

    at_norm, (heads, estimated_heads) = grids(params)
    for actual, estimate in at_norm:
        np.testing.assert_allclose(estimate.grid, actual.grid, **TOL)
        assert np.ptp(np.asarray(actual.grid)) > 1e-2
    np.testing.assert_allclose([estimated_heads.clean, estimated_heads.corrupted], [heads.clean, heads.corrupted],
                               **TOL)
    assert np.abs(np.asarray(estimated_heads.grid - heads.grid)).max() > 1e-2  # nonlinear in z: only an estimate

    post_cfg = ModelConfig(**{**BASE, "prenorm": False, "position": "learned", "scan_layers": scan_layers})
    actual, estimate = jit(lambda p: [f(p, post_cfg, clean, corrupted, linear_metric, point="resid_post") for f in (
        patching.patch_positions, atp.attribute_positions)])(random_params(Decoder(post_cfg)))
    last = post_cfg.num_layers - 1
    np.testing.assert_allclose(estimate.grid[last], actual.grid[last], **TOL)
    assert np.abs(np.asarray(estimate.grid[0] - actual.grid[0])).max() > 1e-2

def test_the_gradient_at_the_logits_is_the_logit_differences():
    """d/d logits of mean_b logits[b, -1, correct_b] - logits[b, -1, wrong_b] is +-1/B at those entries, 0 elsewhere;
    the points come back as capture gives them (the edit of zeros changes nothing)."""
    cfg, params = model("gqa_qk_norm")
    tokens = pair()[0]
    metric = logit_difference(jnp.array([1, 2]), jnp.array([3, 4]))
    names = ["logits", "blocks.*.attn.z", "logits"]  # a name twice: still one edit, one gradient
    value, points, grads = jit(lambda p: atp.gradients(p, cfg, tokens, metric, names))(params)
    want = np.zeros(points["logits"].shape, np.float32)
    want[0, -1, 1], want[1, -1, 2], want[0, -1, 3], want[1, -1, 4] = 0.5, 0.5, -0.5, -0.5
    np.testing.assert_allclose(grads["logits"], want, atol=1e-7)
    logits = jit(lambda p: Decoder(cfg).apply({"params": p}, tokens)[0])(params)
    np.testing.assert_allclose(points["logits"], logits, **TOL)
    np.testing.assert_allclose(value, (logits[:, -1][[0, 1], [1, 2]] - logits[:, -1][[0, 1], [3, 4]]).mean(), **TOL)
    assert grads["blocks.*.attn.z"].shape == points["blocks.*.attn.z"].shape == (2, *tokens.shape, 4, 8)


def test_the_estimate_is_one_program_traced_once():
    """One forward pass on clean and one value_and_grad on corrupted: the metric is traced twice in
    one trace of the jitted function (patching traces it inside a lax.map and twice more), and a
    second pair of inputs of the same shapes reuses the compiled program."""
    cfg, params = model("mha", scan_layers=True)
    traced = []

    def metric(logits):
        traced.append(1)
        return logits[:, -1, 1].mean()

    estimate = jit(lambda p, c, x: atp.attribute_heads(p, cfg, c, x, metric).grid)
    first = estimate(params, *pair(3))
    assert len(traced) == 2
    second = estimate(params, *pair(4))
    assert len(traced) == 2 and estimate._cache_size() == 1
    assert np.abs(np.asarray(first - second)).max() > 0


def test_atp_star_recomputes_a_saturated_softmax_that_the_linear_estimate_misses():
    """W_q and W_k of the last layer scaled 6x: its attention is one-hot (mean top weight > 0.99). A
    query patched from the clean run then moves its head's weight to another key, changing the metric,
    while the gradient through the saturated softmax is ~0, so the linear estimate sees ~nothing. AtP*
    recomputes the softmax of each cell: its error is under 0.6 of the linear estimate's (what is left
    is the final norm's curvature after the weights)."""
    cfg, params = model("mha")
    params = jax.tree.map(lambda x: x, params)  # new dicts: the drawn parameters stay as they are
    last = f"layers_{cfg.num_layers - 1}"
    for w in ("q", "k"):
        params[last]["attn"][w]["kernel"] = params[last]["attn"][w]["kernel"] * 6.0
    clean, corrupted = pair()
    metric = logit_difference(jnp.array([1, 2]), jnp.array([3, 4]))
    names = ("blocks.*.attn.q", "blocks.*.attn.k")

    @jit
    def grids(p):
        weights = capture(p, cfg, corrupted, ["blocks.*.attn.pattern"])[2]["blocks.*.attn.pattern"][-1]
        return weights, [[f(p, cfg, clean, corrupted, metric, name, axes=(0, 3)) for f in (
            patching.patch_point, atp.attribute, functools.partial(atp.attribute, saturation=True))] for name in names]

    weights, results = grids(params)
    assert float(weights.max(-1).mean()) > 0.99
    moved = {}
    for name, (actual, linear, star) in zip(names, results):
        linear_error = np.abs(np.asarray(linear.grid[-1] - actual.grid[-1])).sum()
        star_error = np.abs(np.asarray(star.grid[-1] - actual.grid[-1])).sum()
        assert star_error < 0.6 * linear_error and linear_error > 0.05, (name, star_error, linear_error)
        moved[name] = (np.asarray(actual.grid[-1] - linear.corrupted), np.asarray(linear.grid[-1] - linear.corrupted))
    actual_change, estimated_change = moved["blocks.*.attn.q"]  # head 0's queries: patching moves it, AtP sees ~0
    assert abs(actual_change[0]) > 0.2 and abs(estimated_change[0]) < 0.01


def test_atp_star_is_the_change_of_the_weights_that_patching_makes_times_their_gradient():
    """AtP*'s cell, independently: the attention weights captured with that cell patched (grouped keys,
    RoPE and QK-norm on the way), minus the corrupted run's, dotted with d metric / d weights."""
    cfg, params = model("gqa_qk_norm")
    clean, corrupted = pair()
    metric = logit_difference(jnp.array([1, 2]), jnp.array([3, 4]))
    name = "blocks.*.attn.pattern"

    @jit
    def both(p):
        star = atp.attribute(p, cfg, clean, corrupted, metric, "blocks.*.attn.k", axes=(0, 3), saturation=True)
        keys = capture(p, cfg, clean, ["blocks.1.attn.k"])[2]["blocks.1.attn.k"]
        _, weights, grads = atp.gradients(p, cfg, corrupted, metric, [name])
        patched = capture(p, cfg, corrupted, [name], edits=[edits.patch(cfg, "blocks.1.attn.k", keys, head=1)])[2][name]
        return star, ((patched - weights[name]) * grads[name]).sum()

    star, want = both(params)
    assert star.grid.shape == (cfg.num_layers, cfg.num_kv_heads)
    np.testing.assert_allclose(star.grid[1, 1] - star.corrupted, want, rtol=1e-4, atol=1e-6)
    assert abs(float(want)) > 1e-3


@pytest.mark.parametrize("call, message", [
    (lambda p, cfg, c, x, m: atp.attribute(p, cfg, c, x, m, "blocks.*.attn.zz", axes=(0, 3)), "not a point"),
    (lambda p, cfg, c, x, m: atp.attribute_heads(p, cfg, c, x[:, :-1], m), "differ in shape"),
    (lambda p, cfg, c, x, m: atp.attribute(p, cfg, c, x, m, "blocks.*.attn.z", axes=(0, 3), saturation=True),
     "queries or keys"),
    (lambda p, cfg, c, x, m: atp.gradients(p, cfg, x, m, ["blocks.0.attn.head_out"]), "cannot be edited"),
])
def test_bad_inputs_get_one_line_errors(call, message):
    cfg, params = model("mha")
    clean, corrupted = pair()
    with pytest.raises(ValueError, match=message) as error:
        call(params, cfg, clean, corrupted, logit_difference(jnp.array([1, 2]), jnp.array([3, 4])))
    assert "\n" not in str(error.value)
