"""Tests of transformer/analysis/patching.py: each grid cell equals the same patch made on its own
with edits.patch; where clean and corrupted inputs differ in one token, the (layer 0, position) grid
restores the clean run at that token's cell only; the metric and its normalisation."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers.decoder import jit
from tests.helpers.marks import first_fast
from tests.test_capture import T, model, tokens
from transformer.analysis.capture import capture
from transformer.analysis.patching import logit_difference, patch_heads, patch_positions
from transformer.model import edits

TOL = dict(rtol=1e-4, atol=1e-4)


def pair(changed: int = 3):
    """A clean input and a corrupted one that differs from it in token `changed` alone."""
    clean = tokens(seed=1)
    return clean, clean.at[:, changed].set((clean[:, changed] + 7) % 64)


@pytest.mark.parametrize("variant, scan_layers", first_fast([("gqa_qk_norm", False), ("sink_registers", True)]))
def test_each_cell_of_the_grids_is_that_patch_on_its_own(variant, scan_layers):
    cfg, params = model(variant, scan_layers)
    clean, corrupted = pair()
    metric = logit_difference(jnp.array([1, 2]), jnp.array([3, 4]))
    heads = jit(lambda p: patch_heads(p, cfg, clean, corrupted, metric))(params)
    where = jit(lambda p: patch_positions(p, cfg, clean, corrupted, metric, point="resid_mid"))(params)
    assert heads.grid.shape == (cfg.num_layers, cfg.num_heads) and where.grid.shape == (cfg.num_layers, T)
    _, _, got = capture(params, cfg, clean, ["blocks.*.attn.z", "blocks.*.resid_mid"])

    def alone(edit):
        return metric(edits.run(params, cfg, corrupted, [edit])[0])

    for l, h in [(0, 1), (1, 3)]:
        z = got["blocks.*.attn.z"][l]
        np.testing.assert_allclose(heads.grid[l, h], alone(edits.patch(cfg, f"blocks.{l}.attn.z", z, head=h)), **TOL)
    for l, t in [(0, 3), (1, 5)]:
        stream = got["blocks.*.resid_mid"][l]
        np.testing.assert_allclose(where.grid[l, t], alone(edits.patch(cfg, f"blocks.{l}.resid_mid", stream, position=t)), **TOL)
    np.testing.assert_allclose(heads.clean, alone(edits.patch(cfg, "embed", capture(params, cfg, clean, ["embed"])[2]["embed"])), **TOL)
    assert np.ptp(np.asarray(heads.grid)) > 1e-3 and np.ptp(np.asarray(where.grid)) > 1e-3


def test_patching_the_one_changed_token_restores_the_clean_run_and_nothing_else_does():
    """Layer 0's residual stream differs between the runs only at the changed token: patching it
    there gives the clean metric (normalised 1), anywhere else in layer 0 nothing (0); and no patch
    before the changed position changes anything in any layer."""
    cfg, params = model("mha")
    changed = 3
    clean, corrupted = pair(changed)
    metric = logit_difference(jnp.array([1, 2]), jnp.array([3, 4]))
    where = patch_positions(params, cfg, clean, corrupted, metric)
    normalised = np.asarray(where.normalised())
    assert abs(float(where.clean - where.corrupted)) > 1e-2  # the change matters
    np.testing.assert_allclose(normalised[0, changed], 1.0, **TOL)
    np.testing.assert_allclose(np.delete(normalised[0], changed), 0.0, **TOL)
    np.testing.assert_allclose(normalised[:, :changed], 0.0, **TOL)


def test_the_logit_difference_metric():
    logits = jnp.zeros((2, 3, 5)).at[0, -1, 1].set(2.0).at[1, -1, 4].set(-1.0).at[1, 0, 0].set(9.0)
    assert float(logit_difference(jnp.array([1, 0]), jnp.array([0, 4]))(logits)) == pytest.approx((2.0 + 1.0) / 2)
    assert float(logit_difference(jnp.array([0, 0]), jnp.array([1, 1]), position=0)(logits)) == pytest.approx(4.5)
