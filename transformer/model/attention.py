"""Self-attention modules: multi-head / grouped-query attention and multi-head latent attention.

Both take one layer's cache (or None) and return this call's new entries beside their output (the
decoder writes them: kv_cache.write). What a query sees comes from one `key_view.KeyView`: segments
that `ops.dot_product_attention` softmaxes together, the lecture's softmax(q k^T / sqrt(d_h) + mask) v.
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer.model import ops
from transformer.model.config import ModelConfig
from transformer.model.key_view import KeyView, key_view
from transformer.model.kv_cache import PAD_POSITION, KVCache, LatentCache
from transformer.model.linear import Linear, dense, dense_init
from transformer.model.norm import rms_norm_module
from transformer.model.positions import scheme
from transformer.model.points import capturing, point, touched

Array = jax.Array


def attention_point(module: nn.Module, cfg: ModelConfig, view: KeyView, name: str, value: Array) -> Array:
    """`ops.dot_product_attention`'s `at`: the points attn.scores and attn.pattern [B, H, T, S_total
    (+1)] (edited if asked), and with the pattern the sink's and the registers' shares [B, H, T]."""
    value = point(module, name, value)
    if name == "pattern" and capturing(module):
        if cfg.attention_sink:
            point(module, "sink_share", value[..., -1])  # [B, H, T]: the sink's column
        if cfg.num_registers:
            is_register = (view.all_positions() < 0).astype(value.dtype)  # [B, S_total]
            point(module, "register_share", jnp.einsum("bhts,bs->bht", value[..., :is_register.shape[-1]], is_register))
    return value


def looking_at(module: nn.Module, cfg: ModelConfig, view: KeyView):
    """`attention_point` when this call captures or edits the scores or pattern (reference attention), else None."""
    return functools.partial(attention_point, module, cfg, view) if touched(module, "scores", "pattern") else None


def sink_logit(module: nn.Module, cfg: ModelConfig) -> Array | None:
    """The [H] learned sink logit per head (cfg.attention_sink), or None. Zero at init: one more key of
    logit 0 ("softmax plus one"), neutral next to near-zero scores."""
    if not cfg.attention_sink:
        return None
    return module.param("sink", nn.initializers.zeros, (cfg.num_heads,), jnp.float32)


class Attention(nn.Module):
    """Multi-head attention with learned W_q, W_k, W_v, W_o; G < H key/value heads = grouped-query.

    x [B, T, D] -> out [B, T, D] and this call's cache entries KVCache(k, v [B, T, G, K]); window and
    order (as Block's) go to the key view. cross=True: cross-attention, `cross_attention` below."""

    cfg: ModelConfig
    cross: bool = False

    @nn.compact
    def __call__(self, x: Array, positions: Array, cached: KVCache | None = None,
                 window: int | Array | None = None, order: Array | None = None,
                 memory: Array | None = None) -> tuple[Array, KVCache | tuple[Array, Array] | None]:
        cfg = self.cfg
        if self.cross:
            return self.cross_attention(x, cached, memory)
        q, k, v = self._project(x, x)
        rotate, theta = scheme(cfg).rotate, layer_rope_theta(cfg, window)
        if rotate is not None:
            q, k = rotate(q, positions, cfg, theta), rotate(k, positions, cfg, theta)
        q, k, v = point(self, "queries", q), point(self, "keys", k), point(self, "values", v)  # attn.q, .k, .v

        view = key_view(cfg, positions, cached, window, order, join=not touched(self, "scores", "pattern"))
        ks, vs, heads_first = [k], [v], [False]
        if cached is not None:  # one layer's cache first, [B, G, S, K] as it lies
            ks = view.segments(cfg, cached.k.astype(k.dtype), k, slot_axis=2, theta=theta)
            vs, heads_first = view.segments(cfg, cached.v.astype(v.dtype), v, slot_axis=2, rotary=None), [True, False]
        return self._attend(q, ks, vs, view, heads_first, cached is not None), KVCache(k=k, v=v)

    @nn.nowrap  # a helper of __call__, not a call of its own: no name scope in the profile
    def cross_attention(self, x: Array, cached: KVCache | None, memory: Array | None
                        ) -> tuple[Array, tuple[Array, Array] | None]:
        """Queries from x [B, T, D], keys and values from the encoder's tokens memory [B, S, D_e], every
        one visible, without positions -> (out [B, T, D], the keys and values [B, G, S, K] to cache, or
        None when memory is None: a decoding step reads those its prefill stored in `cached`)."""
        q, k, v = self._project(x, memory)  # k, v [B, S, G, K], or None
        q = point(self, "queries", q)
        if memory is None:
            k, v, heads_first = cached.cross_k.astype(q.dtype), cached.cross_v.astype(q.dtype), True
        else:
            k, v, heads_first = point(self, "keys", k), point(self, "values", v), False
        seen = jnp.zeros((x.shape[0], k.shape[2 if heads_first else 1]), jnp.int32)  # [B, S]: no positions
        view = KeyView([seen], [None])  # no mask: every encoder token is seen by every query
        out = self._attend(q, [k], [v], view, [heads_first], cached is not None)
        return out, None if memory is None else (k.swapaxes(1, 2), v.swapaxes(1, 2))

    @nn.nowrap  # a helper of __call__, not a call of its own: no name scope in the profile
    def _project(self, x: Array, source: Array | None) -> tuple[Array, Array | None, Array | None]:
        """q = W_q x [B, T, H, K]; k = W_k s, v = W_v s [B, S, G, K] of source [B, S, D_s] (None: none);
        with qk_norm each head's q and k to RMS 1 over K (gains [K] shared by the heads)."""
        cfg = self.cfg
        q = dense(cfg, (cfg.num_heads, cfg.head_dim), "q")(x)  # [B, T, H, K]: W_q [H, K, D]
        q = nn.with_logical_constraint(q, ("batch", "length", "heads", "head_dim"))  # logical axes (sharding.py)
        q = rms_norm_module(cfg, "q_norm")(q) if cfg.qk_norm else q
        if source is None:
            return q, None, None
        k = dense(cfg, (cfg.num_kv_heads, cfg.head_dim), "k")(source)  # [B, S, G, K]
        v = dense(cfg, (cfg.num_kv_heads, cfg.head_dim), "v")(source)  # [B, S, G, K]
        k, v = (nn.with_logical_constraint(a, ("batch", "length", "kv_heads", "head_dim")) for a in (k, v))
        return q, rms_norm_module(cfg, "k_norm")(k) if cfg.qk_norm else k, v

    @nn.nowrap  # a helper of __call__, not a call of its own: no name scope in the profile
    def _attend(self, q: Array, ks: list[Array], vs: list[Array], view: KeyView, heads_first: list[bool],
                cached: bool) -> Array:
        """softmax(q k^T / sqrt(d) + bias) v over the view's segments, then W_o -> [B, T, D]."""
        cfg = self.cfg
        at = looking_at(self, cfg, view)  # the weights' points need the reference path, as a cache does
        implementation = "reference" if cached or at else cfg.attention_impl
        out, _ = ops.dot_product_attention(q, ks, vs, view.bias, at=at, implementation=implementation,
                                           heads_first=heads_first, sink=sink_logit(self, cfg),
                                           scale=cfg.attn_scale_dim ** -0.5 if cfg.attn_scale_dim else None,
                                           cap=cfg.attn_softcap or None)
        return output_projection(self, cfg, out)


def layer_rope_theta(cfg: ModelConfig, window: int | Array | None) -> float | Array:
    """A layer's RoPE base: cfg.rope_local_theta in a windowed layer when set (Gemma 3), else rope_theta.
    window: W, None (global) or, in a scanned stack of both, the traced window (PAD_POSITION: global)."""
    if not cfg.rope_local_theta or window is None:
        return cfg.rope_theta
    return jnp.where(jnp.asarray(window) < PAD_POSITION, cfg.rope_local_theta, cfg.rope_theta)


def output_projection(module: nn.Module, cfg: ModelConfig, heads: Array) -> Array:
    """W_o [D, H, Kv]: heads [B, T, H, Kv] -> [B, T, D], a projection `o` of `module`, with the points
    attn.z (edit it to ablate or patch heads), attn.head_out [B, T, H, D] (in a capture only), attn.out."""
    heads = point(module, "z", heads)
    w_o = Linear(cfg.d_model, in_axes=2, use_bias=cfg.use_bias, dtype=cfg.dtype,
                 kernel_init=dense_init(cfg, output=True), name="o")
    out = w_o(heads)
    if capturing(module):
        kernel = w_o.variables["params"]["kernel"].astype(cfg.dtype)  # [D, H, Kv]
        point(module, "head_out", jnp.einsum("bthk,dhk->bthd", heads.astype(cfg.dtype), kernel))
    return point(module, "output", out)


class LatentAttention(nn.Module):
    """Multi-head latent attention (DeepSeek-V2): keys and values come from a cached latent.

    Per token c = RMSNorm(W_DKV x) [C]; head h's key W_UK,h c and value W_UV,h c. With RoPE a rotary
    part of width Kr is added to each query and to one key shared by all heads, so position never
    passes through W_UK. The cache holds [c, k_rope]. absorb (`latent_attention`): None (default)
    when decoding from a cache, naive otherwise; the same function either way.

    x [B, T, D] -> out [B, T, D] and LatentCache(latent [B, T, C + Kr]); window, order: as Attention's."""

    cfg: ModelConfig
    absorb: bool | None = None

    @nn.compact
    def __call__(self, x: Array, positions: Array, cached: LatentCache | None = None,
                 window: int | Array | None = None, order: Array | None = None) -> tuple[Array, LatentCache]:
        cfg = self.cfg
        h, k_nope, k_v, c_kv = cfg.num_heads, cfg.head_dim, cfg.v_head_dim, cfg.kv_latent_dim
        k_r = cfg.rope_head_dim or 0  # Kr, the rotary width (0 without RoPE)
        q_nope, q_rope = self._queries(x, positions)  # [B, T, H, K], [B, T, H, Kr]
        latent = point(self, "latent", self._latent(x, positions))  # [B, T, C + Kr]: [c, k_rope]
        if touched(self, "queries"):  # attn.q [B, T, H, K + Kr], edited if asked
            q = point(self, "queries", jnp.concatenate([q_nope, q_rope], axis=-1))
            q_nope, q_rope = q[..., :k_nope], q[..., k_nope:]

        # W_UK [H, K, C] and W_UV [H, Kv, C], stored [out, in] as every projection (see linear.py).
        w_uk = self.param("k_up", dense_init(cfg), (h, k_nope, c_kv), jnp.float32).astype(cfg.dtype)
        w_uv = self.param("v_up", dense_init(cfg), (h, k_v, c_kv), jnp.float32).astype(cfg.dtype)

        view = key_view(cfg, positions, cached, window, order, join=not touched(self, "scores", "pattern"))
        segments = [latent]
        if cached is not None:  # a rolling layer's kept slots turned in their rotary part (Kr features after C)
            segments = view.segments(cfg, cached.latent.astype(latent.dtype), latent, 1, slice(c_kv, None))
        absorb = cached is not None if self.absorb is None else self.absorb
        at = looking_at(self, cfg, view)
        if not absorb and capturing(self):  # this call's per-head keys and values, as the naive form computes them
            for name, value in zip(("keys", "values"), up_project(latent, w_uk, w_uv)):
                point(self, name, value)
        implementation = "reference" if cached is not None or at else cfg.attention_impl
        out = latent_attention(q_nope, q_rope, segments, w_uk, w_uv, view.bias, absorb=absorb, at=at,
                               sink=sink_logit(self, cfg), implementation=implementation,
                               scale=(k_nope + k_r) ** -0.5)  # the width of the original query/key dot product
        return output_projection(self, cfg, out), LatentCache(latent=latent)  # [B, T, D]

    @nn.nowrap  # a helper of __call__, not a call of its own: no name scope in the profile
    def _queries(self, x: Array, positions: Array) -> tuple[Array, Array]:
        """x [B, T, D] -> (q_nope [B, T, H, K], q_rope [B, T, H, Kr] rotated): q = W_q x, or with a query
        latent of width Cq = cfg.q_latent_dim, q = W_UQ RMSNorm(W_DQ x)."""
        cfg = self.cfg
        h, k_nope, k_r = cfg.num_heads, cfg.head_dim, cfg.rope_head_dim or 0
        if cfg.q_latent_dim:
            q_latent = rms_norm_module(cfg, "q_norm")(dense(cfg, cfg.q_latent_dim, "q_down")(x))  # [B, T, Cq]
            q = dense(cfg, (h, k_nope + k_r), "q_up", use_bias=False)(q_latent)
        else:
            q = dense(cfg, (h, k_nope + k_r), "q")(x)  # [B, T, H, K + Kr]
        q = nn.with_logical_constraint(q, ("batch", "length", "heads", "head_dim"))  # logical axes (sharding.py)
        q_nope, q_rope = q[..., :k_nope], q[..., k_nope:]
        if k_r:
            q_rope = ops.rope(q_rope, positions, cfg.rope_theta)
        return q_nope, q_rope

    @nn.nowrap  # a helper of __call__, not a call of its own: no name scope in the profile
    def _latent(self, x: Array, positions: Array) -> Array:
        """x [B, T, D] -> the cached latent [B, T, C + Kr]: c = RMSNorm(W_DKV x) [B, T, C], then the
        rotary key k_rope [B, T, Kr] shared by all heads, rotated by `positions` (none without RoPE)."""
        cfg = self.cfg
        c_kv, k_r = cfg.kv_latent_dim, cfg.rope_head_dim or 0
        kv = dense(cfg, c_kv + k_r, "kv_down")(x)  # [B, T, C + Kr]
        latent = rms_norm_module(cfg, "kv_norm")(kv[..., :c_kv])
        if k_r:
            k_rope = ops.rope(kv[:, :, None, c_kv:], positions, cfg.rope_theta)[:, :, 0]
            latent = jnp.concatenate([latent, k_rope], axis=-1)  # [B, T, C + Kr]
        return latent


def latent_attention(q_nope: Array, q_rope: Array, segments: list[Array], w_uk: Array, w_uv: Array, masks: list[Array],
                     *, absorb: bool, scale: float, sink: Array | None, implementation: str,
                     at: ops.AttentionPoint | None = None) -> Array:
    """MLA's attention: q_nope [B, T, H, K], q_rope [B, T, H, Kr] (rotated), segments: latents [B, S_i,
    C + Kr] (cached slots, then this call's), W_UK [H, K, C], W_UV [H, Kv, C], masks: one bias per
    segment (`key_view`) -> out [B, T, H, Kv].

    Naive: multi-head attention over every token's up-projected key [W_UK,h c, k_rope] and value
    W_UV,h c. Absorbed: scored against the latent itself, q_h^T W_UK,h c = (W_UK,h^T q_h)^T c, with
    W_UV applied after the weighted sum, so decoding reads C + Kr numbers per cached token and layer."""
    if not absorb:
        ks, vs = zip(*(up_project(s, w_uk, w_uv) for s in segments))  # every token's key and value, every head
        q = jnp.concatenate([q_nope, q_rope], axis=-1)
        return ops.dot_product_attention(q, ks, vs, masks, scale=scale, sink=sink, implementation=implementation,
                                         at=at)[0]
    c_kv = w_uk.shape[-1]
    # One shared key head (G = 1) of width C + Kr against the query [W_UK^T q_nope, q_rope]; the latent
    # itself is the value.
    q_abs = jnp.concatenate([jnp.einsum("bthk,hkc->bthc", q_nope, w_uk), q_rope], axis=-1)
    ks = [s[:, :, None, :] for s in segments]  # [B, S, 1, C + Kr]
    vs = [s[:, :, None, :c_kv] for s in segments]  # [B, S, 1, C]
    out_c, _ = ops.dot_product_attention(q_abs, ks, vs, masks, scale=scale, sink=sink, at=at)
    return jnp.einsum("bthc,hkc->bthk", out_c, w_uv)  # [B, T, H, Kv]


def up_project(latent: Array, w_uk: Array, w_uv: Array) -> tuple[Array, Array]:
    """latent [B, S, C + Kr] -> every head's key [W_UK,h c, k_rope] [B, S, H, K + Kr] and value
    W_UV,h c [B, S, H, Kv] (w_uk: W_UK [H, K, C]; w_uv: W_UV [H, Kv, C])."""
    h, c_kv = w_uk.shape[0], w_uk.shape[-1]
    c, k_rope = latent[..., :c_kv], latent[:, :, None, c_kv:]
    k_n = jnp.einsum("bsc,hkc->bshk", c, w_uk)
    k_rot = jnp.broadcast_to(k_rope, (*latent.shape[:2], h, k_rope.shape[-1]))
    return jnp.concatenate([k_n, k_rot], axis=-1), jnp.einsum("bsc,hkc->bshk", c, w_uv)

