"""Tests of transformer/model/attention.py (and key_view.py): Attention (MHA / GQA / MQA), LatentAttention
(MLA, naive and absorbed) and output_projection (W_o and the head mask).

The module-level tests call the layers directly; the others go through a tiny Decoder
(tests/helpers/decoder.py), whose forward pass is how the layers' weights and head masks are used.
"""

from __future__ import annotations

import functools
import math

import chex
import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers.decoder import BASE, PREFILL, TOL, T, build, jit, make_cfg, max_diff, random_params, segment_masks
from transformer import ModelConfig, init_cache
from transformer.analysis.capture import capture
from transformer.model import edits, ops
from transformer.model.attention import Attention, LatentAttention
from transformer.model.kv_cache import KVCache, LatentCache
from transformer.model.decoder import Decoder
from transformer.model.positions import alibi_slopes


# ----------------------------------------------------------------------------- key_view

def test_key_view_without_a_cache_is_the_causal_mask_of_the_new_tokens():
    positions = jnp.array([[0, 1, 2], [5, 6, 7]])
    (mask,) = segment_masks(positions, None)
    chex.assert_shape(mask, (2, 1, 3, 3))
    np.testing.assert_array_equal(mask, ops.causal_mask(positions, positions))
    allowed = np.asarray(mask)[:, 0] == 0
    np.testing.assert_array_equal(allowed, np.broadcast_to(np.tril(np.ones((3, 3), bool)), (2, 3, 3)))


def test_key_view_with_a_cache_hides_slots_from_the_first_new_position_on():
    """Row 0 continues at position 3 (slots 0..2 filled), row 1 at 0 (nothing cached): a query sees
    the cached slots before its row's first new position, then this call's tokens up to its own."""
    positions = jnp.array([[3, 4], [0, 1]])
    cached, new = segment_masks(positions, 6)
    chex.assert_shape(cached, (2, 1, 2, 6))
    chex.assert_shape(new, (2, 1, 2, 2))
    seen = np.asarray(cached)[:, 0] == 0  # [B, T, S]
    np.testing.assert_array_equal(seen[0], [[1, 1, 1, 0, 0, 0]] * 2)  # slots 3.. are rewritten now
    assert not seen[1].any()
    np.testing.assert_array_equal(np.asarray(new)[:, 0] == 0, [[[1, 0], [1, 1]]] * 2)


# ----------------------------------------------------------------------------- Attention


def softmax(s):
    w = np.exp(s - s.max(-1, keepdims=True))
    return w / w.sum(-1, keepdims=True)


def with_pattern(module, params, x, positions, cached):
    """(out, new cache entries, the weights [B, H, T, S] as the point attn.pattern captures them)."""
    (out, new), state = module.apply({"params": params}, x, positions, cached, mutable=["intermediates"])
    return out, new, state["intermediates"]["pattern"][0]


@pytest.mark.parametrize("num_kv_heads", [4, 2, 1], ids=["mha", "gqa", "mqa"])
def test_attention_is_the_lecture_formula_with_parameters_stored_out_by_in(num_kv_heads):
    """softmax(q k^T / sqrt(K) + causal mask) v per head, query head h reading key/value head
    h // (H / G), then W_o; W_q [H, K, D], W_k and W_v [G, K, D], W_o [D, H, K], biases [out]."""
    cfg = ModelConfig(**BASE, num_kv_heads=num_kv_heads, position="learned")
    b, t, d, h, g, k = 2, 5, cfg.d_model, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    x = np.random.default_rng(0).standard_normal((b, t, d)).astype(np.float32)
    pos = jnp.broadcast_to(jnp.arange(t), (b, t))
    shapes = jax.eval_shape(Attention(cfg).init, jax.random.key(0), x, pos)["params"]
    assert {name: {p: s.shape for p, s in leaf.items()} for name, leaf in shapes.items()} == {
        "q": {"kernel": (h, k, d), "bias": (h, k)}, "k": {"kernel": (g, k, d), "bias": (g, k)},
        "v": {"kernel": (g, k, d), "bias": (g, k)}, "o": {"kernel": (d, h, k), "bias": (d,)},
    }
    rng = np.random.default_rng(1)
    params = jax.tree.map(lambda s: (rng.standard_normal(s.shape) * 0.25).astype(np.float32), shapes)

    out, new, w = jax.jit(lambda p: with_pattern(Attention(cfg), p, x, pos, None))(params)

    proj = lambda name: np.einsum("hkd,btd->bthk", params[name]["kernel"], x) + params[name]["bias"]  # noqa: E731
    q, kk, v = proj("q"), proj("k"), proj("v")  # [B, T, H or G, K]
    causal = np.where(np.tril(np.ones((t, t), bool)), 0.0, -np.inf)
    heads = np.zeros((b, t, h, k))
    weights = np.zeros((b, h, t, t))
    for hi in range(h):
        gi = hi // (h // g)
        weights[:, hi] = softmax(np.einsum("bqk,bsk->bqs", q[:, :, hi], kk[:, :, gi]) / np.sqrt(k) + causal)
        heads[:, :, hi] = np.einsum("bqs,bsk->bqk", weights[:, hi], v[:, :, gi])
    want = np.einsum("dhk,bthk->btd", params["o"]["kernel"], heads) + params["o"]["bias"]
    np.testing.assert_allclose(out, want, **TOL)
    np.testing.assert_allclose(w, weights, **TOL)
    assert isinstance(new, KVCache)  # this call's keys and values, [B, T, G, K], for the cache
    np.testing.assert_allclose(new.k, kk, **TOL)
    np.testing.assert_allclose(new.v, v, **TOL)


def test_gqa_with_repeated_kv_heads_equals_mha():
    """GQA (G=2 of H=4) equals MHA (num_kv_heads == num_heads) whose key/value heads are the GQA
    heads each repeated H/G times: query head h reads key/value head h // (H/G)."""
    gqa = build("gqa", "rope")
    mha = Decoder(make_cfg("mha", "rope", num_kv_heads=BASE["num_heads"]))
    assert mha.cfg == make_cfg("mha", "rope") and mha.cfg.kv_groups == 1
    mha_forward = jit(lambda p, t: mha.apply({"params": p}, t)[0])
    r = gqa.cfg.kv_groups

    def mha_params(expand):
        p = flax.core.unfreeze(jax.tree.map(np.asarray, gqa.params))
        attn = p["layers"]["attn"]
        for name in ("k", "v"):
            attn[name]["kernel"] = expand(attn[name]["kernel"], axis=1)  # [L, G, K, D] -> [L, H, K, D]
            if "bias" in attn[name]:
                attn[name]["bias"] = expand(attn[name]["bias"], axis=1)
        return jax.tree.map(jnp.asarray, p)

    repeated = mha_params(lambda a, axis: np.repeat(a, r, axis=axis))
    chex.assert_trees_all_equal_shapes_and_dtypes(repeated, random_params(mha))
    out_gqa = gqa.forward(gqa.params, gqa.tokens)
    np.testing.assert_allclose(mha_forward(repeated, gqa.tokens), out_gqa, **TOL)
    # The grouping order matters: tiling (head h -> kv head h % G) is a different function.
    tiled = mha_params(lambda a, axis: np.tile(a, [r if i == axis else 1 for i in range(a.ndim)]))
    assert max_diff(mha_forward(tiled, gqa.tokens), out_gqa) > 1e-3


# ----------------------------------------------------------------------------- LatentAttention


@pytest.mark.parametrize("attention,position", [("mla_q_rope", "rope"), ("mla", "learned")])
def test_absorbed_mla_equals_naive(attention, position):
    cfg = make_cfg(attention, position)
    naive, absorbed = LatentAttention(cfg, absorb=False), LatentAttention(cfg, absorb=True)
    b, t, s_cache, n_cached = 2, 9, 10, 6
    x = jnp.asarray(np.random.default_rng(0).standard_normal((b, t, cfg.d_model)), jnp.float32)
    pos = jnp.broadcast_to(jnp.arange(t), (b, t))
    shapes = jax.eval_shape(naive.init, jax.random.key(0), x, pos)["params"]
    rng = np.random.default_rng(1)
    params = jax.tree.map(lambda s: jnp.asarray(rng.standard_normal(s.shape) * 0.25 + 0.1, s.dtype), shapes)

    jitted = {id(mod): jit(functools.partial(with_pattern, mod)) for mod in (naive, absorbed)}

    def run(module, x, pos, cached):
        return jitted[id(module)](params, x, pos, cached)

    # Without a cache.
    ref = run(naive, x, pos, None)
    out, new, w = run(absorbed, x, pos, None)
    np.testing.assert_allclose(out, ref[0], **TOL)
    np.testing.assert_allclose(new.latent, ref[1].latent, **TOL)
    np.testing.assert_allclose(w, ref[2], **TOL)
    chex.assert_shape(ref[1].latent, (b, t, cfg.kv_latent_dim + (cfg.rope_head_dim or 0)))

    # With a cache holding the first 6 tokens' latents (a token's latent depends on it alone):
    # both equal the cache-free call on all 9 tokens.
    first = ref[1].latent[:, :n_cached]
    cache = LatentCache(latent=jnp.zeros((b, s_cache, first.shape[-1])).at[:, :n_cached].set(first))
    outs = [run(mod, x[:, n_cached:], pos[:, n_cached:], cache) for mod in (naive, absorbed)]
    for out, new, w in outs:
        np.testing.assert_allclose(out, ref[0][:, n_cached:], **TOL)
        np.testing.assert_allclose(new.latent, ref[1].latent[:, n_cached:], **TOL)
        chex.assert_shape(w, (b, cfg.num_heads, t - n_cached, s_cache + t - n_cached))
    np.testing.assert_allclose(outs[1][2], outs[0][2], **TOL)


# ----------------------------------------------------------------------------- through the decoder: weights and head masks


@pytest.mark.parametrize("attention,position", [("gqa", "rope"), ("mla_q_rope", "rope")])
def test_the_captured_weights_are_causal_distributions(attention, position):
    m = build(attention, position)
    cfg = m.cfg
    name = "blocks.*.attn.pattern"

    def run(p, tokens, positions, cache):
        logits, cache, got = capture(p, cfg, tokens, [name], positions, cache)
        return logits, cache, got[name]

    run = jit(run)
    logits, cache, w = run(m.params, m.tokens, None, None)
    assert cache is None
    chex.assert_shape(w, (cfg.num_layers, 2, cfg.num_heads, T, T))
    w = np.asarray(w)
    assert np.all(np.triu(w, k=1) == 0.0), "a query attends to a later key"
    np.testing.assert_allclose(w.sum(-1), 1.0, rtol=1e-5)
    assert np.all(np.diagonal(w, axis1=-2, axis2=-1) > 0)
    np.testing.assert_allclose(logits, m.forward(m.params, m.tokens), **TOL)

    # With a cache: [L, B, H, T, S + T]; slots at or after this call's first position get nothing.
    _, _, w = run(m.params, m.tokens[:, PREFILL : PREFILL + 1], np.full((2, 1), PREFILL), init_cache(cfg, 2, T))
    chex.assert_shape(w, (cfg.num_layers, 2, cfg.num_heads, 1, T + 1))
    w = np.asarray(w)
    assert np.all(w[..., PREFILL:T] == 0.0)
    np.testing.assert_allclose(w.sum(-1), 1.0, rtol=1e-5)


@pytest.mark.parametrize("attention,position", [("gqa", "rope"), ("mla_q_rope", "rope")])
def test_ablating_heads_equals_zeroing_output_projection_rows(attention, position):
    m = build(attention, position)
    L, H = m.cfg.num_layers, m.cfg.num_heads
    run = jit(lambda p, tokens, head_mask: edits.run(p, m.cfg, tokens, [edits.ablate_heads(m.cfg, head_mask)])[0])
    plain = np.asarray(m.forward(m.params, m.tokens))
    np.testing.assert_allclose(run(m.params, m.tokens, jnp.ones((L, H))), plain, rtol=0, atol=1e-6)

    ablate = [(0, 0), (1, 2)]
    head_mask = np.ones((L, H), np.float32)
    params = flax.core.unfreeze(jax.tree.map(np.array, m.params))
    kernel = params["layers"]["attn"]["o"]["kernel"]  # [L, D, H, Kv]
    chex.assert_shape(kernel, (L, m.cfg.d_model, H, None))
    for layer, head in ablate:
        head_mask[layer, head] = 0.0
        kernel[layer, :, head] = 0.0
    masked = np.asarray(run(m.params, m.tokens, head_mask))
    zeroed = np.asarray(m.forward(jax.tree.map(jnp.asarray, params), m.tokens))
    np.testing.assert_allclose(masked, zeroed, **TOL)
    assert max_diff(masked, plain) > 1e-3, "ablating two heads changed nothing"


# ----------------------------------------------------------------------------- ALiBi


def paper_slopes(n):
    """Press et al. 2022's reference code (github.com/ofirpress/attention_with_linear_biases)."""
    def power_of_2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]
    if math.log2(n).is_integer():
        return power_of_2(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_2(closest) + paper_slopes(2 * closest)[0::2][: n - closest]


@pytest.mark.parametrize("heads", [1, 2, 4, 6, 8, 12, 16])
def test_alibi_slopes_are_the_papers(heads):
    np.testing.assert_allclose(alibi_slopes(heads), paper_slopes(heads), rtol=1e-6)
    if heads == 8:
        np.testing.assert_allclose(alibi_slopes(8), [2.0 ** -(h + 1) for h in range(8)])  # 2^(-8(h+1)/H)


@pytest.mark.parametrize("attention", ["mha", "gqa", "mla"])
def test_alibi_scores_are_the_reference_formula(attention):
    """attn.scores == q_t . k_s / sqrt(d) - m_h (t - s) for s <= t (and hidden for s > t), m_h the
    paper's slopes, computed from the captured queries and keys (MLA: its naive form's per-head keys)."""
    m = build(attention, "alibi")
    cfg = m.cfg
    names = ["blocks.0.attn.q", "blocks.0.attn.k", "blocks.0.attn.scores"]
    _, _, got = jit(lambda p, x: capture(p, cfg, x, names))(m.params, m.tokens)
    q, k, scores = (np.asarray(got[n], np.float64) for n in names)  # [B, T, H, K], [B, T, G, K], [B, H, T, S]
    k = np.repeat(k, cfg.num_heads // k.shape[2], axis=2)  # each key head serves R query heads
    t = np.arange(T)
    distance = t[:, None] - t[None, :]  # [T, S]: t - s
    slopes = np.asarray(paper_slopes(cfg.num_heads))[:, None, None]  # [H, 1, 1]
    expected = np.einsum("bthk,bshk->bhts", q, k) / np.sqrt(q.shape[-1]) - slopes * distance
    seen = distance >= 0
    np.testing.assert_allclose(scores[..., seen], expected[..., seen], rtol=1e-4, atol=1e-4)
    assert np.all(scores[..., ~seen] < -1e8), "a later key is not hidden"
