"""Pure functions of the transformer: masks, attention, norms and positions.

Nothing here holds parameters or state: every function takes arrays and returns arrays, so each
can be called, tested and plotted on its own (the notebooks do). The Flax modules in
`attention.py` and `model.py` own the parameters and call these.

Axis letters (see docs/design.md): B batch, T query length, S key length, D model width, H query heads,
G key/value heads, K head width (d_h), R = H // G query heads per key/value head.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp

Array = jax.Array

# A large *finite* negative logit. -inf would turn a fully masked row into 0/0 = NaN; a finite
# value gives that row a uniform (and ignorable) distribution instead. Masks are added to float32
# scores; `mask_value` gives the right size for a narrower dtype.
MASK_VALUE = -1e9


def mask_value(dtype: jnp.dtype = jnp.float32) -> float:
    """A finite, very negative logit that is representable in `dtype` (half of its lowest value)."""
    lowest = float(jnp.finfo(dtype).min)  # compare as Python floats: -1e9 overflows float16
    return lowest / 2 if lowest > MASK_VALUE else MASK_VALUE


def causal_mask(
    q_positions: Array,
    k_positions: Array,
    k_valid: Array | None = None,
    dtype: jnp.dtype = jnp.float32,
) -> Array:
    """Additive causal mask from explicit positions: key s is visible to query t iff pos_s <= pos_t.

    Args:
      q_positions: [B, T] integer position of each query token.
      k_positions: [B, S] integer position of each key (for a cache: of each slot).
      k_valid: optional [B, S] bool, False for keys that hold nothing yet (cache occupancy).
      dtype: dtype of the returned mask.

    Returns:
      [B, 1, T, S] mask: 0 where attention is allowed, a large finite negative value elsewhere.
      The singleton axis broadcasts over heads.
    """
    allowed = k_positions[:, None, :] <= q_positions[:, :, None]  # [B, T, S]
    if k_valid is not None:
        allowed = allowed & k_valid[:, None, :]
    return jnp.where(allowed, 0.0, mask_value(dtype)).astype(dtype)[:, None, :, :]


def dot_product_attention(
    q: Array,
    k: Array | Sequence[Array],
    v: Array | Sequence[Array],
    mask: Array | Sequence[Array] | None = None,
    *,
    scale: float | None = None,
    return_weights: bool = False,
    implementation: str = "reference",
    heads_first: Sequence[bool] | None = None,
) -> tuple[Array, Array | None]:
    """Scaled dot-product attention with grouped keys/values: softmax(q k^T * scale + mask) v.

    The H query heads are split into G groups of R = H // G heads; group g attends with key/value
    head g. Multi-head (G = H), grouped-query (1 < G < H) and multi-query (G = 1) attention are all
    this one function, and the keys are never repeated R times in memory: q is reshaped instead.

    Keys, values and masks may come in several segments (for decoding: the cache, then this call's
    new tokens). Each segment is scored separately and one softmax runs over all of them, which is
    the same as attending over their concatenation but never copies the cache to append to it.

    Args:
      q: [B, T, H, K] queries.
      k: [B, S, G, K] keys, or a sequence of such arrays with different S.
      v: [B, S, G, Kv] values (Kv may differ from K), matching k segment by segment.
      mask: additive [B, 1 or H, T, S] mask (or one per segment), or None for no mask.
      scale: score scale; default 1 / sqrt(K), the lecture's 1/sqrt(d_h).
      return_weights: also return the attention weights.
      implementation: 'reference' (einsum + float32 softmax, runs everywhere), or 'xla' / 'cudnn'
        to call `jax.nn.dot_product_attention` (cuDNN's fused kernel on GPU). The fused paths take
        a single segment and cannot return weights.
      heads_first: per segment, True if its keys and values come as [B, G, S, K] (the KV cache's
        layout) instead of [B, S, G, K]. Multi-head attention then scores them as they lie: written
        as a transpose of the cache, XLA:CPU copies every layer's cached keys and values at every
        decode step (46% of a GPT-2-small step with 1024 slots). Reference implementation only.

    Returns:
      (out, weights): out [B, T, H, Kv] in q's dtype; weights [B, H, T, S_total] float32 or None.
    """
    # Only a list or tuple is a sequence of segments: a NumPy array must not be split along its batch axis.
    ks = list(k) if isinstance(k, (list, tuple)) else [k]
    vs = list(v) if isinstance(v, (list, tuple)) else [v]
    masks = list(mask) if isinstance(mask, (list, tuple)) else [mask] * len(ks)
    firsts = list(heads_first) if heads_first is not None else [False] * len(ks)
    if not len(ks) == len(vs) == len(masks) == len(firsts):
        raise ValueError(
            f"got {len(ks)} key, {len(vs)} value, {len(masks)} mask and {len(firsts)} heads_first segments"
        )
    b, t, h, d_h = q.shape
    g = ks[0].shape[1 if firsts[0] else 2]
    if h % g:
        raise ValueError(f"{h} query heads cannot be grouped over {g} key/value heads")
    scale = d_h**-0.5 if scale is None else scale
    if implementation != "reference" or g != h:  # only multi-head scores heads-first segments as they lie
        ks = [k_i.swapaxes(1, 2) if f else k_i for k_i, f in zip(ks, firsts)]
        vs = [v_i.swapaxes(1, 2) if f else v_i for v_i, f in zip(vs, firsts)]
        firsts = [False] * len(ks)

    if implementation != "reference":
        if return_weights or len(ks) != 1:
            raise ValueError(
                f"implementation={implementation!r} takes one key segment and returns no weights; "
                "use implementation='reference' to look at attention maps or to decode from a cache"
            )
        if implementation == "cudnn" and jax.default_backend() != "gpu":
            raise ValueError(
                f"implementation='cudnn' needs an NVIDIA GPU with cuDNN; this process runs on "
                f"{jax.default_backend()!r}: use attention_impl='xla' or 'reference' there"
            )
        # Clip before the cast: a float32 mask value (-1e9) would become -inf in float16.
        bias = None if masks[0] is None else jnp.maximum(masks[0], mask_value(q.dtype)).astype(q.dtype)
        # jax.nn.dot_product_attention needs one head width for q, k and v; MLA's values may be
        # narrower or wider. Zero features change no score and no output, so pad to the widest.
        k_v = vs[0].shape[-1]
        width = max(d_h, k_v)

        def pad(x: Array) -> Array:
            return x if x.shape[-1] == width else jnp.pad(x, [(0, 0)] * 3 + [(0, width - x.shape[-1])])

        with softmax_saves_output():
            out = jax.nn.dot_product_attention(
                pad(q), pad(ks[0]), pad(vs[0]), bias=bias, scale=scale, implementation=implementation
            )
        return out[..., :k_v], None

    r = h // g
    if r == 1:
        # Multi-head: no group axis. A size-1 R axis makes XLA:CPU copy (transpose) the [B, H, T, S]
        # scores in the backward pass; without it the baby-GPT train step is ~10% faster.
        qg, q_axes, w_axes, group = q, "bthk", "bhts", lambda m: m
    else:
        qg, q_axes, w_axes, group = q.reshape(b, t, g, r, d_h), "btgrk", "bgrts", lambda m: _group_heads(m, g)
    kv_axes = "bshk" if r == 1 else "bsgk"
    # Scores in float32 whatever the compute dtype: softmax of bfloat16 logits loses too much.
    # A heads-first segment (multi-head only) pairs with heads-first queries, "bhtk,bhsk".
    scores = [
        jnp.einsum("bhtk,bhsk->bhts", q.swapaxes(1, 2), k_i, preferred_element_type=jnp.float32) * scale
        if first else
        jnp.einsum(f"{q_axes},{kv_axes}->{w_axes}", qg, k_i, preferred_element_type=jnp.float32) * scale
        for k_i, first in zip(ks, firsts)
    ]
    scores = [s if m is None else s + group(m).astype(jnp.float32) for s, m in zip(scores, masks)]
    sizes = [s.shape[-1] for s in scores]
    with softmax_saves_output():  # [B, G, R, T, S_total], or [B, H, T, S_total] when R = 1
        weights = jax.nn.softmax(jnp.concatenate(scores, axis=-1), axis=-1)
    out = 0.0
    start = 0
    for v_i, size, first in zip(vs, sizes, firsts):
        w_i = weights[..., start : start + size].astype(v_i.dtype)
        if first:
            out = out + jnp.einsum("bhts,bhsk->bhtk", w_i, v_i).swapaxes(1, 2)
        else:
            out = out + jnp.einsum(f"{w_axes},{kv_axes}->{q_axes}", w_i, v_i)
        start += size
    out = out.reshape(b, t, h, vs[0].shape[-1]).astype(q.dtype)
    return out, weights.reshape(b, h, t, -1) if return_weights else None


def softmax_saves_output():
    """A context in which jax.nn.softmax differentiates by its own rule, dx = y * (g - sum(g * y)).

    That rule (JAX's `softmax_custom_jvp`, still off by default) keeps only the output y for the
    backward pass; the default differentiates through exp and the division and keeps both: two
    [B, H, T, S] arrays per layer instead of one (GPT-2 small, batch 8 x 1024: 24.2 -> 19.7 GiB per
    train step). Same values; the gradients agree to float32 rounding.
    """
    return jax.softmax_custom_jvp(True)


def _group_heads(mask: Array, g: int) -> Array:
    """[B, 1 or H, T, S] -> [B, 1 or G, 1 or R, T, S], to line up with grouped scores."""
    b, h, t, s = mask.shape
    return mask[:, :, None] if h == 1 else mask.reshape(b, g, h // g, t, s)


def layer_norm(
    x: Array, scale: Array | None = None, bias: Array | None = None, eps: float = 1e-5
) -> Array:
    """Layer norm over the last axis: (x - mean) / sqrt(var + eps), then optional gain and bias.

    The lecture's layer norm has neither gain nor bias; GPT-2's has both. Statistics are taken in
    float32 and the result is cast back to x's dtype.

    Args:
      x: [..., D]. scale, bias: [D] or None.
    Returns:
      [..., D]
    """
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
    """RMSNorm over the last axis: x / sqrt(mean(x^2) + eps), then an optional gain.

    Args:
      x: [..., D]. scale: [D] or None.
    Returns:
      [..., D]
    """
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.square(x32).mean(-1, keepdims=True) + eps)
    if scale is not None:
        y = y * scale.astype(jnp.float32)
    return y.astype(x.dtype)


def sinusoidal_positions(positions: Array, d: int, base: float = 10000.0) -> Array:
    """The fixed sine/cosine position encoding of "Attention is all you need".

    Dimension 2i holds sin(p / base^(2i/d)), dimension 2i+1 holds cos(p / base^(2i/d)).

    Args:
      positions: [B, T] integer positions. d: encoding width (even).
    Returns:
      [B, T, d] float32.
    """
    if d % 2:
        raise ValueError(f"sinusoidal positions need an even width, got d={d}")
    inv_freq = base ** (-jnp.arange(0, d, 2, dtype=jnp.float32) / d)  # [d/2]
    angles = positions[..., None].astype(jnp.float32) * inv_freq  # [B, T, d/2]
    return jnp.stack([jnp.sin(angles), jnp.cos(angles)], axis=-1).reshape(*positions.shape, d)


def rope(x: Array, positions: Array, theta: float = 10000.0) -> Array:
    """Rotary position embedding, half-split layout (as Hugging Face Llama).

    Feature i of the first half and feature i of the second half form a pair that is rotated by
    the angle p * theta^(-2i/K). A dot product of two rotated vectors then depends only on the
    difference of their positions.

    Args:
      x: [B, T, N, K] queries or keys (N heads; K even). positions: [B, T] integer positions.
    Returns:
      [B, T, N, K] in x's dtype.
    """
    d_h = x.shape[-1]
    if d_h % 2:
        raise ValueError(f"RoPE needs an even head width, got {d_h}")
    inv_freq = theta ** (-jnp.arange(0, d_h, 2, dtype=jnp.float32) / d_h)  # [K/2]
    angles = positions[..., None].astype(jnp.float32) * inv_freq  # [B, T, K/2]
    cos = jnp.cos(angles)[:, :, None, :]
    sin = jnp.sin(angles)[:, :, None, :]
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    rotated = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return rotated.astype(x.dtype)
