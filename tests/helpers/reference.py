"""An independent float32 reference of the decoder, for tests of reduced precision and fast paths.

Written from the lecture's formulas, not from transformer/model/*: it imports nothing from the
package but reads a Decoder's parameter tree (scanned `layers` with a leading L axis, or unscanned
`layers_0` ...). Per token and layer, with every weight stored [out, in] (y = W x + b):

    x = E[token] (+ P[position] learned, or the sine/cosine table)
    pre-norm:   x = x + attn(norm(x));   x = x + mlp(norm(x));   logits = norm(x) E^T (or W_head)
    post-norm:  x = norm(x + attn(x));   x = norm(x + mlp(x));   logits = x E^T (or W_head)
    attn(h) = W_o [softmax(q_h k_h^T / sqrt(d_h) + causal) v_h for each head h]

Multi-head, grouped-query and multi-query attention repeat each key/value head H / G times (query
head h reads key/value head h // (H / G)); RoPE rotates each pair (i, i + K/2) of q and k as the
complex number x_i + i x_{i+K/2}, by p theta^(-2i/K). MLA (DeepSeek-V2) up-projects every key and
value from the latent c = RMSNorm(W_DKV x) and appends the rotary key shared by the heads, with
1 / sqrt(K + Kr) as its scale. Sinks, registers, qk_norm and logit soft-capping are not covered:
`logits` raises for them rather than compute something else.

Every matrix product asks for full float32 precision (Precision.HIGHEST: no TF32 or bfloat16
passes on an accelerator), so the reference's own error is float32 rounding, ~1e-7 of the logits'
size. Plain jnp, so that it jits and jax.grad gives gradients to compare with too.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import erf

HIGHEST = jax.lax.Precision.HIGHEST
UNSUPPORTED = ("attention_sink", "num_registers", "qk_norm", "logit_softcap")

# Tolerances on `relative_error` (the largest logit error as a share of the largest |logit|) at
# parameters drawn at std 0.25 (tests/helpers/decoder.py: random_params) on the tests' tiny configs
# (D = 32, H = 4, L = 2, T = 12), measured on CPU for tests/test_attention_impl.py's variants:
#   float32, either attention_impl: 4e-7 .. 9e-7                      -> FLOAT32_TOL, ~10x
#   bfloat16 compute (8 significant bits): 0.013 (MHA, MQA) .. 0.028 (GQA, MLA with SwiGLU, RoPE)
#                                                                     -> BFLOAT16_TOL, ~2x the largest
#   broken: a causal mask that allows everything 0.75 .. 1.5, a scale of 1/d_h instead of
#   1/sqrt(d_h) 0.24 .. 1.2, no scale 0.27 .. 1.06: over 4.8x BFLOAT16_TOL, 24000x FLOAT32_TOL
#   (test_attention_impl.py::test_a_broken_mask_or_scale_fails_every_comparison holds them past 3x).
FLOAT32_TOL = 1e-5
BFLOAT16_TOL = 0.05


def relative_error(got, want) -> float:
    """max |got - want| / max |want|: the error as a share of the largest logit."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


def assert_close(got, want, tol: float, what: str = "logits") -> float:
    """Raises AssertionError unless relative_error(got, want) <= tol (and got is finite); returns it."""
    assert np.isfinite(np.asarray(got)).all(), f"{what}: not finite"
    err = relative_error(got, want)
    assert err <= tol, f"{what}: off the float32 reference by {err:.3g} of the largest |value| (tol {tol:.3g})"
    return err


# ----------------------------------------------------------------------------- the forward pass


def logits(cfg, params, tokens, positions=None) -> jax.Array:
    """tokens [B, T] (positions [B, T], default 0..T-1) -> logits [B, T, V] float32.

    cfg: a ModelConfig (read for its choices only; dtype and attention_impl are ignored)."""
    for name in UNSUPPORTED:
        if getattr(cfg, name):
            raise NotImplementedError(f"the reference decoder does not cover {name}={getattr(cfg, name)!r}")
    tokens = jnp.asarray(tokens)
    positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape) if positions is None else positions
    embedding = params["embed"]["embedding"]  # E [V, D]
    x = embedding[tokens]  # [B, T, D]
    if cfg.position == "learned":
        x = x + params["pos_embed"][positions]
    elif cfg.position == "sinusoidal":
        x = x + sinusoidal(positions, cfg.d_model)
    mask = positions[:, None, :, None] >= positions[:, None, None, :]  # [B, 1, T, S]: key s <= query t
    for i in range(cfg.num_layers):
        x = block(cfg, layer_params(params, i), x, positions, mask)
    if cfg.prenorm:
        x = norm(cfg.norm, params["final_norm"], x, cfg.norm_eps)
    if cfg.tie_embeddings:
        return jnp.einsum("btd,vd->btv", x, embedding, precision=HIGHEST)  # [B, T, V]
    return linear(params["head"], x)


def cross_entropy(logits, targets) -> jax.Array:
    """Mean next-token cross-entropy over every position: -log softmax(logits)[target]."""
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.take_along_axis(logp, jnp.asarray(targets)[..., None], axis=-1).mean()


def layer_params(params, i: int):
    """Layer i's parameters, from a scanned stack (leading L axis) or an unrolled one."""
    if "layers" in params:
        return jax.tree.map(lambda a: a[i], params["layers"])
    return params[f"layers_{i}"]


def block(cfg, p, x, positions, mask):
    attend = latent_attention if cfg.attention == "mla" else attention
    n = lambda name, y: norm(cfg.norm, p[name], y, cfg.norm_eps)  # noqa: E731
    if cfg.prenorm:
        x = x + attend(cfg, p["attn"], n("attn_norm", x), positions, mask)
        return x + mlp(cfg, p["mlp"], n("mlp_norm", x)) if cfg.mlp_dim else x
    x = n("attn_norm", x + attend(cfg, p["attn"], x, positions, mask))
    return n("mlp_norm", x + mlp(cfg, p["mlp"], x)) if cfg.mlp_dim else x


def linear(p, x, n_in: int = 1):
    """y = W x + b over x's last n_in axes; W [*out, *in] (the lecture's layout), b [*out]."""
    w = p["kernel"]
    axes = (list(range(x.ndim - n_in, x.ndim)), list(range(w.ndim - n_in, w.ndim)))
    y = jnp.tensordot(x, w, axes=axes, precision=HIGHEST)
    return y + p["bias"] if "bias" in p else y


def norm(kind: str, p, x, eps: float):
    """Layer norm (x - mean) / sqrt(var + eps) or RMSNorm x / sqrt(mean(x^2) + eps), then gain, bias."""
    if kind == "layernorm":
        x = x - x.mean(-1, keepdims=True)
    y = x / jnp.sqrt(jnp.mean(x * x, -1, keepdims=True) + eps)
    if "scale" in p:
        y = y * p["scale"]
    return y + p["bias"] if "bias" in p else y


ACTIVATIONS = {
    "gelu": lambda x: 0.5 * x * (1 + erf(x / math.sqrt(2))),
    "gelu_tanh": lambda x: 0.5 * x * (1 + jnp.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))),
    "relu": lambda x: jnp.maximum(x, 0),
    "relu2": lambda x: jnp.maximum(x, 0) ** 2,
}


def mlp(cfg, p, x):
    if cfg.activation == "swiglu":  # W_down (silu(W_gate x) * W_up x)
        gate = linear(p["gate"], x)
        return linear(p["fc_out"], gate / (1 + jnp.exp(-gate)) * linear(p["up"], x))
    return linear(p["fc_out"], ACTIVATIONS[cfg.activation](linear(p["fc_in"], x)))


def sinusoidal(positions, d: int):
    """[B, T, d]: feature 2i is sin(p / 10000^(2i/d)), feature 2i+1 cos(p / 10000^(2i/d))."""
    angle = positions[..., None] / 10000.0 ** (jnp.arange(d // 2) * 2 / d)  # [B, T, d/2]
    return jnp.stack([jnp.sin(angle), jnp.cos(angle)], -1).reshape(*positions.shape, d)


def rope(x, positions, theta: float):
    """x [B, T, H, K]: the pair (x_i, x_{i+K/2}) as x_i + i x_{i+K/2}, times exp(i p theta^(-2i/K))."""
    k = x.shape[-1]
    angle = positions[..., None, None] * theta ** (-jnp.arange(k // 2) * 2 / k)  # [B, T, 1, K/2]
    z = (x[..., : k // 2] + 1j * x[..., k // 2 :]) * jnp.exp(1j * angle)
    return jnp.concatenate([z.real, z.imag], -1)


def softmax_attention(q, k, v, mask, scale: float):
    """q [B, T, H, K], k [B, S, H, K], v [B, S, H, Kv], mask bool [B, 1, T, S] -> [B, T, H, Kv]."""
    scores = jnp.einsum("bthk,bshk->bhts", q, k, precision=HIGHEST) * scale
    weights = jax.nn.softmax(jnp.where(mask, scores, -jnp.inf), axis=-1)
    return jnp.einsum("bhts,bshk->bthk", weights, v, precision=HIGHEST)


def attention(cfg, p, x, positions, mask):
    """MHA / GQA / MQA: key/value head g serves query heads g R .. g R + R - 1 (R = H / G)."""
    q, k, v = (linear(p[name], x) for name in ("q", "k", "v"))  # [B, T, H or G, K]
    if cfg.position == "rope":
        q, k = rope(q, positions, cfg.rope_theta), rope(k, positions, cfg.rope_theta)
    r = cfg.num_heads // cfg.num_kv_heads
    k, v = jnp.repeat(k, r, axis=2), jnp.repeat(v, r, axis=2)  # [B, T, H, K]
    heads = softmax_attention(q, k, v, mask, 1 / math.sqrt(cfg.head_dim))
    return linear(p["o"], heads, n_in=2)


def latent_attention(cfg, p, x, positions, mask):
    """MLA, naive: k_h = [W_UK,h c, k_rope], v_h = W_UV,h c from c = RMSNorm(W_DKV x)."""
    c_kv, k_nope, k_r = cfg.kv_latent_dim, cfg.head_dim, cfg.rope_head_dim or 0
    rms = lambda name, y: norm("rmsnorm", p[name], y, cfg.norm_eps)  # noqa: E731
    if cfg.q_latent_dim:
        q = linear(p["q_up"], rms("q_norm", linear(p["q_down"], x)))  # [B, T, H, K + Kr]
    else:
        q = linear(p["q"], x)
    kv = linear(p["kv_down"], x)  # [B, T, C + Kr]
    c = rms("kv_norm", kv[..., :c_kv])  # [B, T, C]
    k = jnp.einsum("hkc,bsc->bshk", p["k_up"], c, precision=HIGHEST)  # [B, S, H, K]
    v = jnp.einsum("hkc,bsc->bshk", p["v_up"], c, precision=HIGHEST)  # [B, S, H, Kv]
    if k_r:
        q = jnp.concatenate([q[..., :k_nope], rope(q[..., k_nope:], positions, cfg.rope_theta)], -1)
        k_rope = rope(kv[:, :, None, c_kv:], positions, cfg.rope_theta)  # [B, S, 1, Kr]: one for all heads
        k = jnp.concatenate([k, jnp.broadcast_to(k_rope, (*k.shape[:3], k_r))], -1)
    heads = softmax_attention(q, k, v, mask, 1 / math.sqrt(k_nope + k_r))
    return linear(p["o"], heads, n_in=2)
