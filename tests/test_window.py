"""Tests of sliding-window attention (ModelConfig.attention_window, global_every): the band mask's
convention, a windowed model against attention restricted to the window by hand, the receptive field,
the ring-buffer cache of local layers (prefill longer than W, decoding past W, ragged rows), mixed local
and global stacks (scanned == unscanned), the cache's bounded size, and the config's errors.

W = 3 throughout, shorter than the prefill (7) and the sequence (12), so rings wrap in every test.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers.decoder import PREFILL, TOL, T, build, max_diff
from tests.helpers.marks import first_fast
from tests.test_model import check_cached_decoding_equals_forward
from transformer import ModelConfig, init_cache
from transformer.model import kv_cache, ops
from transformer.model.decoder import Decoder
from transformer.model.param_tree import unstack_layers

W = 3
# Every attention kind with learned, RoPE and no positions between them (MLA's RoPE needs its rotary width).
VARIANTS = [("mha", "learned"), ("gqa", "rope"), ("mqa", "none"), ("mla", "learned"), ("mla", "none"),
            ("mla_q_rope", "rope"), ("gqa", "learned"), ("mha", "rope")]
IDS = [f"{a}-{p}" for a, p in VARIANTS]


# ----------------------------------------------------------------------------- the band mask


def test_the_band_holds_the_query_and_the_w_minus_1_keys_before_it():
    """Hugging Face Mistral's convention (masking_utils.sliding_window_overlay: kv_idx > q_idx - W):
    the key W positions back is hidden, W - 1 back is visible."""
    positions = jnp.arange(8)[None]
    allowed = np.asarray(ops.causal_mask(positions, positions, window=W))[0, 0] == 0  # [T, S]
    q, p = np.arange(8)[:, None], np.arange(8)[None, :]
    np.testing.assert_array_equal(allowed, (p <= q) & (q - p < W))
    assert allowed[5, 5 - W + 1] and not allowed[5, 5 - W]
    assert allowed.sum(axis=1).max() == W
    # No window is the causal mask, bit for bit; a traced window (a scanned layer's) is the same band.
    np.testing.assert_array_equal(ops.causal_mask(positions, positions, window=None), ops.causal_mask(positions, positions))
    traced = jax.jit(lambda w: ops.causal_mask(positions, positions, window=w))(W)
    np.testing.assert_array_equal(traced, ops.causal_mask(positions, positions, window=W))


# ----------------------------------------------------------------------------- the forward pass


@pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
def test_a_windowed_layer_is_causal_attention_over_the_last_w_tokens(variant):
    """One layer: the logit at t equals the window-free model's (same weights) on tokens t-W+1..t
    alone, at their own positions; before t = W - 1 it equals the causal model's."""
    windowed = build(*variant, num_layers=1, attention_window=W)
    plain = build(*variant, num_layers=1)
    seq = windowed.tokens[:1]
    got = np.asarray(windowed.forward(windowed.params, seq))[0]  # [T, V]
    causal = np.asarray(plain.forward(windowed.params, seq))[0]
    np.testing.assert_allclose(got[: W - 1], causal[: W - 1], **TOL)
    starts = np.arange(T - W + 1)  # window of query t = start + W - 1
    pieces = np.stack([seq[0, s : s + W] for s in starts])  # [T - W + 1, W]
    positions = starts[:, None] + np.arange(W)[None]
    by_hand = np.asarray(plain.forward(windowed.params, pieces, positions))[:, -1]  # [T - W + 1, V]
    np.testing.assert_allclose(got[W - 1 :], by_hand, **TOL)
    assert max_diff(got[W:], causal[W:]) > 1e-3  # the window changed something


@pytest.mark.parametrize("variant", VARIANTS[:4], ids=IDS[:4])
def test_tokens_outside_the_receptive_field_have_no_influence(variant):
    """L = 2 local layers see L (W - 1) tokens back: changing token s leaves the logits at t >= s +
    2 (W - 1) + 1 exactly as they were, and changes those inside the window. With global_every=2
    the second layer is global: every later logit changes."""
    s = 2
    for extra, reach in ((dict(), s + 2 * (W - 1)), (dict(global_every=2, scan_layers=False), T - 1)):
        m = build(*variant, attention_window=W, **extra)
        seq = m.tokens[:1]
        changed = seq.copy()
        changed[0, s] = (changed[0, s] + 1) % m.cfg.vocab_size
        ref, out = np.asarray(m.forward(m.params, seq))[0], np.asarray(m.forward(m.params, changed))[0]
        np.testing.assert_array_equal(out[:s], ref[:s])
        np.testing.assert_array_equal(out[reach + 1 :], ref[reach + 1 :])
        for t in (s + W - 1, reach):
            assert max_diff(out[t], ref[t]) > 1e-4, f"{extra}: token {s} does not reach position {t}"


def test_a_scanned_stack_of_local_and_global_layers_is_the_unrolled_one():
    """global_every=2 under nn.scan passes each layer's window as a scanned input: the same function
    as the loop over layers_0 ... layers_3, whose layer windows are static."""
    scanned = build("gqa", "rope", num_layers=4, attention_window=W, global_every=2)
    assert scanned.cfg.layer_windows() == (W, None, W, None)
    loop = build("gqa", "rope", num_layers=4, attention_window=W, global_every=2, scan_layers=False)
    params = unstack_layers(scanned.params, 4)
    np.testing.assert_allclose(loop.forward(params, scanned.tokens), scanned.forward(scanned.params, scanned.tokens), **TOL)
    with pytest.raises(ValueError, match="unrolled"):
        scanned.step(scanned.params, scanned.tokens[:, :2], np.broadcast_to(np.arange(2), (2, 2)),
                     init_cache(scanned.cfg, 2, T))


# ----------------------------------------------------------------------------- the ring-buffer cache


def check_ragged_with_padding_at_pad_position(m):
    """Row 0 prefills 7 tokens, row 1 4 tokens and 3 padding tokens at PAD_POSITION; then both
    decode from their own positions: each row equals its own forward (a ring keeps row 1's last W
    tokens, not the padding)."""
    a, b = m.tokens
    ref_a = np.asarray(m.forward(m.params, a[None]))[0]
    ref_b = np.asarray(m.forward(m.params, b[None]))[0]
    n_b = 4
    prompt = np.stack([a[:PREFILL], np.concatenate([b[:n_b], np.zeros(PREFILL - n_b, np.int32)])])
    positions = np.stack([np.arange(PREFILL), np.where(np.arange(PREFILL) < n_b, np.arange(PREFILL), kv_cache.PAD_POSITION)])
    logits, cache = m.step(m.params, prompt, positions, init_cache(m.cfg, 2, T))
    np.testing.assert_allclose(logits[0], ref_a[:PREFILL], **TOL, err_msg="ragged: prefill row 0")
    np.testing.assert_allclose(logits[1, :n_b], ref_b[:n_b], **TOL, err_msg="ragged: prefill row 1")
    pos = np.array([PREFILL, n_b])
    for _ in range(T - PREFILL):
        tokens = np.array([[a[pos[0]]], [b[pos[1]]]], np.int32)
        logits, cache = m.step(m.params, tokens, pos[:, None], cache)
        np.testing.assert_allclose(logits[0, 0], ref_a[pos[0]], **TOL, err_msg=f"ragged: row 0 at {pos[0]}")
        np.testing.assert_allclose(logits[1, 0], ref_b[pos[1]], **TOL, err_msg=f"ragged: row 1 at {pos[1]}")
        pos = pos + 1


@pytest.mark.parametrize("variant", first_fast([(v,) for v in VARIANTS], IDS))  # each variant one tuple
def test_ring_buffer_decoding_equals_the_windowed_forward(variant):
    """Prefill 7 > W tokens, decode to 12 (the rings wrap), and a ragged batch: every logit is the
    cache-free windowed forward's. Local layers only (scanned, the rings stacked), then local and
    global layers (unrolled)."""
    for extra in (dict(), dict(global_every=2, scan_layers=False)):
        m = build(*variant, attention_window=W, **extra)
        cache = init_cache(m.cfg, 2, T)
        local = [w is not None for w in m.cfg.layer_windows()]
        assert [kv_cache.buffers(c).popitem()[1].shape[-2] == W for c in cache] == local  # W slots, or T
        check_cached_decoding_equals_forward(m)
        check_ragged_with_padding_at_pad_position(m)


def test_a_prefill_longer_than_the_ring_keeps_each_rows_last_w():
    """Slot p mod W holds position p for each row's last W real positions, recorded beside it;
    padding (PAD_POSITION) is written nowhere; empty slots record PAD_POSITION."""
    cfg = ModelConfig(vocab_size=8, max_seq_len=16, d_model=8, num_layers=1, num_heads=1, attention_window=W)
    cache = init_cache(cfg, 3, 16)
    np.testing.assert_array_equal(cache[0].positions, kv_cache.PAD_POSITION)
    positions = np.array([[0, 1, 2, 3, 4, 5, 6], [0, 1, 2, 3] + [kv_cache.PAD_POSITION] * 3,
                          [0] + [kv_cache.PAD_POSITION] * 6])
    values = jnp.asarray(positions % 1000, jnp.float32)[:, :, None, None] + 1.0  # [B, T, G=1, K=1]: position + 1
    new = (kv_cache.KVCache(k=jnp.broadcast_to(values, (3, 7, 1, 8)), v=jnp.broadcast_to(-values, (3, 7, 1, 8))),)
    out = kv_cache.write(cache, new, jnp.asarray(positions))
    recorded = np.asarray(out[0].positions)  # [B, W]
    np.testing.assert_array_equal(recorded, [[6, 4, 5], [3, 1, 2], [0, kv_cache.PAD_POSITION, kv_cache.PAD_POSITION]])
    k = np.asarray(out[0].k)[:, 0, :, 0]  # [B, W]
    np.testing.assert_array_equal(k, np.where(recorded < kv_cache.PAD_POSITION, recorded + 1.0, 0.0))
    np.testing.assert_array_equal(np.asarray(out[0].v)[:, 0, :, 0], -k)


def test_a_local_layers_cache_is_bounded():
    """Bytes per token up to W, then only the global layers grow: the local layers' part is constant."""
    cfg = ModelConfig(vocab_size=64, max_seq_len=64, d_model=32, num_layers=4, num_heads=4, num_kv_heads=2,
                      attention_window=8, global_every=2)
    per_layer = kv_cache.kv_cache_bytes_per_token(cfg) // 4  # 2 * G * K * 4 bytes = 128
    assert per_layer == 2 * 2 * 8 * 4
    assert kv_cache.kv_cache_bytes(cfg, 5) == 5 * 4 * per_layer
    assert kv_cache.kv_cache_bytes(cfg, 8) == 8 * 4 * per_layer
    assert kv_cache.kv_cache_bytes(cfg, 40) == 40 * 2 * per_layer + 8 * 2 * per_layer
    every = cfg.replace(global_every=0)
    assert kv_cache.kv_cache_bytes(every, 40) == kv_cache.kv_cache_bytes(every, 8) == 8 * 4 * per_layer
    # init_cache allocates exactly that for a cache of 40 slots: rings of W, full buffers of 40 (+ the records).
    cache = init_cache(cfg, 2, 40)
    records = sum(c.positions.nbytes for c in cache if c.positions is not None)
    assert kv_cache.measured_bytes(cache) - records == 2 * kv_cache.kv_cache_bytes(cfg, 40)
    assert kv_cache.max_len(cache) == 40 and kv_cache.max_len(init_cache(every, 1, 40)) == kv_cache.PAD_POSITION
    line = kv_cache.describe_cache_size(cfg)
    assert "512 bytes per token up to the window W=8" in line and "256 bytes per token (2 global layers)" in line
    assert "2,048 bytes for the 2 local layers" in line
    assert kv_cache.describe_cache_size(cfg.replace(attention_window=0, global_every=0)) == "512 bytes per token"


# ----------------------------------------------------------------------------- the config


@pytest.mark.parametrize("fields,message", [
    (dict(attention_window=-1), "attention_window must be an integer >= 0"),
    (dict(attention_window=True), "attention_window must be an integer >= 0"),
    (dict(global_every=2), "set attention_window=W > 0"),
    (dict(attention_window=4, global_every=1), "set attention_window=0 for full attention"),
    (dict(attention_window=4, num_registers=2), "use attention_sink=True"),
])
def test_window_config_errors_name_the_fix(fields, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig(vocab_size=8, max_seq_len=8, d_model=8, num_layers=2, num_heads=2, **fields)


def test_layer_windows_put_every_kth_layer_global():
    cfg = ModelConfig(vocab_size=8, max_seq_len=8, d_model=8, num_layers=6, num_heads=2, attention_window=4,
                      global_every=3)
    assert cfg.layer_windows() == (4, 4, None, 4, 4, None)
    assert cfg.replace(global_every=0).layer_windows() == (4,) * 6
    assert cfg.replace(attention_window=0, global_every=0).layer_windows() == (None,) * 6
    assert Decoder(cfg) is not None
