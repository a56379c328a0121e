"""Tests of the named points (transformer/model/points.py) and their capture (transformer/analysis/capture.py):
every listed point comes back with its documented shape under jit, in both layer layouts and for
every attention variant, with the model's logits; a forward pass that captures nothing is the same
program as a model with no points; the captured attention equals a hand computation from the
lecture's formula; the heads' contributions add up to the attention output; a decoding step's
points equal the full forward's at that position."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers.decoder import BASE, jit, random_params
from transformer import ModelConfig, init_cache
from transformer.analysis.capture import capture, list_points
from transformer.model import attention, decoder, norm
from transformer.model.decoder import Decoder

T = 6
VARIANTS = {
    "mha": dict(position="learned"),
    "gqa_qk_norm": dict(num_kv_heads=2, qk_norm=True, position="rope", norm="rmsnorm", activation="swiglu"),
    "mqa_post_norm": dict(num_kv_heads=1, prenorm=False, position="sinusoidal"),
    "mla": dict(attention="mla", kv_latent_dim=16, q_latent_dim=24, rope_head_dim=4, v_head_dim=6, position="rope"),
    "sink_registers": dict(attention_sink=True, num_registers=2, position="rope"),
    "attention_only": dict(mlp_dim=0, position="none"),
}


def model(variant: str, scan_layers: bool = False):
    cfg = ModelConfig(**{**BASE, **VARIANTS[variant], "scan_layers": scan_layers})
    return cfg, random_params(Decoder(cfg))


def tokens(b: int = 2, t: int = T, seed: int = 1):
    return jax.random.randint(jax.random.key(seed), (b, t), 0, BASE["vocab_size"])


def shapes(cfg: ModelConfig, b: int, t: int) -> dict[str, tuple]:
    """The documented shape of every point (the table in transformer/model/points.py), per layer."""
    d, h, g, k, f = cfg.d_model, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.mlp_dim
    s = cfg.num_registers + t + (1 if cfg.attention_sink else 0)
    mla = cfg.attention == "mla"
    k_q = k + (cfg.rope_head_dim or 0) if mla else k
    kv = cfg.v_head_dim if mla else k
    per_layer = {
        "resid_pre": (b, t, d), "attn_norm.out": (b, t, d), "resid_mid": (b, t, d), "resid_post": (b, t, d),
        "mlp_norm.out": (b, t, d), "mlp.hidden": (b, t, f), "mlp.out": (b, t, d),
        "attn.q_norm.out": (b, t, cfg.q_latent_dim) if mla else (b, t, h, k), "attn.k_norm.out": (b, t, g, k),
        "attn.kv_norm.out": (b, t, cfg.kv_latent_dim or 0),
        "attn.latent": (b, t, (cfg.kv_latent_dim or 0) + (cfg.rope_head_dim or 0)),
        "attn.q": (b, t, h, k_q), "attn.k": (b, t, h, k_q) if mla else (b, t, g, k),
        "attn.v": (b, t, h, kv) if mla else (b, t, g, k),
        "attn.scores": (b, h, t, s), "attn.pattern": (b, h, t, s), "attn.sink_share": (b, h, t),
        "attn.register_share": (b, h, t), "attn.z": (b, t, h, kv), "attn.head_out": (b, t, h, d), "attn.out": (b, t, d),
    }
    top = {"embed": (b, t, d), "pos_embed": (b, t, d), "final_norm.out": (b, t, d), "logits": (b, t, cfg.vocab_size)}
    return {n: top[n] if n in top else per_layer[n.split(".", 2)[2]] for n in list_points(cfg)}


@pytest.mark.parametrize("variant, scan_layers", [(v, False) for v in VARIANTS] + [
    (v, True) for v in ("mha", "mla", "sink_registers")], ids=lambda x: {False: "loop", True: "scan"}.get(x, x))
def test_every_point_is_captured_with_its_shape_under_jit_and_the_logits_are_the_models(variant, scan_layers):
    cfg, params = model(variant, scan_layers)
    x = tokens()
    names = list_points(cfg) + ["blocks.*.resid_post"]
    logits, _, got = jit(lambda p, x: capture(p, cfg, x, names))(params, x)
    plain, _ = jit(lambda p, x: Decoder(cfg).apply({"params": p}, x))(params, x)
    # The same forward pass; keeping every point as an output changes XLA's fusions, hence the ulps.
    np.testing.assert_allclose(logits, plain, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got["logits"], logits)
    want = shapes(cfg, *x.shape)
    assert {n: got[n].shape for n in want} == want
    assert got["blocks.*.resid_post"].shape == (cfg.num_layers, *want["blocks.0.resid_post"])
    for l in range(cfg.num_layers):
        np.testing.assert_array_equal(got["blocks.*.resid_post"][l], got[f"blocks.{l}.resid_post"])
    if cfg.prenorm:  # layer l's output enters layer l + 1; the last one enters the final norm
        np.testing.assert_array_equal(got["blocks.0.resid_post"], got["blocks.1.resid_pre"])
    rows = np.asarray(got["blocks.1.attn.pattern"]).sum(-1)
    np.testing.assert_allclose(rows, 1.0, rtol=1e-5)  # every row's weights, the sink's included
    if cfg.attention_sink:
        np.testing.assert_array_equal(got["blocks.1.attn.sink_share"], got["blocks.1.attn.pattern"][..., -1])
    if cfg.num_registers:  # the registers are the first R keys
        np.testing.assert_allclose(got["blocks.1.attn.register_share"],
                                   got["blocks.1.attn.pattern"][..., :cfg.num_registers].sum(-1), rtol=1e-6)


def test_a_forward_pass_that_captures_nothing_is_the_program_of_a_model_without_points(monkeypatch):
    """The points are Flax sows into a collection that is not mutable outside a capture: lowered, the
    forward pass and the training loss's gradient are the same StableHLO as with `point` the identity."""
    cfg, params = model("sink_registers", scan_layers=True)
    x = tokens()

    def programs():
        forward = jax.jit(lambda p, x: Decoder(cfg).apply({"params": p}, x)[0])
        grad = jax.jit(jax.grad(lambda p, x: Decoder(cfg).apply({"params": p}, x)[0].mean()))
        return forward.lower(params, x).as_text(), grad.lower(params, x).as_text()

    with_points = programs()
    for module in (attention, decoder, norm):
        monkeypatch.setattr(module, "point", lambda module, name, value: value)
    assert programs() == with_points
    monkeypatch.undo()
    assert "intermediates" not in str(jax.eval_shape(lambda p: Decoder(cfg).apply({"params": p}, x), params))


def test_the_captured_attention_is_the_lecture_formula_and_the_heads_add_up():
    """Layer 0 by hand from its captured input (attn_norm.out) and its parameters: q, k, v = W x + b,
    scores = q k^T / sqrt(K) + causal mask, pattern = softmax, z = pattern v, head_out_h = W_o[:, h] z_h,
    and out = sum_h head_out_h + b_o = resid_mid - resid_pre (pre-norm, no dropout)."""
    cfg, params = model("mha")
    x = tokens()
    names = ["blocks.0.attn_norm.out", "blocks.0.attn.q", "blocks.0.attn.k", "blocks.0.attn.v", "blocks.0.attn.scores",
             "blocks.0.attn.pattern", "blocks.0.attn.z", "blocks.0.attn.head_out", "blocks.0.attn.out",
             "blocks.0.resid_pre", "blocks.0.resid_mid"]
    _, _, got = jit(lambda p, x: capture(p, cfg, x, names))(params, x)
    got = {n.removeprefix("blocks.0."): np.asarray(v, np.float64) for n, v in got.items()}
    w = jax.tree.map(lambda a: np.asarray(a, np.float64), params["layers_0"]["attn"])
    h_in = got["attn_norm.out"]  # [B, T, D]
    q, k, v = (np.einsum("btd,hkd->bthk", h_in, w[n]["kernel"]) + w[n]["bias"] for n in "qkv")
    causal = np.where(np.tril(np.ones((T, T), bool)), 0.0, -np.inf)
    scores = np.einsum("bthk,bshk->bhts", q, k) / np.sqrt(cfg.head_dim) + causal
    pattern = np.exp(scores - scores.max(-1, keepdims=True))
    pattern /= pattern.sum(-1, keepdims=True)
    z = np.einsum("bhts,bshk->bthk", pattern, v)
    head_out = np.einsum("bthk,dhk->bthd", z, w["o"]["kernel"])
    tol = dict(rtol=1e-5, atol=1e-5)
    for name, want in [("attn.q", q), ("attn.k", k), ("attn.v", v), ("attn.pattern", pattern), ("attn.z", z),
                       ("attn.head_out", head_out)]:
        np.testing.assert_allclose(got[name], want, **tol, err_msg=name)
    seen = np.isfinite(scores)
    np.testing.assert_allclose(got["attn.scores"][seen], scores[seen], **tol)
    assert (got["attn.scores"][~seen] < -1e8).all()  # the mask: a large negative logit where hidden
    np.testing.assert_allclose(got["attn.head_out"].sum(2) + w["o"]["bias"], got["attn.out"], **tol)
    np.testing.assert_allclose(got["resid_pre"] + got["attn.out"], got["resid_mid"], **tol)


@pytest.mark.parametrize("variant", ["gqa_qk_norm", "mla", "sink_registers"])
def test_a_decoding_step_captures_the_new_tokens_points_as_the_full_forward_has_them(variant):
    """Prefill T - 1 tokens into a cache of S slots, then decode token T - 1: its residual stream,
    queries and attention row equal the full forward's last row (the cache's columns, then its own)."""
    cfg, params = model(variant)
    x = tokens()
    s = 8
    names = ["blocks.1.resid_post", "blocks.1.attn.q", "blocks.1.attn.pattern", "logits"]
    _, _, full = jit(lambda p, x: capture(p, cfg, x, names))(params, x)
    step = jit(lambda p, x, positions, cache: capture(p, cfg, x, names, positions=positions, cache=cache))
    positions = jnp.broadcast_to(jnp.arange(T), x.shape)
    _, cache, prefill = step(params, x[:, :-1], positions[:, :-1], init_cache(cfg, x.shape[0], s))
    _, _, last = step(params, x[:, -1:], positions[:, -1:], cache)
    tol = dict(rtol=1e-5, atol=1e-5)
    for name in ("blocks.1.resid_post", "blocks.1.attn.q", "logits"):
        np.testing.assert_allclose(prefill[name], full[name][:, :-1], **tol, err_msg=name)
        np.testing.assert_allclose(last[name], full[name][:, -1:], **tol, err_msg=name)
    r, t = cfg.num_registers, T - 1  # the decoding step's keys: R + S cached slots (t filled), then itself
    row = np.asarray(last["blocks.1.attn.pattern"])[:, :, 0]  # [B, H, R + S + 1 (+ 1 sink)]
    cached, new = row[..., : r + t], row[..., r + s: r + s + 1]
    extra = row[..., r + s + 1:]  # the sink's column, if any
    np.testing.assert_allclose(np.concatenate([cached, new, extra], -1), full["blocks.1.attn.pattern"][:, :, -1], **tol)
    np.testing.assert_array_equal(row[..., r + t: r + s], 0.0)  # the slots not yet written


def test_a_bad_name_names_the_points_and_mla_decoding_has_no_per_head_keys():
    cfg, params = model("mla")
    x = tokens()
    with pytest.raises(ValueError, match=r"'blocks.0.attn.keys' is not a point of this model; it has embed, "
                                         r"final_norm.out, logits and, per layer .*attn.k, "):
        capture(params, cfg, x, ["blocks.0.attn.keys"])
    with pytest.raises(ValueError, match=r"'blocks.5.resid_pre': the model has layers 0..1; use blocks.\*.resid_pre"):
        capture(params, cfg, x, ["blocks.5.resid_pre"])
    cache = init_cache(cfg, 2, 8)
    with pytest.raises(ValueError, match="the absorbed form, which has no per-head keys and values"):  # raised tracing
        jax.eval_shape(lambda p, c: capture(p, cfg, x[:, :1], ["blocks.0.attn.k"], positions=jnp.zeros((2, 1), int),
                                            cache=c), params, cache)
