"""Pure functions of the transformer: masks, attention, norms and positions, logit soft-capping.
Arrays in, arrays out, so each can be called, tested and plotted on its own; the modules call these.

Axes: B batch, T query length, S key length, D model width, H query heads, G key/value heads, K head
width (d_h), R = H // G query heads per key/value head.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array
# f(name, value) -> value: how a caller sees and edits the attention's "scores" and "pattern".
AttentionPoint = Callable[[str, Array], Array]

# A large *finite* negative logit: -inf would turn a fully masked row into 0/0 = NaN, a finite value
# gives it a uniform (ignorable) distribution; `mask_value` sizes it for a narrower dtype.
MASK_VALUE = -1e9


def mask_value(dtype: jnp.dtype = jnp.float32) -> float:
    """A finite, very negative logit representable in `dtype` (half of its lowest value)."""
    lowest = float(jnp.finfo(dtype).min)  # compare as Python floats: -1e9 overflows float16
    return lowest / 2 if lowest > MASK_VALUE else MASK_VALUE


def causal_mask(q_positions: Array, k_positions: Array, k_valid: Array | None = None,
                dtype: jnp.dtype = jnp.float32, window: int | Array | None = None, sinks: int | None = None) -> Array:
    """Additive causal mask from positions q [B, T] and k [B, S] -> [B, 1, T, S]: 0 where key s is
    visible to query t, pos_s <= pos_t, else a large finite negative value. With a window W (an int, or
    a traced scalar in a scanned stack) also pos_t - pos_s < W (Mistral's band) or pos_s < sinks (kept
    visible: StreamingLLM's sinks, the registers at negative positions); k_valid [B, S]: False for
    slots that hold nothing yet."""
    allowed = k_positions[:, None, :] <= q_positions[:, :, None]  # [B, T, S]: the causal order
    if window is not None:
        band = q_positions[:, :, None] - k_positions[:, None, :] < window  # [B, T, S]
        allowed = allowed & (band if sinks is None else (k_positions[:, None, :] < sinks) | band)
    if k_valid is not None:
        allowed = allowed & k_valid[:, None, :]
    return jnp.where(allowed, 0.0, mask_value(dtype)).astype(dtype)[:, None, :, :]


# ----------------------------------------------------------------------------- attention


def attention(q: Array, k: Array, v: Array, mask: Array | None = None) -> tuple[Array, Array]:
    """The lecture's attention, softmax(q k^T / sqrt(d_h) + mask) v: q [B, T, H, K], k and v
    [B, S, H, K], mask [B, 1 or H, T, S] or None -> out [B, T, H, K], weights [B, H, T, S]. The model
    runs `dot_product_attention`, tested equal to it."""
    d_h = q.shape[-1]  # K, the head width
    scores = jnp.einsum("bthk,bshk->bhts", q, k) / d_h**0.5  # [B, H, T, S]: q_t . k_s / sqrt(d_h)
    if mask is not None:  # mask [B, 1 or H, T, S]
        scores = scores + mask  # [B, H, T, S]: a large negative logit where s is hidden from t
    weights = jax.nn.softmax(scores, axis=-1)  # [B, H, T, S]: each row sums to 1 over the S keys
    out = jnp.einsum("bhts,bshk->bthk", weights, v)  # [B, T, H, K]: sum over s of w_ts v_s
    return out, weights  # [B, T, H, K], [B, H, T, S]


def dot_product_attention(
    q: Array, k: Array | Sequence[Array], v: Array | Sequence[Array], mask: Array | Sequence[Array] | None = None,
    *, scale: float | None = None, implementation: str = "reference", heads_first: Sequence[bool] | None = None,
    sink: Array | None = None, at: AttentionPoint | None = None, cap: float | None = None
) -> tuple[Array, Array | None]:
    """`attention` as the model runs it, for G <= H key/value heads in one or more segments along S:

        dot_product_attention(q, [k_1, k_2], [v_1, v_2], [m_1, m_2])
        == attention(q, repeat(concat(k_1, k_2)), repeat(concat(v_1, v_2)), concat(m_1, m_2))

    (repeat: each key/value head R = H // G times) with neither copy made: the query heads are grouped,
    and each segment (the cache, then this call's keys) is scored on its own before one softmax over all.
    Multi-head attention scores a heads-first segment [B, G, S, K] (the cache's layout) as it lies:
    XLA:CPU would copy a transposed cache every step. Scores and softmax in float32 (bfloat16 loses too much).

    q [B, T, H, K]; k [B, S, G, K], v [B, S, G, Kv] (or lists of segments, one mask each); mask additive
    [B, 1 or H, T, S] or None; scale: default 1 / sqrt(K); implementation: 'reference' (the einsums), or
    'xla' / 'cudnn' through `jax.nn.dot_product_attention` (one segment, no sink, no weights); sink: [H]
    logits, one more column per row that meets no value; cap: c > 0 soft-caps the scaled scores
    before the mask, c tanh(s / c) (Gemma 2; the reference path only); at: f(name, value) -> value, given "scores"
    (scaled, plus mask) then "pattern" [B, H, T, S_total (+1)] float32, its result used.
    -> out [B, T, H, Kv] in q's dtype, weights [B, H, T, S_total (+1, last)] float32 (None fused)."""
    # Only a list or tuple is a sequence of segments: a NumPy array must not be split along its batch axis.
    ks, vs = (list(a) if isinstance(a, (list, tuple)) else [a] for a in (k, v))
    masks = list(mask) if isinstance(mask, (list, tuple)) else [mask] * len(ks)
    firsts = list(heads_first) if heads_first is not None else [False] * len(ks)
    if not len(ks) == len(vs) == len(masks) == len(firsts):
        raise ValueError(f"got {len(ks)} key, {len(vs)} value, {len(masks)} mask, {len(firsts)} heads_first segments")
    b, t, h, d_h = q.shape  # [B, T, H, K]
    g = ks[0].shape[1 if firsts[0] else 2]  # G key/value heads
    if h % g:
        raise ValueError(f"{h} query heads cannot be grouped over {g} key/value heads")
    scale = d_h**-0.5 if scale is None else scale
    if implementation != "reference" or g != h:  # only multi-head scores heads-first segments as they lie
        ks = [k_i.swapaxes(1, 2) if f else k_i for k_i, f in zip(ks, firsts)]  # [B, S_i, G, K]
        vs = [v_i.swapaxes(1, 2) if f else v_i for v_i, f in zip(vs, firsts)]  # [B, S_i, G, Kv]
        firsts = [False] * len(ks)
    if implementation != "reference":
        if at is not None or len(ks) != 1 or sink is not None or cap:
            raise ValueError(f"implementation={implementation!r} takes one key segment, has no sink logit nor "
                             "soft-cap and computes no weights; use implementation='reference' to look at or edit "
                             "attention maps, to decode from a cache or for attention_sink=True or a cap")
        return _fused_attention(q, ks[0], vs[0], masks[0], scale, implementation), None

    # Shapes for G < H; multi-head attention (R = 1) has no G, R axes but H: q [B, T, H, K] and so on.
    q, masks = _group_query_heads(q, masks, g)  # [B, T, G, R, K]; [B, 1 or G, 1 or R, T, S_i]
    scores = [_segment_scores(q, k_i, m, scale, f, cap) for k_i, m, f in zip(ks, masks, firsts)]  # [B, G, R, T, S_i]
    if sink is not None:  # [H] -> [G, R, 1, 1] grouped or [H, 1, 1]: one logit per row of each head
        sink = (sink if g == h else sink.reshape(g, h // g))[..., None, None].astype(jnp.float32)
    if at is not None:  # the points see [B, H, T, S]: query head h = g R + r, as grouped
        at = functools.partial(_per_head, at, (b, h, t))
    # [B, G, R, T, S_total (+1 with a sink)], and per segment [B, G, R, T, S_i]
    weights, pieces = _joint_softmax(scores, sink, at)
    outs = [_weigh_values(w_i, v_i, f) for w_i, v_i, f in zip(pieces, vs, firsts)]  # [B, T, G, R, Kv]
    out = sum(outs).reshape(b, t, h, vs[0].shape[-1]).astype(q.dtype)  # [B, T, H, Kv]
    return out, weights.reshape(b, h, t, -1)  # [B, H, T, S_total (+1)]


def _per_head(at: AttentionPoint, bht: tuple[int, int, int], name: str, x: Array) -> Array:
    """`at` applied to grouped [B, G, R, T, S] logits or weights seen as [B, H, T, S]."""
    return at(name, x.reshape(*bht, -1)).reshape(x.shape)


def _group_query_heads(q: Array, masks: list[Array | None], g: int) -> tuple[Array, list[Array | None]]:
    """q [B, T, H, K] -> [B, T, G, R, K] and masks [B, 1 or H, T, S] -> [B, 1 or G, 1 or R, T, S]: query
    head h = g R + r meets key head g. Multi-head attention keeps them as they are (a size-1 R axis
    makes XLA:CPU transpose the scores in the backward pass)."""
    b, t, h, d_h = q.shape  # [B, T, H, K]
    if g == h:
        return q, masks

    def group(m: Array) -> Array:  # [B, 1 or H, T, S] -> [B, 1 or G, 1 or R, T, S]
        return m[:, :, None] if m.shape[1] == 1 else m.reshape(b, g, h // g, *m.shape[2:])

    return q.reshape(b, t, g, h // g, d_h), [None if m is None else group(m) for m in masks]


def _segment_scores(q: Array, k: Array, mask: Array | None, scale: float, heads_first: bool,
                    cap: float | None = None) -> Array:
    """One segment's logits q k^T * scale (soft-capped by `cap`) + mask in float32: [B, G, R, T, S] for
    grouped q [B, T, G, R, K] and k [B, S, G, K], or [B, H, T, S] for q [B, T, H, K] and k [B, S, H, K]
    ([B, H, S, K] heads first)."""
    f32 = jnp.float32  # the dot products accumulate and come out in float32
    if q.ndim == 5:  # grouped queries
        scores = jnp.einsum("btgrk,bsgk->bgrts", q, k, preferred_element_type=f32)  # [B, G, R, T, S]
    elif heads_first:  # multi-head, keys as the cache lies: queries heads-first too
        q = q.swapaxes(1, 2)  # [B, H, T, K]
        scores = jnp.einsum("bhtk,bhsk->bhts", q, k, preferred_element_type=f32)  # [B, H, T, S]
    else:  # multi-head
        scores = jnp.einsum("bthk,bshk->bhts", q, k, preferred_element_type=f32)  # [B, H, T, S]
    scores = scores * scale
    scores = softcap(scores, cap) if cap else scores
    return scores if mask is None else scores + mask.astype(f32)


def _joint_softmax(scores: list[Array], sink: Array | None = None, at: AttentionPoint | None = None
                   ) -> tuple[Array, list[Array]]:
    """One softmax over the keys of all segments, as over their concatenation: scores per segment
    [..., T, S_i] float32, sink broadcastable to [..., T, 1] or None -> the weights [..., T, S_total
    (+1)] and their per-segment slices [..., T, S_i]; `at` sees and edits the logits and weights."""
    columns = list(scores)
    if sink is not None:
        columns.append(jnp.broadcast_to(sink, (*scores[0].shape[:-1], 1)))  # [..., T, 1]
    logits = jnp.concatenate(columns, axis=-1)  # [..., T, S_total (+1)]
    if at is not None:
        logits = at("scores", logits)
    with softmax_saves_output():
        weights = jax.nn.softmax(logits, axis=-1)  # [..., T, S_total (+1)]
    if at is not None:
        weights = at("pattern", weights)
    pieces, start = [], 0
    for s in scores:
        pieces.append(weights[..., start : start + s.shape[-1]])  # [..., T, S_i]
        start += s.shape[-1]
    return weights, pieces


def _weigh_values(weights: Array, v: Array, heads_first: bool) -> Array:
    """One segment's share of the output in v's dtype: weights [B, G, R, T, S] with v [B, S, G, Kv] ->
    [B, T, G, R, Kv]; [B, H, T, S] with v [B, S, H, Kv] ([B, H, S, Kv] heads first) -> [B, T, H, Kv]."""
    weights = weights.astype(v.dtype)
    if weights.ndim == 5:  # grouped
        return jnp.einsum("bgrts,bsgk->btgrk", weights, v)  # [B, T, G, R, Kv]
    if heads_first:  # multi-head, values as the cache lies
        return jnp.einsum("bhts,bhsk->bhtk", weights, v).swapaxes(1, 2)  # [B, T, H, Kv]
    return jnp.einsum("bhts,bshk->bthk", weights, v)  # [B, T, H, Kv]


def _fused_attention(q: Array, k: Array, v: Array, mask: Array | None, scale: float, implementation: str) -> Array:
    """One sequence-first segment through `jax.nn.dot_product_attention` ('xla', or 'cudnn' on GPU):
    q [B, T, H, K], k [B, S, G, K], v [B, S, G, Kv], mask [B, 1 or H, T, S] or None -> [B, T, H, Kv]."""
    if implementation == "cudnn" and jax.default_backend() != "gpu":
        raise ValueError(f"implementation='cudnn' needs an NVIDIA GPU with cuDNN; this process runs on "
                         f"{jax.default_backend()!r}: use attention_impl='xla' or 'reference' there")
    # Clip before the cast: a float32 mask value (-1e9) would become -inf in float16.
    bias = None if mask is None else jnp.maximum(mask, mask_value(q.dtype)).astype(q.dtype)
    # jax.nn.dot_product_attention needs one head width for q, k and v; MLA's values may be
    # narrower or wider. Zero features change no score and no output, so pad to the widest.
    k_v = v.shape[-1]
    width = max(q.shape[-1], k_v)

    def pad(x: Array) -> Array:  # [B, T or S, H or G, width]
        return x if x.shape[-1] == width else jnp.pad(x, [(0, 0)] * 3 + [(0, width - x.shape[-1])])

    with softmax_saves_output():
        out = jax.nn.dot_product_attention(
            pad(q), pad(k), pad(v), bias=bias, scale=scale, implementation=implementation
        )  # [B, T, H, width]
    return out[..., :k_v]  # [B, T, H, Kv]


def softmax_saves_output():
    """jax.nn.softmax differentiated by dx = y * (g - sum(g * y)): the backward pass keeps the output y
    alone, not exp's output too."""
    return jax.softmax_custom_jvp(True)


# ----------------------------------------------------------------------------- norms and positions


def layer_norm(x: Array, scale: Array | None = None, bias: Array | None = None, eps: float = 1e-5) -> Array:
    """(x - mean) / sqrt(var + eps) over the last axis, then the optional gain and bias (the lecture's
    has neither, GPT-2's both); statistics in float32. x [..., D], scale, bias [D] -> [..., D]."""
    x32 = x.astype(jnp.float32)
    mean = x32.mean(-1, keepdims=True)
    var = jnp.square(x32 - mean).mean(-1, keepdims=True)
    y = (x32 - mean) * jax.lax.rsqrt(var + eps)
    if scale is not None:
        y = y * scale.astype(jnp.float32)
    if bias is not None:
        y = y + bias.astype(jnp.float32)
    return y.astype(x.dtype)


def rms_norm(x: Array, scale: Array | None = None, eps: float = 1e-5) -> Array:
    """x / sqrt(mean(x^2) + eps) over the last axis, then an optional gain: x [..., D], scale [D] -> [..., D]."""
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.square(x32).mean(-1, keepdims=True) + eps)
    if scale is not None:
        y = y * scale.astype(jnp.float32)
    return y.astype(x.dtype)


def sinusoidal_positions(positions: Array, d: int, base: float = 10000.0) -> Array:
    """"Attention is all you need"'s encoding: dimension 2i holds sin(p / base^(2i/d)), 2i+1 its
    cos. positions [B, T] -> [B, T, d] float32 (d even)."""
    if d % 2:
        raise ValueError(f"sinusoidal positions need an even width, got d={d}")
    inv_freq = base ** (-jnp.arange(0, d, 2, dtype=jnp.float32) / d)  # [d/2]
    angles = positions[..., None].astype(jnp.float32) * inv_freq  # [B, T, d/2]
    return jnp.stack([jnp.sin(angles), jnp.cos(angles)], axis=-1).reshape(*positions.shape, d)


def rope(x: Array, positions: Array, theta: float = 10000.0) -> Array:
    """Rotary position embedding, half-split layout (as Hugging Face Llama): feature i of each half
    pairs with feature i of the other, turned by p * theta^(-2i/K), so a dot product of two rotated
    vectors depends on their positions' difference only. x [B, T, N, K] (K even), positions [B, T]
    -> [B, T, N, K] in x's dtype."""
    d_h = x.shape[-1]
    if d_h % 2:
        raise ValueError(f"RoPE needs an even head width, got {d_h}")
    inv_freq = theta ** (-jnp.arange(0, d_h, 2, dtype=jnp.float32) / d_h)  # [K/2]
    angles = positions[..., None].astype(jnp.float32) * inv_freq  # [B, T, K/2]
    return _turn(x, jnp.cos(angles), jnp.sin(angles))


def rope_turn(x: Array, steps: Array, theta: float | Array = 10000.0) -> Array:
    """x [B, T, N, K] turned further by steps [B, T] (integers >= 0) as RoPE turns a key `steps`
    positions later: what `rope` does, with cos and sin of steps * theta^(-2i/K) composed by angle
    addition from tables of 256 angles per base-256 digit, computed in float64 when traced. No cosine
    is evaluated at run time: on XLA:CPU the cosine of the large angles a long generation reaches made
    the rolling cache's decoding step about 1.2x a plain ring's (docs/performance.md). A traced theta
    (a scanned stack's per-layer base) falls back to `rope`'s cosines."""
    d_h = x.shape[-1]
    if not isinstance(theta, int | float):
        return rope(x, steps, theta)
    inv_freq = float(theta) ** (-np.arange(0, d_h, 2, dtype=np.float64) / d_h)  # [K/2]
    steps = steps.astype(jnp.int32)
    cos = jnp.ones((*steps.shape, d_h // 2), jnp.float32)
    sin = jnp.zeros((*steps.shape, d_h // 2), jnp.float32)
    for digit in range(4):  # steps = sum_d s_d 256^d, s_d in [0, 256): every int32 >= 0
        angles = np.arange(256)[:, None] * 256.0 ** digit * inv_freq  # [256, K/2] float64
        s_d = (steps >> (8 * digit)) & 255  # [B, T]
        c_d, s_d = jnp.asarray(np.cos(angles), jnp.float32)[s_d], jnp.asarray(np.sin(angles), jnp.float32)[s_d]
        cos, sin = cos * c_d - sin * s_d, sin * c_d + cos * s_d  # cos(a + b), sin(a + b)
    return _turn(x, cos, sin)


def _turn(x: Array, cos: Array, sin: Array) -> Array:
    """x [B, T, N, K] with feature i of each half turned with feature i of the other by the angle whose
    cos and sin [B, T, K/2] are given -> [B, T, N, K] in x's dtype."""
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]  # [B, T, 1, K/2]
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    rotated = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return rotated.astype(x.dtype)


# ----------------------------------------------------------------------------- logits


def softcap(logits: Array, cap: float) -> Array:
    """cap * tanh(logits / cap) in float32 (Gemma 2): about the identity for |logits| << cap, and
    bounded by it. logits [...] -> [...] float32."""
    if not cap > 0:
        raise ValueError(f"softcap needs a cap > 0, got {cap!r}")
    return cap * jnp.tanh(logits.astype(jnp.float32) / cap)
