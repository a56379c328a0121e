"""Tests of transformer/model/ops.py: masks, attention, norms and positions against numpy references."""

from __future__ import annotations

import inspect
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from transformer.model import ops

SETTINGS = settings(max_examples=25, deadline=None, derandomize=True, database=None)

# One compiled program per shape instead of one per primitive: eager dispatch of the ~20 ops
# inside attention is what makes small tests slow.
attention = jax.jit(
    ops.dot_product_attention, static_argnames=("scale", "implementation", "heads_first")
)
textbook = jax.jit(ops.attention)  # the lecture's formula, which the fast path must equal
causal_mask = jax.jit(ops.causal_mask, static_argnames=("dtype",))
rope = jax.jit(ops.rope, static_argnames=("theta",))


def _randn(seed, *shape, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


# ----------------------------------------------------------------------------- causal_mask


def test_causal_mask_from_explicit_positions():
    q_pos = jnp.array([[3, 4], [0, 1]])
    k_pos = jnp.array([[0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 4, 5]])
    m = np.asarray(ops.causal_mask(q_pos, k_pos))
    assert m.shape == (2, 1, 2, 6)
    assert m.dtype == np.float32
    allowed = m == 0
    expected = np.array(
        [
            [[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 0]],
            [[1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0]],
        ],
        bool,
    )
    np.testing.assert_array_equal(allowed[:, 0], expected)
    # Masked entries are a large *finite* negative value.
    assert np.all(np.isfinite(m))
    assert np.all(m[~allowed] <= -1e4)


def test_causal_mask_k_valid_hides_empty_slots():
    q_pos = jnp.array([[5], [2]])
    k_pos = jnp.broadcast_to(jnp.arange(6), (2, 6))
    k_valid = jnp.array([[1, 1, 0, 1, 0, 1], [1, 1, 1, 1, 1, 1]], bool)
    allowed = np.asarray(ops.causal_mask(q_pos, k_pos, k_valid))[:, 0, 0] == 0
    np.testing.assert_array_equal(
        allowed, [[1, 1, 0, 1, 0, 1], [1, 1, 1, 0, 0, 0]]
    )


@SETTINGS
@given(st.integers(0, 2**31 - 1))
def test_causal_mask_property(seed):
    b, t, s = 2, 4, 6
    rng = np.random.default_rng(seed)
    q_pos = rng.integers(0, 10, (b, t))
    k_pos = rng.integers(0, 10, (b, s))
    k_valid = rng.random((b, s)) < 0.7
    m = np.asarray(causal_mask(jnp.asarray(q_pos), jnp.asarray(k_pos), jnp.asarray(k_valid)))
    assert m.shape == (b, 1, t, s)
    expected = (k_pos[:, None, :] <= q_pos[:, :, None]) & k_valid[:, None, :]
    np.testing.assert_array_equal(m[:, 0] == 0, expected)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
def test_mask_value_is_finite_in_dtype(dtype):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow while choosing the value
        value = ops.mask_value(dtype)
    assert np.isfinite(np.asarray(value, dtype))
    assert value == (float(jnp.finfo(dtype).min) / 2 if dtype == jnp.float16 else ops.MASK_VALUE)
    pos = jnp.arange(4)[None]
    m = ops.causal_mask(pos, pos, jnp.zeros((1, 4), bool), dtype=dtype)
    assert m.dtype == dtype
    m32 = np.asarray(m.astype(jnp.float32))
    assert np.all(np.isfinite(m32))
    assert np.all(m32 < -1e4)  # still large enough to silence a key


@pytest.mark.parametrize("implementation", ["reference", "xla"])
@pytest.mark.parametrize("mask_dtype", ["same", "float32"])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
def test_fully_masked_row_is_finite(dtype, mask_dtype, implementation):
    b, t, h, k = 2, 3, 2, 4
    q = jnp.asarray(_randn(0, b, t, h, k)).astype(dtype)
    kk = jnp.asarray(_randn(1, b, t, h, k)).astype(dtype)
    v = jnp.asarray(_randn(2, b, t, h, k)).astype(dtype)
    pos = jnp.broadcast_to(jnp.arange(t), (b, t))
    valid = jnp.array([[False] * t, [True] * t])  # row 0: every key masked
    mask = ops.causal_mask(pos, pos, valid, dtype=dtype if mask_dtype == "same" else jnp.float32)
    # float16 'xla' runs eagerly: under one jit, XLA:CPU rejects jax.nn.dot_product_attention's
    # float16 x float16 -> float32 dot ("precision F16_F16_F32 is not supported"), a CPU backend
    # limit, not ours.
    run = ops.dot_product_attention if (implementation, dtype) == ("xla", jnp.float16) else attention
    out, _ = run(q, kk, v, mask, implementation=implementation)
    assert out.dtype == dtype
    assert np.all(np.isfinite(np.asarray(out.astype(jnp.float32))))
    if implementation == "reference":
        _, w = attention(q, kk, v, mask)
        # A fully masked row still gets a proper (finite, normalised) distribution, not NaN.
        assert np.all(np.isfinite(np.asarray(w)))
        np.testing.assert_allclose(np.asarray(w).sum(-1), 1.0, rtol=1e-5)


# ----------------------------------------------------------------------------- attention


def naive_attention(q, k, v, mask=None, scale=None):
    """Per batch row and head: softmax(q k^T * scale + mask) v, in float64 numpy."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    b, t, h, d = q.shape
    g = k.shape[2]
    scale = d**-0.5 if scale is None else scale
    out = np.zeros((b, t, h, v.shape[-1]))
    weights = np.zeros((b, h, t, k.shape[1]))
    for bi in range(b):
        for hi in range(h):
            gi = hi // (h // g)
            s = q[bi, :, hi] @ k[bi, :, gi].T * scale
            if mask is not None:
                s = s + np.asarray(mask, np.float64)[bi, hi if mask.shape[1] > 1 else 0]
            w = np.exp(s - s.max(-1, keepdims=True))
            w = w / w.sum(-1, keepdims=True)
            weights[bi, hi] = w
            out[bi, :, hi] = w @ v[bi, :, gi]
    return out, weights


@pytest.mark.parametrize(
    "h,g,mask_heads,kv",
    [(4, 4, 1, 8), (4, 2, 1, 8), (4, 1, 4, 8), (6, 2, 6, 5)],
    ids=["mha", "gqa", "mqa-headmask", "gqa-headmask-vwidth"],
)
def test_attention_matches_naive_reference(h, g, mask_heads, kv):
    b, t, s, d = 2, 5, 7, 8
    q, k, v = _randn(0, b, t, h, d), _randn(1, b, s, g, d), _randn(2, b, s, g, kv)
    rng = np.random.default_rng(3)
    mask = np.where(rng.random((b, mask_heads, t, s)) < 0.3, ops.MASK_VALUE, 0.0).astype(np.float32)
    mask[..., 0] = 0.0  # keep one key per row so the reference is well defined
    out, w = attention(q, k, v, jnp.asarray(mask))
    ref_out, ref_w = naive_attention(q, k, v, mask)
    assert out.shape == (b, t, h, kv)
    assert w.shape == (b, h, t, s)
    np.testing.assert_allclose(np.asarray(out), ref_out, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(w), ref_w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(w).sum(-1), 1.0, rtol=1e-5)

    out_s, _ = attention(q, k, v, jnp.asarray(mask), scale=0.37)
    np.testing.assert_allclose(np.asarray(out_s), naive_attention(q, k, v, mask, 0.37)[0], rtol=1e-5, atol=1e-5)


def test_unmasked_attention_matches_naive_reference():
    q, k, v = _randn(0, 1, 4, 2, 8), _randn(1, 1, 6, 2, 8), _randn(2, 1, 6, 2, 8)
    out, _ = attention(q, k, v)
    np.testing.assert_allclose(np.asarray(out), naive_attention(q, k, v)[0], rtol=1e-5, atol=1e-5)


def test_numpy_inputs_are_arrays_not_segments():
    """A NumPy array is one key/value array; only a list or tuple holds segments."""
    q, k, v = _randn(0, 3, 4, 2, 8), _randn(1, 3, 6, 2, 8), _randn(2, 3, 6, 2, 8)
    out, _ = ops.dot_product_attention(q, k, v)  # eager, NumPy in
    assert out.shape == (3, 4, 2, 8)
    np.testing.assert_allclose(np.asarray(out), naive_attention(q, k, v)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("g", [1, 2, 3])
def test_grouped_keys_equal_repeated_keys(g):
    b, t, h, d = 2, 4, 6, 8
    q, k, v = _randn(0, b, t, h, d), _randn(1, b, t, g, d), _randn(2, b, t, g, d)
    pos = jnp.broadcast_to(jnp.arange(t), (b, t))
    mask = ops.causal_mask(pos, pos)
    out, w = attention(q, k, v, mask)
    r = h // g
    out_mha, w_mha = attention(
        q, jnp.asarray(np.repeat(k, r, axis=2)), jnp.asarray(np.repeat(v, r, axis=2)), mask
    )
    np.testing.assert_allclose(np.asarray(out), np.asarray(out_mha), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(w), np.asarray(w_mha), rtol=1e-6, atol=1e-7)


def test_heads_not_divisible_by_groups_raises():
    with pytest.raises(ValueError, match="heads"):
        ops.dot_product_attention(jnp.zeros((1, 2, 4, 8)), jnp.zeros((1, 2, 3, 8)), jnp.zeros((1, 2, 3, 8)))


def test_two_key_segments_equal_their_concatenation():
    b, t, h, g, d = 2, 3, 4, 2, 8
    s1, s2 = 5, 3
    q = _randn(0, b, t, h, d)
    k1, k2 = _randn(1, b, s1, g, d), _randn(2, b, s2, g, d)
    v1, v2 = _randn(3, b, s1, g, d), _randn(4, b, s2, g, d)
    rng = np.random.default_rng(5)
    m = np.where(rng.random((b, 1, t, s1 + s2)) < 0.4, ops.MASK_VALUE, 0.0).astype(np.float32)
    m[..., 0] = 0.0
    out_seg, w_seg = attention(
        q, [jnp.asarray(k1), jnp.asarray(k2)], [jnp.asarray(v1), jnp.asarray(v2)],
        [jnp.asarray(m[..., :s1]), jnp.asarray(m[..., s1:])],
    )
    out_cat, w_cat = attention(
        q, jnp.asarray(np.concatenate([k1, k2], 1)), jnp.asarray(np.concatenate([v1, v2], 1)),
        jnp.asarray(m),
    )
    assert w_seg.shape == (b, h, t, s1 + s2)
    np.testing.assert_allclose(np.asarray(out_seg), np.asarray(out_cat), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(w_seg), np.asarray(w_cat), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(np.asarray(w_seg).sum(-1), 1.0, rtol=1e-6)
    # Mismatched segment counts are an error, not a silent truncation.
    with pytest.raises(ValueError, match="segments"):
        attention(q, [jnp.asarray(k1), jnp.asarray(k2)], [jnp.asarray(v1)])


@pytest.mark.parametrize("g", [4, 2])
def test_xla_implementation_equals_reference(g):
    b, t, h, d = 2, 6, 4, 8
    q, k, v = _randn(0, b, t, h, d), _randn(1, b, t, g, d), _randn(2, b, t, g, d)
    pos = jnp.broadcast_to(jnp.arange(t), (b, t))
    mask = ops.causal_mask(pos, pos)
    ref, _ = attention(q, k, v, mask)
    xla, w = attention(q, k, v, mask, implementation="xla")
    assert w is None
    np.testing.assert_allclose(np.asarray(xla), np.asarray(ref), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="reference"):  # a look at the weights needs them computed
        ops.dot_product_attention(q, k, v, mask, implementation="xla", at=lambda name, x: x)


# ----------------------------------------------------------------------------- the textbook and the fast path


def test_textbook_attention_is_short_and_matches_naive_reference():
    """ops.attention is the lecture's formula, in under 20 lines, for all rows and heads at once."""
    assert len(inspect.getsource(ops.attention).splitlines()) < 20
    b, t, s, h, d = 2, 4, 6, 3, 8
    q, k, v = _randn(0, b, t, h, d), _randn(1, b, s, h, d), _randn(2, b, s, h, d)
    for mask in (None, _random_mask(np.random.default_rng(3), b, h, t, s)):
        out, w = textbook(q, k, v, mask)
        ref_out, ref_w = naive_attention(q, k, v, mask)
        np.testing.assert_allclose(np.asarray(out), ref_out, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.asarray(w), ref_w, rtol=1e-5, atol=1e-6)


def _random_mask(rng, b, heads, t, s):
    """Additive [B, heads, T, S] mask hiding ~30% of the keys, but never key 0."""
    mask = np.where(rng.random((b, heads, t, s)) < 0.3, ops.MASK_VALUE, 0.0).astype(np.float32)
    mask[..., 0] = 0.0  # every query keeps a key: no row is fully masked
    return mask


SEGMENT_LAYOUTS = {  # heads_first, per key segment
    "seq": (False,),
    "heads": (True,),
    "cache-new": (True, False),  # the decoder's layout: a heads-first cache, then new tokens
    "seq-seq": (False, False),
}


@pytest.mark.parametrize("t", [1, 3], ids=["decode", "prefill"])
@pytest.mark.parametrize("mask_heads", [None, 1, 4], ids=["no-mask", "mask", "head-mask"])
@pytest.mark.parametrize("heads_first", SEGMENT_LAYOUTS.values(), ids=SEGMENT_LAYOUTS.keys())
@pytest.mark.parametrize("g", [4, 2, 1], ids=["mha", "gqa", "mqa"])
def test_dot_product_attention_equals_textbook_on_joined_repeated_keys(g, heads_first, mask_heads, t):
    """The fast path is ops.attention applied to the segments' concatenation, every key/value head
    repeated R = H // G times: same output, same weights."""
    b, h, d = 2, 4, 8
    sizes = [5, 3][: len(heads_first)]  # S_i of each segment
    rng = np.random.default_rng(len(heads_first) * 100 + g * 10 + t)
    q = rng.standard_normal((b, t, h, d)).astype(np.float32)  # [B, T, H, K]
    ks = [rng.standard_normal((b, s, g, d)).astype(np.float32) for s in sizes]  # [B, S_i, G, K]
    vs = [rng.standard_normal((b, s, g, d)).astype(np.float32) for s in sizes]  # [B, S_i, G, K]
    masks = None if mask_heads is None else [_random_mask(rng, b, mask_heads, t, s) for s in sizes]
    # The fast path takes heads-first segments as [B, G, S_i, K], as the KV cache lies.
    lay = lambda xs: [x.swapaxes(1, 2) if f else x for x, f in zip(xs, heads_first)]  # noqa: E731
    out, w = attention(q, lay(ks), lay(vs), masks, heads_first=heads_first)

    r = h // g
    k_all = np.repeat(np.concatenate(ks, axis=1), r, axis=2)  # [B, S, H, K]
    v_all = np.repeat(np.concatenate(vs, axis=1), r, axis=2)  # [B, S, H, K]
    mask_all = None if masks is None else np.concatenate(masks, axis=-1)  # [B, 1 or H, T, S]
    want_out, want_w = textbook(q, k_all, v_all, mask_all)
    assert out.shape == want_out.shape == (b, t, h, d)
    assert w.shape == want_w.shape == (b, h, t, sum(sizes))
    np.testing.assert_allclose(np.asarray(out), np.asarray(want_out), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(w), np.asarray(want_w), rtol=1e-5, atol=1e-6)

    if len(sizes) == 1:  # the fused path takes one segment (and returns no weights)
        fused, _ = attention(q, lay(ks), lay(vs), masks, implementation="xla", heads_first=heads_first)
        np.testing.assert_allclose(np.asarray(fused), np.asarray(want_out), rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- norms


@pytest.mark.parametrize("use_scale", [False, True])
@pytest.mark.parametrize("use_bias", [False, True])
def test_layer_norm_matches_numpy(use_scale, use_bias):
    x = _randn(0, 2, 3, 16) * 3 + 1
    scale = _randn(1, 16) if use_scale else None
    bias = _randn(2, 16) if use_bias else None
    y = ops.layer_norm(jnp.asarray(x), None if scale is None else jnp.asarray(scale),
                       None if bias is None else jnp.asarray(bias), eps=1e-5)
    x64 = x.astype(np.float64)
    ref = (x64 - x64.mean(-1, keepdims=True)) / np.sqrt(x64.var(-1, keepdims=True) + 1e-5)
    if scale is not None:
        ref = ref * scale
    if bias is not None:
        ref = ref + bias
    np.testing.assert_allclose(np.asarray(y), ref, rtol=1e-5, atol=1e-5)
    assert ops.layer_norm(jnp.asarray(x, jnp.bfloat16)).dtype == jnp.bfloat16


@pytest.mark.parametrize("use_scale", [False, True])
def test_rms_norm_matches_numpy(use_scale):
    x = _randn(0, 2, 3, 16) * 3 + 1
    scale = _randn(1, 16) if use_scale else None
    y = ops.rms_norm(jnp.asarray(x), None if scale is None else jnp.asarray(scale), eps=1e-6)
    x64 = x.astype(np.float64)
    ref = x64 / np.sqrt((x64**2).mean(-1, keepdims=True) + 1e-6)
    if scale is not None:
        ref = ref * scale
    np.testing.assert_allclose(np.asarray(y), ref, rtol=1e-5, atol=1e-5)
    assert ops.rms_norm(jnp.asarray(x, jnp.float16)).dtype == jnp.float16


# ----------------------------------------------------------------------------- positions


def test_sinusoidal_positions_match_formula():
    d, base = 10, 10000.0
    positions = np.array([[0, 1, 2, 7], [3, 50, 100, 511]])
    pe = np.asarray(ops.sinusoidal_positions(jnp.asarray(positions), d, base))
    assert pe.shape == (2, 4, d)
    ref = np.zeros((2, 4, d))
    for b in range(2):
        for t in range(4):
            p = positions[b, t]
            for i in range(d // 2):
                ref[b, t, 2 * i] = np.sin(p / base ** (2 * i / d))
                ref[b, t, 2 * i + 1] = np.cos(p / base ** (2 * i / d))
    np.testing.assert_allclose(pe, ref, atol=2e-5)
    with pytest.raises(ValueError, match="even"):
        ops.sinusoidal_positions(jnp.asarray(positions), 7)


def rope_hf(x, positions, theta=10000.0):
    """Hugging Face Llama: x * cos + rotate_half(x) * sin, with emb = cat(freqs, freqs)."""
    x = np.asarray(x, np.float64)
    d = x.shape[-1]
    inv_freq = 1.0 / (theta ** (np.arange(0, d, 2, dtype=np.float64) / d))
    freqs = np.asarray(positions, np.float64)[..., None] * inv_freq  # [B, T, d/2]
    emb = np.concatenate([freqs, freqs], axis=-1)[:, :, None, :]  # [B, T, 1, d]
    cos, sin = np.cos(emb), np.sin(emb)

    def rotate_half(a):
        a1, a2 = a[..., : d // 2], a[..., d // 2 :]
        return np.concatenate([-a2, a1], axis=-1)

    return x * cos + rotate_half(x) * sin


@pytest.mark.parametrize("theta", [10000.0, 500000.0])
def test_rope_matches_hugging_face_llama(theta):
    x = _randn(0, 2, 5, 3, 8)
    positions = np.array([[0, 1, 2, 3, 4], [7, 8, 9, 30, 200]])
    y = np.asarray(ops.rope(jnp.asarray(x), jnp.asarray(positions), theta))
    np.testing.assert_allclose(y, rope_hf(x, positions, theta), rtol=1e-4, atol=1e-4)
    # Position 0 is the identity, and the rotation really does something elsewhere.
    np.testing.assert_allclose(y[0, 0], x[0, 0], atol=1e-6)
    assert np.abs(y[1] - x[1]).max() > 0.1
    with pytest.raises(ValueError, match="even"):
        ops.rope(jnp.zeros((1, 2, 1, 5)), jnp.zeros((1, 2), jnp.int32))


def test_rope_turn_is_rope_by_whole_steps_without_a_cosine_at_run_time():
    """ops.rope_turn(x, steps) turns x as RoPE turns a key `steps` positions on: equal to the float64
    rotation for steps up to 2^31 - 1 (every digit of its angle tables used), 0 steps the identity
    bit for bit, a traced theta through `rope`; its compiled program evaluates no cosine or sine."""
    x = _randn(0, 2, 4, 3, 8)
    steps = np.array([[0, 1, 255, 256], [70_000, 2**24 + 5, 10**9, 2**31 - 1]])
    for theta in (10000.0, 500000.0):
        y = np.asarray(ops.rope_turn(jnp.asarray(x), jnp.asarray(steps), theta))
        angles = steps[..., None] * theta ** (-np.arange(0, 8, 2) / 8)  # float64 throughout
        cos, sin = np.cos(angles)[:, :, None], np.sin(angles)[:, :, None]
        x1, x2 = np.split(x.astype(np.float64), 2, axis=-1)
        np.testing.assert_allclose(y, np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1), atol=2e-6)
    np.testing.assert_array_equal(np.asarray(ops.rope_turn(jnp.asarray(x), jnp.zeros((2, 4), jnp.int32))), x)
    small = jnp.asarray(steps[:1])
    np.testing.assert_allclose(ops.rope_turn(jnp.asarray(x[:1]), small, jnp.float32(10000.0)),
                               ops.rope(jnp.asarray(x[:1]), small), atol=1e-6)  # traced theta: rope itself
    hlo = jax.jit(lambda x, s: ops.rope_turn(x, s)).lower(jnp.asarray(x), jnp.asarray(steps)).as_text()
    assert "cosine" not in hlo and "sine" not in hlo and "cosine" in jax.jit(ops.rope).lower(
        jnp.asarray(x), jnp.asarray(steps)).as_text()


def test_rope_preserves_norms_and_dtype():
    x = _randn(0, 2, 6, 4, 16)
    positions = np.random.default_rng(1).integers(0, 1000, (2, 6))
    y = np.asarray(ops.rope(jnp.asarray(x), jnp.asarray(positions)))
    np.testing.assert_allclose(np.linalg.norm(y, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-5)
    assert ops.rope(jnp.asarray(x, jnp.bfloat16), jnp.asarray(positions)).dtype == jnp.bfloat16


@SETTINGS
@given(st.integers(0, 200), st.integers(0, 200), st.integers(1, 300), st.integers(0, 2**31 - 1))
def test_rope_dot_product_depends_only_on_relative_position(m, n, shift, seed):
    q = _randn(seed % 1000, 1, 1, 1, 8)
    k = _randn(seed % 1000 + 1, 1, 1, 1, 8)

    def score(pq, pk):
        rq = rope(jnp.asarray(q), jnp.array([[pq]]))
        rk = rope(jnp.asarray(k), jnp.array([[pk]]))
        return float(jnp.sum(rq * rk))

    base = score(m, n)
    np.testing.assert_allclose(score(m + shift, n + shift), base, rtol=1e-3, atol=1e-3)
    # And it does depend on the difference: the rotated score equals the numpy formula at m - n.
    ref = float(np.sum(rope_hf(q, [[m - n]]) * k))
    np.testing.assert_allclose(base, ref, rtol=1e-3, atol=1e-3)


# Multi-head (scored as it lies), grouped and multi-query (transposed back), for several query
# tokens and for one (decoding).
@pytest.mark.parametrize("g,t", [(4, 3), (2, 3), (4, 1), (2, 1), (1, 1)])
def test_heads_first_segment_equals_the_same_keys_sequence_first(g, t):
    b, h, d, s1, s2 = 2, 4, 8, 5, 3
    q = jnp.asarray(_randn(0, b, t, h, d))
    k1, k2 = jnp.asarray(_randn(1, b, s1, g, d)), jnp.asarray(_randn(2, b, s2, g, d))
    v1, v2 = jnp.asarray(_randn(3, b, s1, g, d)), jnp.asarray(_randn(4, b, s2, g, d))
    want, w_want = attention(q, [k1, k2], [v1, v2])
    got, w_got = attention(q, [k1.swapaxes(1, 2), k2], [v1.swapaxes(1, 2), v2],
                           heads_first=(True, False))
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(w_got), np.asarray(w_want), rtol=1e-6, atol=1e-7)
