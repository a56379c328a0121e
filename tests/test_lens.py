"""Tests of transformer/analysis/lens.py: the logit lens's last layer is the model's logits and its
first the head applied to the embedding by hand; direct logit attribution's parts add up to the
target's logit (and to a logit difference) for every variant, and one head's part equals a hand
computation through the frozen final norm."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from tests.helpers.decoder import jit
from tests.helpers.marks import first_fast
from tests.test_capture import model, tokens
from transformer.analysis.capture import capture
from transformer.analysis.lens import direct_logit_attribution, logit_lens, unembedding
from transformer.model.decoder import Decoder

TOL = dict(rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("variant, scan_layers, softcap", [("mha", False, 0.0), ("mqa_post_norm", False, 0.0),
                                                           ("gqa_qk_norm", True, 5.0), ("sink_registers", False, 0.0)])
def test_the_logit_lens_of_the_last_layer_is_the_models_logits(variant, scan_layers, softcap):
    cfg, params = model(variant, scan_layers)
    cfg = cfg.replace(logit_softcap=softcap)
    x = tokens()
    lens = jit(lambda p, x: logit_lens(p, cfg, x))(params, x)
    logits, _ = jit(lambda p, x: Decoder(cfg).apply({"params": p}, x))(params, x)
    assert lens.shape == (cfg.num_layers + 1, *logits.shape)
    np.testing.assert_allclose(lens[-1], logits, **TOL)
    if softcap:
        assert np.abs(lens).max() <= softcap
    assert np.abs(lens[0] - lens[-1]).max() > 1e-2  # the layers change what is read


def test_the_logit_lens_of_the_embedding_is_the_head_by_hand():
    """Layer norm with gain and bias over E[tokens] + P[positions], then E^T (tied): in NumPy."""
    cfg, params = model("mha")
    x = tokens()
    lens = np.asarray(logit_lens(params, cfg, x)[0], np.float64)
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
    e = p["embed"]["embedding"][np.asarray(x)] + p["pos_embed"][np.arange(x.shape[1])]
    normed = (e - e.mean(-1, keepdims=True)) / np.sqrt(e.var(-1, keepdims=True) + cfg.norm_eps)
    normed = normed * p["final_norm"]["scale"] + p["final_norm"]["bias"]
    np.testing.assert_allclose(lens, normed @ p["embed"]["embedding"].T, **TOL)


@pytest.mark.parametrize("variant, scan_layers", first_fast([("mha", False), ("gqa_qk_norm", True), ("mla", False),
                                                  ("sink_registers", False), ("attention_only", False)]))
def test_direct_logit_attribution_adds_up_to_the_logit(variant, scan_layers):
    cfg, params = model(variant, scan_layers)
    x = tokens()
    targets = jax.random.randint(jax.random.key(5), x.shape, 0, cfg.vocab_size)
    against = (targets + 1) % cfg.vocab_size
    logits, _ = Decoder(cfg).apply({"params": params}, x)
    target_logit = np.take_along_axis(np.asarray(logits), np.asarray(targets)[..., None], -1)[..., 0]
    dla = jit(lambda p, x, t: direct_logit_attribution(p, cfg, x, t))(params, x, targets)
    assert dla.heads.shape == (cfg.num_layers, cfg.num_heads, *x.shape) and dla.mlp.shape == (cfg.num_layers, *x.shape)
    np.testing.assert_allclose(dla.logit, target_logit, **TOL)
    np.testing.assert_allclose(dla.total(), target_logit, rtol=1e-4, atol=1e-4)
    other = np.take_along_axis(np.asarray(logits), np.asarray(against)[..., None], -1)[..., 0]
    diff = direct_logit_attribution(params, cfg, x, targets, against)
    np.testing.assert_allclose(diff.total(), target_logit - other, rtol=1e-4, atol=1e-4)
    assert np.abs(dla.heads).max() > 1e-3 and np.std(np.asarray(dla.heads).reshape(-1, *x.shape), axis=0).max() > 1e-3


def test_a_heads_direct_attribution_is_its_output_through_the_frozen_norm():
    """head_out[1, 2] minus its mean, over the final stream's std, times the norm's gain, dotted with
    the target's unembedding row: in NumPy, from captured values."""
    cfg, params = model("mha")
    x = tokens()
    targets = jax.random.randint(jax.random.key(5), x.shape, 0, cfg.vocab_size)
    dla = direct_logit_attribution(params, cfg, x, targets)
    _, _, got = capture(params, cfg, x, ["blocks.1.attn.head_out", "blocks.1.resid_post"])
    c = np.asarray(got["blocks.1.attn.head_out"], np.float64)[:, :, 2]  # [B, T, D]
    final = np.asarray(got["blocks.1.resid_post"], np.float64)
    std = np.sqrt(final.var(-1, keepdims=True) + cfg.norm_eps)
    w = np.asarray(unembedding(params, cfg), np.float64)[np.asarray(targets)]  # [B, T, D]
    want = (((c - c.mean(-1, keepdims=True)) / std * np.asarray(params["final_norm"]["scale"])) * w).sum(-1)
    np.testing.assert_allclose(dla.heads[1, 2], want, **TOL)


def test_direct_logit_attribution_refuses_a_post_norm_model():
    cfg, params = model("mqa_post_norm")
    with pytest.raises(ValueError, match="needs a pre-norm model"):
        direct_logit_attribution(params, cfg, tokens(), tokens())
