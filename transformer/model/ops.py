"""Pure functions of the transformer: masks, attention, norms and positions, logit soft-capping.

Nothing here holds parameters or state: every function takes arrays and returns arrays, so each
can be called, tested and plotted on its own (the notebooks do). The Flax modules in
`attention.py` and `model.py` own the parameters and call these.

Axis letters (see docs/design.md): B batch, T query length, S key length, D model width, H query heads,
G key/value heads, K head width (d_h), R = H // G query heads per key/value head.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp

Array = jax.Array
# f(name, value) -> value: how a caller sees and edits the attention's "scores" and "pattern".
AttentionPoint = Callable[[str, Array], Array]

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
    window: int | Array | None = None,
    sinks: int | None = None,
    k_context: Array | None = None,
) -> Array:
    """Additive causal mask from explicit positions: key s is visible to query t iff pos_s <= pos_t,
    and with a window W also pos_t - pos_s < W (a band: the query and the W - 1 keys before it),
    or pos_s < sinks (the first tokens stay visible: StreamingLLM's attention sinks; register
    tokens, at negative positions, too).

    With k_context (a table's rows, model/table.py) the order of positions no longer decides: key s
    is visible to query t iff s is a context key (a training row, seen by every row) or
    pos_s == pos_t (the row itself). A test row then reads every training row and no other test
    row; no position order can say that, since each test row must see keys "after" it and not
    the test rows "before" it.

    The window follows Hugging Face Mistral (`sliding_window`): a key exactly W positions back is
    hidden, so each query sees at most W keys, itself included.

    Args:
      q_positions: [B, T] integer position of each query token.
      k_positions: [B, S] integer position of each key (for a cache: of each slot).
      k_valid: optional [B, S] bool, False for keys that hold nothing yet (cache occupancy).
      dtype: dtype of the returned mask.
      window: W > 0 (a Python int, or a traced scalar for a layer of a scanned stack), or None for
        no window.
      sinks: with a window, keys at positions below it are visible however far back (None: none; 0:
        only the registers, which sit before position 0).
      k_context: optional [B, S] bool, True for keys every query sees (a table's training rows); the
        other keys are seen by the query at their own position only. Replaces the causal order.

    Returns:
      [B, 1, T, S] mask: 0 where attention is allowed, a large finite negative value elsewhere.
      The singleton axis broadcasts over heads.
    """
    if k_context is None:
        allowed = k_positions[:, None, :] <= q_positions[:, :, None]  # [B, T, S]: the causal order
    else:  # [B, T, S]: the context keys, and each query itself
        allowed = k_context[:, None, :] | (k_positions[:, None, :] == q_positions[:, :, None])
    if window is not None:
        band = q_positions[:, :, None] - k_positions[:, None, :] < window  # [B, T, S]
        allowed = allowed & (band if sinks is None else (k_positions[:, None, :] < sinks) | band)
    if k_valid is not None:
        allowed = allowed & k_valid[:, None, :]
    return jnp.where(allowed, 0.0, mask_value(dtype)).astype(dtype)[:, None, :, :]


# ----------------------------------------------------------------------------- attention


def attention(q: Array, k: Array, v: Array, mask: Array | None = None) -> tuple[Array, Array]:
    """The lecture's attention, softmax(q k^T / sqrt(d_h) + mask) v, for all rows and heads at once.

    q [B, T, H, K], k and v [B, S, H, K], mask additive [B, 1 or H, T, S] or None. Returns the
    output [B, T, H, K] and the weights [B, H, T, S]. The model calls `dot_product_attention`: the
    same function, for fewer key/value heads, several key segments and the KV cache's layout.
    """
    d_h = q.shape[-1]  # K, the head width
    scores = jnp.einsum("bthk,bshk->bhts", q, k) / d_h**0.5  # [B, H, T, S]: q_t . k_s / sqrt(d_h)
    if mask is not None:  # mask [B, 1 or H, T, S]
        scores = scores + mask  # [B, H, T, S]: a large negative logit where s is hidden from t
    weights = jax.nn.softmax(scores, axis=-1)  # [B, H, T, S]: each row sums to 1 over the S keys
    out = jnp.einsum("bhts,bshk->bthk", weights, v)  # [B, T, H, K]: sum over s of w_ts v_s
    return out, weights  # [B, T, H, K], [B, H, T, S]


def dot_product_attention(
    q: Array,
    k: Array | Sequence[Array],
    v: Array | Sequence[Array],
    mask: Array | Sequence[Array] | None = None,
    *,
    scale: float | None = None,
    implementation: str = "reference",
    heads_first: Sequence[bool] | None = None,
    sink: Array | None = None,
    at: AttentionPoint | None = None,
) -> tuple[Array, Array | None]:
    """`attention` as the model runs it: grouped key/value heads, key segments, the cache's layout.

    It returns what `attention` returns, for keys and values with G <= H heads that come in one or
    more segments along S: with R = H // G query heads per key/value head,

        dot_product_attention(q, [k_1, k_2], [v_1, v_2], [m_1, m_2])
        == attention(q, repeat(concat(k_1, k_2)), repeat(concat(v_1, v_2)), concat(m_1, m_2))

    where concat joins the segments along S and repeat copies each key/value head R times along
    the head axis (tests/test_ops.py holds the two equal). Neither copy is ever made:

    - Grouped heads (`_group_query_heads`): the H query heads are split into G groups of R, and
      group g attends with key/value head g. Multi-head (G = H), grouped-query (1 < G < H) and
      multi-query (G = 1) attention are all this one function; q is reshaped, not k and v repeated.
    - Segments (`_segment_scores`, `_joint_softmax`, `_weigh_values`): for decoding, the cache,
      then this call's new tokens. Each segment is scored on its own, one softmax runs over all of
      them, and each segment's weights meet its own values, so the cache is never copied to append
      to it.
    - Layout: a heads-first segment, [B, G, S, K] as the KV cache lies, is scored as it lies by
      multi-head attention, because XLA:CPU would copy a transposed cache at every decode step.
    - Precision: scores and softmax in float32 whatever the compute dtype (a softmax of bfloat16
      logits loses too much); the output in q's dtype.
    - implementation='xla' / 'cudnn' hands one segment to `jax.nn.dot_product_attention`
      (`_fused_attention`).
    - Sink (`_joint_softmax`): a logit per query head that joins every row as one more column after
      the keys; it takes part in the normalisation and meets no value, so the weights of a row sum
      to 1 - (the sink's share) over the real keys. A sink of -inf is no sink.

    Args:
      q: [B, T, H, K] queries.
      k: [B, S, G, K] keys, or a sequence of such arrays with different S.
      v: [B, S, G, Kv] values (Kv may differ from K), matching k segment by segment.
      mask: additive [B, 1 or H, T, S] mask (or one per segment), or None for no mask.
      scale: score scale; default 1 / sqrt(K), the lecture's 1/sqrt(d_h).
      implementation: 'reference' (the einsums below, runs everywhere), or 'xla' / 'cudnn' to call
        `jax.nn.dot_product_attention` (cuDNN's fused kernel on GPU). The fused paths take a single
        segment and return no weights.
      heads_first: per segment, True if its keys and values come as [B, G, S, K] (the KV cache's
        layout) instead of [B, S, G, K].
      sink: optional [H] sink logit per query head (reference implementation only).
      at: optional f(name, value) -> value, called with "scores" (the pre-softmax logits: scaled
        scores plus the mask) and then "pattern" (the weights), each [B, H, T, S_total (+1)]
        float32, and what it returns is used: the model's named points attn.scores and attn.pattern
        see and edit them this way (reference implementation only).

    Returns:
      (out, weights): out [B, T, H, Kv] in q's dtype; weights [B, H, T, S_total] float32 (None from
      the fused paths), [B, H, T, S_total + 1] with a sink (its last column: the sink's share).
      Under jit, weights that no one uses cost nothing.
    """
    ks, vs, masks, firsts = _segments(k, v, mask, heads_first)
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
        if at is not None or len(ks) != 1 or sink is not None:
            raise ValueError(
                f"implementation={implementation!r} takes one key segment, has no sink logit and computes "
                "no weights; use implementation='reference' to look at or edit attention maps, to decode "
                "from a cache or for attention_sink=True"
            )
        return _fused_attention(q, ks[0], vs[0], masks[0], scale, implementation), None

    # Shapes for G < H; multi-head attention (R = 1) has no G, R axes but H: q [B, T, H, K] and so on.
    q, masks = _group_query_heads(q, masks, g)  # [B, T, G, R, K]; [B, 1 or G, 1 or R, T, S_i]
    scores = [  # per segment [B, G, R, T, S_i]
        _segment_scores(q, k_i, m, scale, f) for k_i, m, f in zip(ks, masks, firsts)
    ]
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


def _segments(
    k: Array | Sequence[Array],
    v: Array | Sequence[Array],
    mask: Array | Sequence[Array] | None,
    heads_first: Sequence[bool] | None,
) -> tuple[list[Array], list[Array], list[Array | None], list[bool]]:
    """Keys, values, masks and heads_first flags as lists of equal length, one entry per segment."""
    # Only a list or tuple is a sequence of segments: a NumPy array must not be split along its batch axis.
    ks = list(k) if isinstance(k, (list, tuple)) else [k]
    vs = list(v) if isinstance(v, (list, tuple)) else [v]
    masks = list(mask) if isinstance(mask, (list, tuple)) else [mask] * len(ks)
    firsts = list(heads_first) if heads_first is not None else [False] * len(ks)
    if not len(ks) == len(vs) == len(masks) == len(firsts):
        raise ValueError(
            f"got {len(ks)} key, {len(vs)} value, {len(masks)} mask and {len(firsts)} heads_first segments"
        )
    return ks, vs, masks, firsts


def _group_query_heads(q: Array, masks: list[Array | None], g: int) -> tuple[Array, list[Array | None]]:
    """Split the H query heads into G groups of R = H // G; group g will meet key/value head g.

    q [B, T, H, K] -> [B, T, G, R, K]; each mask [B, 1 or H, T, S] -> [B, 1 or G, 1 or R, T, S].
    Query head h = g R + r lands in group g = h // R, the key head that `attention` pairs with it
    after repeating each key head R times. Multi-head attention (R = 1) keeps q and the masks as
    they are, with no R axis: a size-1 R axis makes XLA:CPU transpose the [B, H, T, S] scores in
    the backward pass.
    """
    b, t, h, d_h = q.shape  # [B, T, H, K]
    if g == h:
        return q, masks

    def group(m: Array) -> Array:  # [B, 1 or H, T, S] -> [B, 1 or G, 1 or R, T, S]
        return m[:, :, None] if m.shape[1] == 1 else m.reshape(b, g, h // g, *m.shape[2:])

    return q.reshape(b, t, g, h // g, d_h), [None if m is None else group(m) for m in masks]


def _segment_scores(q: Array, k: Array, mask: Array | None, scale: float, heads_first: bool) -> Array:
    """One key segment's logits, q k^T * scale + mask, in float32: [B, G, R, T, S] or [B, H, T, S].

    q: grouped [B, T, G, R, K] with k [B, S, G, K], or multi-head [B, T, H, K] with k [B, S, H, K]
    (or [B, H, S, K] when heads_first). mask: grouped like q, or None.
    """
    f32 = jnp.float32  # the dot products accumulate and come out in float32
    if q.ndim == 5:  # grouped queries
        scores = jnp.einsum("btgrk,bsgk->bgrts", q, k, preferred_element_type=f32)  # [B, G, R, T, S]
    elif heads_first:  # multi-head, keys as the cache lies: queries heads-first too
        q = q.swapaxes(1, 2)  # [B, H, T, K]
        scores = jnp.einsum("bhtk,bhsk->bhts", q, k, preferred_element_type=f32)  # [B, H, T, S]
    else:  # multi-head
        scores = jnp.einsum("bthk,bshk->bhts", q, k, preferred_element_type=f32)  # [B, H, T, S]
    scores = scores * scale
    return scores if mask is None else scores + mask.astype(f32)


def _joint_softmax(
    scores: list[Array], sink: Array | None = None, at: AttentionPoint | None = None
) -> tuple[Array, list[Array]]:
    """One softmax over the keys of all segments together, as over their concatenation.

    scores: per segment [..., T, S_i] float32. sink: None, or a logit per head broadcastable to
    [..., T, 1]: one more column after the keys, normalised with them, that no value meets (its
    weight is attention given to nothing). at: applied to the joint logits ("scores") and weights
    ("pattern"), see `dot_product_attention`. Returns the weights [..., T, S_total] ([..., T,
    S_total + 1] with a sink, its column last) and their slices [..., T, S_i], one per segment.
    """
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
    """One segment's share of the output, the weighted sum of its values over its S keys.

    weights [B, G, R, T, S] with v [B, S, G, Kv] -> [B, T, G, R, Kv]; weights [B, H, T, S] with v
    [B, S, H, Kv] (or [B, H, S, Kv] when heads_first) -> [B, T, H, Kv]. Computed in v's dtype.
    """
    weights = weights.astype(v.dtype)
    if weights.ndim == 5:  # grouped
        return jnp.einsum("bgrts,bsgk->btgrk", weights, v)  # [B, T, G, R, Kv]
    if heads_first:  # multi-head, values as the cache lies
        return jnp.einsum("bhts,bhsk->bhtk", weights, v).swapaxes(1, 2)  # [B, T, H, Kv]
    return jnp.einsum("bhts,bshk->bthk", weights, v)  # [B, T, H, Kv]


def _fused_attention(
    q: Array, k: Array, v: Array, mask: Array | None, scale: float, implementation: str
) -> Array:
    """One sequence-first segment through `jax.nn.dot_product_attention` ('xla', or 'cudnn' on GPU).

    q [B, T, H, K], k [B, S, G, K], v [B, S, G, Kv], mask [B, 1 or H, T, S] or None -> [B, T, H, Kv].
    """
    if implementation == "cudnn" and jax.default_backend() != "gpu":
        raise ValueError(
            f"implementation='cudnn' needs an NVIDIA GPU with cuDNN; this process runs on "
            f"{jax.default_backend()!r}: use attention_impl='xla' or 'reference' there"
        )
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
    """A context in which jax.nn.softmax differentiates by its own rule, dx = y * (g - sum(g * y)).

    That rule (JAX's `softmax_custom_jvp`, still off by default) keeps only the output y for the
    backward pass; the default differentiates through exp and the division and keeps both: two
    [B, H, T, S] arrays per layer instead of one. Same values; the gradients agree to float32
    rounding.
    """
    return jax.softmax_custom_jvp(True)


# ----------------------------------------------------------------------------- norms and positions


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
      x: [B, T, H, K] queries or keys, any number of heads (H, G or 1; K even). positions: [B, T]
        integer positions.
    Returns:
      [B, T, H, K] in x's dtype.
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


# ----------------------------------------------------------------------------- logits


def softcap(logits: Array, cap: float) -> Array:
    """cap * tanh(logits / cap) in float32: close to the identity for |logits| << cap, bounded by cap
    (Gemma 2's logit soft-capping). Keeps a large logit from growing without bound, smoothly.

    Args:
      logits: [...], any float dtype. cap: c > 0.
    Returns:
      [...] float32, every |value| <= cap (tanh rounds to 1 in float32 far out).
    """
    if not cap > 0:
        raise ValueError(f"softcap needs a cap > 0, got {cap!r}")
    return cap * jnp.tanh(logits.astype(jnp.float32) / cap)
