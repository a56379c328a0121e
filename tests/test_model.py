"""Tests of the decoder (transformer/model/decoder.py) on tiny configs, and its parameter counts.

Every attention variant (MHA, GQA, MQA, MLA with a query latent and RoPE, MLA without RoPE) runs
with every position scheme it allows, each variant at least once post-norm, through four
properties: causality, (relative or absolute) position dependence, cached decoding == the
cache-free forward, and a ragged batch == each row alone. Parameters are drawn at a larger scale
than the initialiser's (std 0.25 instead of 0.02), so attention is far from uniform and a wrong mask
or a wrong cache slot changes the logits (tests/helpers/decoder.py builds the models). The attention layers' own properties (grouping,
absorbed MLA, attention weights, head masks) are in tests/test_attention.py.
"""

from __future__ import annotations

import functools

import chex
import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import gpt2
from tests.helpers import reference
from tests.helpers.decoder import BASE, POSITION, PREFILL, TOL, T, build, jit, make_cfg, max_diff, random_params
from transformer import ModelConfig, count_params, init_cache
from transformer.model.execution import resolve_auto
from transformer.model.decoder import Decoder
from transformer.model.inputs import check_positions
from transformer.model.param_tree import unstack_layers
from transformer.model.positions import scheme

POSTNORM = {"mha": "learned", "gqa": "rope", "mqa": "none", "mla": "sinusoidal"}
VARIANTS = (
    [(a, p, p != POSTNORM[a]) for a in ("mha", "gqa", "mqa") for p in POSITION]
    + [("mla", p, p != POSTNORM["mla"]) for p in ("learned", "sinusoidal", "none", "alibi")]
    + [("mla_q_rope", "rope", True), ("mla_q_rope", "rope", False)]
)
VARIANT_IDS = [f"{a}-{p}-{'pre' if pre else 'post'}" for a, p, pre in VARIANTS]


# ----------------------------------------------------------------------------- the variant matrix


@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
def test_variant(variant):
    """Causality, positions, cached decoding == forward, ragged batch == rows alone, for one variant.

    One test per variant, so that each variant's three programs (forward, prefill, decode step)
    compile once, in one worker.
    """
    m = build(*variant)
    check_causality(m)
    check_position_dependence(m)
    check_cached_decoding_equals_forward(m)
    check_ragged_batch_equals_rows_alone(m)


def check_causality(m):
    seq = m.tokens[:1]
    ref = np.asarray(m.forward(m.params, seq))
    chex.assert_shape(ref, (1, T, m.cfg.vocab_size))
    chex.assert_tree_all_finite(ref)
    for t in (0, 5, T - 1):
        changed = seq.copy()
        changed[0, t] = (changed[0, t] + 1) % m.cfg.vocab_size
        out = np.asarray(m.forward(m.params, changed))
        np.testing.assert_allclose(out[:, :t], ref[:, :t], rtol=0, atol=1e-6,
                                   err_msg=f"causality: changing token {t} changed an earlier logit")
        assert max_diff(out[:, t], ref[:, t]) > 1e-3, f"token {t} does not affect its own logits"
        if t < T - 1:
            assert max_diff(out[:, t + 1 :], ref[:, t + 1 :]) > 1e-4, f"later tokens do not see token {t}"


def check_position_dependence(m):
    """RoPE (only relative positions) and no positions are invariant to shifting all positions;
    learned and sinusoidal (absolute) positions are not."""
    seq = m.tokens[:1]
    ref = np.asarray(m.forward(m.params, seq))
    shifted = np.asarray(m.forward(m.params, seq, np.arange(T)[None] + 3))
    if scheme(m.cfg).relative:
        np.testing.assert_allclose(shifted, ref, **TOL, err_msg=f"{m.cfg.position}: shifting positions changed logits")
    else:
        assert max_diff(shifted, ref) > 1e-3, f"{m.cfg.position}: the logits ignore absolute positions"


def check_cached_decoding_equals_forward(m):
    """Prefill 7 tokens through the cache, then decode one token at a time to 12."""
    refs = [np.asarray(m.forward(m.params, m.tokens[i : i + 1]))[0] for i in range(2)]
    cache = init_cache(m.cfg, 2, T)
    positions = np.broadcast_to(np.arange(PREFILL), (2, PREFILL))
    logits, cache = m.step(m.params, m.tokens[:, :PREFILL], positions, cache)
    for i in range(2):
        np.testing.assert_allclose(logits[i], refs[i][:PREFILL], **TOL, err_msg=f"cached decoding: prefill row {i}")
    for t in range(PREFILL, T):
        logits, cache = m.step(m.params, m.tokens[:, t : t + 1], np.full((2, 1), t), cache)
        chex.assert_shape(logits, (2, 1, m.cfg.vocab_size))
        for i in range(2):
            np.testing.assert_allclose(logits[i, 0], refs[i][t], **TOL, err_msg=f"cached decoding: decode t={t} row {i}")


def check_ragged_batch_equals_rows_alone(m):
    """Row 0 prefills 7 tokens, row 1 prefills 4 tokens and 3 padding tokens; then both decode
    from their own positions ([[7], [4]], [[8], [5]], ...): each row equals its own forward."""
    a, b = m.tokens
    ref_a = np.asarray(m.forward(m.params, a[None]))[0]
    ref_b = np.asarray(m.forward(m.params, b[None]))[0]
    n_b = 4
    pad = np.full(PREFILL - n_b, m.cfg.vocab_size - 1, np.int32)
    prompt = np.stack([a[:PREFILL], np.concatenate([b[:n_b], pad])])
    cache = init_cache(m.cfg, 2, T)
    logits, cache = m.step(m.params, prompt, np.broadcast_to(np.arange(PREFILL), (2, PREFILL)), cache)
    np.testing.assert_allclose(logits[0], ref_a[:PREFILL], **TOL, err_msg="ragged: prefill row 0")
    np.testing.assert_allclose(logits[1, :n_b], ref_b[:n_b], **TOL, err_msg="ragged: prefill row 1")
    pos = np.array([PREFILL, n_b])
    for _ in range(T - PREFILL):
        tokens = np.array([[a[pos[0]]], [b[pos[1]]]], np.int32)
        logits, cache = m.step(m.params, tokens, pos[:, None], cache)
        np.testing.assert_allclose(logits[0, 0], ref_a[pos[0]], **TOL, err_msg=f"ragged: row 0 at {pos[0]}")
        np.testing.assert_allclose(logits[1, 0], ref_b[pos[1]], **TOL, err_msg=f"ragged: row 1 at {pos[1]}")
        pos = pos + 1


# ----------------------------------------------------------------------------- equivalences


def test_scanned_and_unscanned_stacks_compute_the_same_function():
    """The same weights in either layout (tests/test_param_tree.py tests the conversion)."""
    m = build("mla_q_rope", "rope")
    unscanned = Decoder(m.cfg.replace(scan_layers=False))
    p_un = unstack_layers(m.params, m.cfg.num_layers)
    step_un = jit(lambda p, tokens, positions, cache: unscanned.apply({"params": p}, tokens, positions, cache))
    np.testing.assert_allclose(step_un(p_un, m.tokens, None, None)[0], m.forward(m.params, m.tokens), **TOL)
    positions = np.broadcast_to(np.arange(PREFILL), (2, PREFILL))
    out_s, cache_s = m.step(m.params, m.tokens[:, :PREFILL], positions, init_cache(m.cfg, 2, T))
    out_u, cache_u = step_un(p_un, m.tokens[:, :PREFILL], positions, init_cache(m.cfg, 2, T))
    np.testing.assert_allclose(out_u, out_s, **TOL)
    chex.assert_trees_all_close(cache_u, cache_s, rtol=1e-5, atol=1e-5)


@pytest.mark.slow  # make test-all only (the default set's time: docs/performance.md)
def test_jit_and_eager_agree():
    """An eager (op-by-op) cached prefill equals the jitted one (default compiler options):
    logits and the written cache."""
    m = build("gqa", "rope")
    step = jax.jit(lambda p, tokens, positions, cache: m.model.apply({"params": p}, tokens, positions, cache))
    positions = np.broadcast_to(np.arange(PREFILL), (2, PREFILL))
    eager, cache_e = m.model.apply({"params": m.params}, m.tokens[:, :PREFILL], positions, init_cache(m.cfg, 2, T))
    jitted, cache_j = step(m.params, m.tokens[:, :PREFILL], positions, init_cache(m.cfg, 2, T))
    np.testing.assert_allclose(eager, jitted, **TOL)
    chex.assert_trees_all_close(cache_e, cache_j, rtol=1e-5, atol=1e-5)
    k = np.stack([np.asarray(c.k) for c in cache_e])  # [L, B, G, S, K]
    assert np.any(k[..., :PREFILL, :] != 0) and np.all(k[..., PREFILL:, :] == 0)
    # And the fast-compiling jit the other tests use computes the same.
    np.testing.assert_allclose(m.step(m.params, m.tokens[:, :PREFILL], positions, init_cache(m.cfg, 2, T))[0],
                               jitted, **TOL)


# ----------------------------------------------------------------------------- errors and overflow


def test_positions_past_cache_or_context_raise_eagerly():
    m = build("gqa", "learned")
    apply = lambda *args: m.model.apply({"params": m.params}, *args)  # noqa: E731
    cache = init_cache(m.cfg, 1, 8)
    tok = m.tokens[:1, :1]
    check_positions(m.cfg, np.array([[7]]), cache)  # the last slot is fine
    check_positions(m.cfg, np.array([[m.cfg.max_seq_len - 1]]), None)  # so is the last position
    with pytest.raises(ValueError, match="cache"):
        apply(tok, np.array([[8]]), cache)
    with pytest.raises(ValueError, match="cache"):
        apply(m.tokens[:1, :3], np.array([[6, 7, 8]]), cache)
    with pytest.raises(ValueError, match="max_seq_len"):
        apply(np.zeros((1, m.cfg.max_seq_len + 1), np.int32))
    with pytest.raises(ValueError, match="max_seq_len"):
        apply(tok, np.array([[m.cfg.max_seq_len]]))


def test_cache_overflow_under_jit_gives_nan_logits_for_that_row():
    m = build("gqa", "learned")
    cache = init_cache(m.cfg, 2, 8)
    logits, new = m.step(m.params, m.tokens[:, :1], np.array([[3], [8]]), cache)
    assert np.all(np.isnan(logits[1])), "the row that wrote past the cache must be NaN"
    assert np.all(np.isfinite(logits[0]))
    k = np.stack([np.asarray(c.k) for c in new])  # [L, B, G, S, K]
    assert np.any(k[:, 0, :, 3] != 0) and np.all(k[:, 1] == 0)  # row 1's write was dropped


# Out-of-range inputs under jit: a row's logits are NaN from its first out-of-range token on, and
# everything before it and every other row is bitwise what the same program computes without it.
GUARDED = {  # scanned and unscanned stacks, GQA and MLA (naive and, with a cache, absorbed)
    "gqa-scanned": ("gqa", "rope", True, dict(scan_layers=True)),
    "gqa-unscanned": ("gqa", "learned", True, dict(scan_layers=False)),
    "mla-scanned": ("mla", "learned", True, dict(scan_layers=True)),
    "mla_q_rope-unscanned": ("mla_q_rope", "rope", False, dict(scan_layers=False)),
}
BAD_AT = 3  # row 1's bad token sits at this index


def with_bad_token(tokens: np.ndarray, bad_id: int) -> np.ndarray:
    """A copy of tokens [2, T'] with row 1's token at index BAD_AT replaced by bad_id."""
    tokens = tokens.copy()
    tokens[1, BAD_AT] = bad_id
    return tokens


def assert_nan_from(logits, clean, row: int, start: int) -> None:
    """logits [B, T, V]: row `row` is NaN from index `start` on and bitwise equal to `clean` before
    it; the other rows are bitwise equal to `clean` (which is finite)."""
    logits, clean = np.asarray(logits), np.asarray(clean)
    chex.assert_tree_all_finite(clean)
    assert np.isnan(logits[row, start:]).all(), f"row {row} is not NaN from index {start} on"
    np.testing.assert_array_equal(logits[row, :start], clean[row, :start], err_msg="earlier positions changed")
    others = np.arange(len(logits)) != row
    np.testing.assert_array_equal(logits[others], clean[others], err_msg="another row changed")


@pytest.mark.parametrize("bad_id", [BASE["vocab_size"], 10**6, -1])
def test_out_of_vocabulary_ids_raise_eagerly_naming_id_place_and_vocabulary(bad_id):
    m = build("gqa", "rope")
    message = rf"token id {bad_id} at row 1, position {BAD_AT} is outside .*vocab_size={BASE['vocab_size']}"
    with pytest.raises(ValueError, match=message):
        m.model.apply({"params": m.params}, with_bad_token(m.tokens, bad_id))
    with pytest.raises(ValueError, match=message):  # the same check with a cache
        m.model.apply({"params": m.params}, with_bad_token(m.tokens, bad_id),
                      np.broadcast_to(np.arange(T), (2, T)), init_cache(m.cfg, 2, T))


@pytest.mark.parametrize("variant", GUARDED.values(), ids=GUARDED.keys())
def test_out_of_vocabulary_ids_under_jit_give_nan_from_that_token_on(variant):
    """Without a cache, a prefill with one, and a decode step: the bad id's row is NaN from it on,
    everything else unchanged, and nothing non-finite enters the cache."""
    attention, position, prenorm, extra = variant
    m = build(attention, position, prenorm, **extra)
    clean = m.forward(m.params, m.tokens)
    prompt = m.tokens[:, :PREFILL]
    positions = np.broadcast_to(np.arange(PREFILL), (2, PREFILL))
    clean_prefill, cache = m.step(m.params, prompt, positions, init_cache(m.cfg, 2, T))
    clean_step, _ = m.step(m.params, m.tokens[:, PREFILL:PREFILL + 1], np.full((2, 1), PREFILL), cache)
    for bad_id in (m.cfg.vocab_size, -1):
        assert_nan_from(m.forward(m.params, with_bad_token(m.tokens, bad_id)), clean, row=1, start=BAD_AT)
        logits, bad_cache = m.step(m.params, with_bad_token(prompt, bad_id), positions, init_cache(m.cfg, 2, T))
        assert_nan_from(logits, clean_prefill, row=1, start=BAD_AT)
        chex.assert_tree_all_finite(bad_cache)
        step_tokens = np.array([[m.tokens[0, PREFILL]], [bad_id]], np.int32)
        logits, _ = m.step(m.params, step_tokens, np.full((2, 1), PREFILL), cache)
        assert_nan_from(logits, clean_step, row=1, start=0)


@pytest.mark.parametrize("scan_layers", [True, False], ids=["scanned", "unscanned"])
def test_positions_past_the_context_under_jit_give_nan_from_there_on(scan_layers):
    """Row 1 at positions 8..19 with max_seq_len 16: NaN from index 8 (position 16) on. RoPE has no
    position table, so the same weights with a 32-token context give the values to compare with."""
    m = build("gqa", "rope", scan_layers=scan_layers)
    longer = build("gqa", "rope", scan_layers=scan_layers, max_seq_len=32)
    positions = np.stack([np.arange(T), np.arange(T) + 8])
    start = m.cfg.max_seq_len - 8
    assert_nan_from(m.forward(m.params, m.tokens, positions), longer.forward(m.params, m.tokens, positions),
                    row=1, start=start)


def test_cache_overflow_under_jit_gives_nan_from_the_first_position_past_the_cache():
    """A prefill of 7 tokens into 12 slots, row 1 at positions 8..14: NaN from position 12 on; its
    earlier positions equal the same tokens with room in the cache (prefill of 7 into 16 slots)."""
    m = build("gqa", "rope")
    tokens = m.tokens[:, :PREFILL]
    positions = np.stack([np.arange(PREFILL), np.arange(PREFILL) + 8])
    room = np.stack([np.arange(PREFILL), np.arange(PREFILL) + 5])  # row 1 at 5..11 fits
    logits, _ = m.step(m.params, tokens, positions, init_cache(m.cfg, 2, T))
    clean, _ = m.step(m.params, tokens, room, init_cache(m.cfg, 2, T))
    start = T - 8
    assert np.isnan(np.asarray(logits[1, start:])).all()
    np.testing.assert_array_equal(logits[0], clean[0])
    roomy, _ = m.step(m.params, tokens, positions, init_cache(m.cfg, 2, m.cfg.max_seq_len))
    np.testing.assert_allclose(logits[1, :start], roomy[1, :start], **TOL)


# ----------------------------------------------------------------------------- dropout, dtype, remat


def test_dropout_needs_and_uses_a_dropout_rng():
    m = build("gqa", "learned", dropout=0.3)
    run = jit(lambda p, tokens, key: m.model.apply(
        {"params": p}, tokens, deterministic=False, rngs={"dropout": key})[0])
    det = np.asarray(m.forward(m.params, m.tokens))
    plain = build("gqa", "learned")
    chex.assert_trees_all_equal(plain.params, m.params)
    np.testing.assert_allclose(det, plain.forward(m.params, m.tokens), rtol=0, atol=1e-6)
    with pytest.raises(flax.errors.InvalidRngError, match="dropout"):
        m.model.apply({"params": m.params}, m.tokens, deterministic=False)
    a1 = np.asarray(run(m.params, m.tokens, jax.random.key(1)))
    a2 = np.asarray(run(m.params, m.tokens, jax.random.key(1)))
    b = np.asarray(run(m.params, m.tokens, jax.random.key(2)))
    np.testing.assert_array_equal(a1, a2)
    assert max_diff(a1, det) > 1e-3 and max_diff(a1, b) > 1e-3
    chex.assert_tree_all_finite(a1)


def test_bfloat16_compute_keeps_float32_params():
    """bfloat16 compute: float32 parameters, float32 logits within reference.BFLOAT16_TOL of the
    independent float32 reference decoder's (tests/helpers/reference.py: no model code, so a broken
    mask or scale fails it, as tests/test_attention_impl.py shows), and a bfloat16 cache."""
    cfg = make_cfg("gqa", "rope", dtype="bfloat16")
    model = Decoder(cfg)
    tokens = build("gqa", "rope").tokens
    params = jax.eval_shape(model.init, jax.random.key(0), tokens)["params"]
    assert {x.dtype for x in jax.tree.leaves(params)} == {jnp.dtype(jnp.float32)}
    params = random_params(model)
    step = jit(lambda p, tokens, positions, cache: model.apply({"params": p}, tokens, positions, cache))
    logits = step(params, tokens, None, None)[0]
    assert logits.dtype == jnp.float32
    want = jit(reference.logits, static_argnums=0)(cfg, params, tokens)  # float32, no model code
    reference.assert_close(logits, want, reference.BFLOAT16_TOL)
    cache = init_cache(cfg, 2, T)
    assert {c.k.dtype for c in cache} == {jnp.dtype(jnp.bfloat16)}
    out, cache = step(params, tokens[:, :1], np.full((2, 1), 3), cache)
    chex.assert_tree_all_finite(out)
    assert {c.k.dtype for c in cache} == {jnp.dtype(jnp.bfloat16)}


def _loss(model, params, tokens):
    logits = model.apply({"params": params}, tokens[:, :-1])[0]
    logp = jax.nn.log_softmax(logits)
    return -jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1).mean()


def test_remat_gives_same_loss_and_gradients():
    plain = Decoder(make_cfg("gqa", "rope"))
    remat = Decoder(make_cfg("gqa", "rope", remat=True))
    params = random_params(plain)
    chex.assert_trees_all_equal_shapes_and_dtypes(params, random_params(remat))
    tokens = jnp.asarray(build("gqa", "rope").tokens)
    loss_p, grad_p = jit(jax.value_and_grad(functools.partial(_loss, plain)))(params, tokens)
    loss_r, grad_r = jit(jax.value_and_grad(functools.partial(_loss, remat)))(params, tokens)
    np.testing.assert_allclose(loss_r, loss_p, rtol=1e-6)
    chex.assert_trees_all_close(grad_r, grad_p, rtol=1e-5, atol=1e-6)
    assert all(float(jnp.abs(g).max()) > 0 for g in jax.tree.leaves(grad_p)), "a parameter gets no gradient"


# ----------------------------------------------------------------------------- parameter counts
# (formerly tests/test_params.py): counts and dtypes without allocating the parameters (jax.eval_shape).


def _shapes(cfg: ModelConfig):
    tokens = jax.ShapeDtypeStruct((1, 8), jnp.int32)
    return jax.eval_shape(Decoder(cfg).init, jax.random.key(0), tokens)["params"]


def test_gpt2_small_has_124_439_808_parameters():
    cfg = resolve_auto(ModelConfig.from_dict(gpt2.get_config().model), "cpu").cfg
    assert count_params(_shapes(cfg)) == 124_439_808
    # The same count by hand: tied embeddings, learned positions, biases everywhere.
    v, s, d, f, n = 50257, 1024, 768, 3072, 12
    per_layer = (3 * d * d + 3 * d) + (d * d + d) + (d * f + f) + (f * d + d) + 2 * 2 * d
    assert v * d + s * d + n * per_layer + 2 * d == 124_439_808


def test_params_are_float32_with_bfloat16_compute():
    cfg = ModelConfig.from_dict(gpt2.get_config().model).replace(dtype="bfloat16", attention_impl="reference")
    leaves = jax.tree.leaves(_shapes(cfg))
    assert leaves and all(x.dtype == jnp.float32 for x in leaves)


def test_tiny_mla_and_gqa_counts_by_hand():
    base = dict(vocab_size=64, max_seq_len=16, d_model=32, num_layers=2, num_heads=4, use_bias=False,
                norm="rmsnorm", norm_bias=False, tie_embeddings=False, position="rope", mlp_dim=64)
    v, d, f, L, H, K = 64, 32, 64, 2, 4, 8
    gqa = ModelConfig(**base, num_kv_heads=2)
    attn = d * H * K + 2 * d * 2 * K + H * K * d  # q, k, v (G = 2), o
    per_layer = attn + 2 * d * f + 2 * d  # gelu MLP (in, out), two norm gains
    assert count_params(_shapes(gqa)) == 2 * v * d + L * per_layer + d  # embed + head, final norm

    mla = ModelConfig(**base, attention="mla", kv_latent_dim=12, q_latent_dim=16, rope_head_dim=4, v_head_dim=6)
    C, Q, R, Kv = 12, 16, 4, 6
    #      q_down  q_norm  q_up               kv_down        kv_norm  k_up        v_up         o
    attn = d * Q + Q + Q * H * (K + R) + d * (C + R) + C + C * H * K + C * H * Kv + H * Kv * d
    per_layer = attn + 2 * d * f + 2 * d
    assert count_params(_shapes(mla)) == 2 * v * d + L * per_layer + d
