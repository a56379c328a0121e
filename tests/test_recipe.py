"""Tests of the training-recipe options (docs/design.md, "Recipe options"): qk_norm, activation='relu2',
logit_softcap, zero_init_out and zero_init_head. Each changes the model as it claims; with all of them on,
cached decoding == the forward and the scanned stack == the Python loop. Their config errors are in
tests/test_config.py, the sharding of the qk-norm gains in tests/test_sharding.py, Hugging Face export in
tests/test_hf.py and generation in tests/test_sampling.py.
"""

from __future__ import annotations

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers.decoder import TOL, build, jit, max_diff, random_params
from tests.test_model import check_cached_decoding_equals_forward, check_causality, check_ragged_batch_equals_rows_alone
from transformer import ModelConfig, init_cache
from transformer.model import ops
from transformer.model.attention import Attention
from transformer.model.decoder import MLP, Decoder
from transformer.model.param_tree import unstack_layers
from transformer.training.steps import init_params

init = jit(init_params, static_argnums=0)  # (cfg, key) -> the random init; eager, the scan would take seconds

CAP = 2.0  # a cap the tiny models' logits (std-0.25 weights) exceed, so that it bends them
# Every option that changes the function, on the rope matrix entry (RMSNorm, no biases, untied head).
RECIPE = dict(qk_norm=True, logit_softcap=CAP)
SMALL = dict(vocab_size=64, max_seq_len=16, d_model=32, num_layers=2, num_heads=4)


def flat(params) -> dict[str, np.ndarray]:
    """{'layers/attn/q/kernel': array, ...} of a parameter tree."""
    return {"/".join(str(k.key) for k in path): np.asarray(x)
            for path, x in jax.tree_util.tree_leaves_with_path(params)}


# ----------------------------------------------------------------------------- relu2


def test_relu2_is_relu_squared_in_the_mlp():
    """MLP with activation='relu2': W_out relu(W_in x + b_in)^2 + b_out, by hand in NumPy."""
    cfg = ModelConfig(**SMALL, activation="relu2")
    mlp = MLP(cfg)
    x = np.random.default_rng(0).standard_normal((2, 5, cfg.d_model)).astype(np.float32)
    shapes = jax.eval_shape(mlp.init, jax.random.key(0), x)["params"]
    rng = np.random.default_rng(1)
    params = jax.tree.map(lambda s: rng.standard_normal(s.shape).astype(np.float32) * 0.3, shapes)
    h = x @ params["fc_in"]["kernel"].T + params["fc_in"]["bias"]
    assert (h < 0).any() and (h > 0).any()  # both sides of the kink are exercised
    expected = np.maximum(h, 0.0) ** 2 @ params["fc_out"]["kernel"].T + params["fc_out"]["bias"]
    np.testing.assert_allclose(mlp.apply({"params": params}, x), expected, rtol=1e-5, atol=1e-5)
    relu = MLP(cfg.replace(activation="relu")).apply({"params": params}, x)
    assert max_diff(relu, expected) > 1e-2  # relu2 is not relu


# ----------------------------------------------------------------------------- logit_softcap


def test_softcap_is_c_tanh_of_the_uncapped_logits():
    """The capped model's logits are c tanh(l / c) of the plain model's logits l with the same params,
    in float32, and bounded by c; the plain model's logits do go past c."""
    capped, plain = build("gqa", "rope", logit_softcap=CAP), build("gqa", "rope")
    logits, raw = capped.forward(plain.params, plain.tokens), plain.forward(plain.params, plain.tokens)
    assert float(np.abs(raw).max()) > 1.5 * CAP, "the test's logits should exceed the cap"
    assert logits.dtype == jnp.float32 and float(np.abs(logits).max()) <= CAP
    np.testing.assert_allclose(logits, CAP * np.tanh(np.asarray(raw, np.float64) / CAP), rtol=1e-5, atol=1e-5)


def test_ops_softcap_computes_in_float32_and_refuses_a_cap_of_zero():
    x = jnp.asarray([-1e4, -3.0, 0.0, 0.5, 1e4], jnp.bfloat16)
    y = ops.softcap(x, 15.0)
    assert y.dtype == jnp.float32
    np.testing.assert_allclose(y, 15.0 * np.tanh(np.asarray(x, np.float32) / 15.0), rtol=1e-6)
    with pytest.raises(ValueError, match="cap > 0"):
        ops.softcap(x, 0.0)


# ----------------------------------------------------------------------------- qk_norm


@pytest.mark.parametrize("attention", ["mha", "gqa", "mqa"])
def test_qk_norm_gives_each_head_of_q_and_k_rms_one_before_the_gain(attention):
    """The q_norm / k_norm outputs divided by their gains [K] have mean square 1 over K, per token and
    head; the gains are one per q and k, shared by the heads."""
    cfg = build(attention, "rope", **RECIPE).cfg
    layer = Attention(cfg)
    x = np.random.default_rng(0).standard_normal((2, 6, cfg.d_model)).astype(np.float32)
    positions = np.broadcast_to(np.arange(6), (2, 6))
    params = random_params(layer, inputs=(x, positions))
    _, state = layer.apply({"params": params}, x, positions, capture_intermediates=True)
    for name, heads in (("q_norm", cfg.num_heads), ("k_norm", cfg.num_kv_heads)):
        gain = np.asarray(params[name]["scale"])
        assert gain.shape == (cfg.head_dim,)
        (y,) = state["intermediates"][name]["__call__"]  # [B, T, heads, K]
        assert y.shape == (2, 6, heads, cfg.head_dim)
        np.testing.assert_allclose(np.mean((np.asarray(y) / gain) ** 2, axis=-1), 1.0, rtol=1e-4)


def test_qk_norm_makes_the_model_blind_to_the_scale_of_each_heads_q_and_k():
    """Scaling one key head's W_k (and one query head's W_q) leaves the qk-norm model's logits as they
    are, since each head is normalised on its own; the model without qk_norm (the same params but
    the gains) gives other logits, and scaling changes them. (A tiny norm_eps: eps is what would see
    the scale.)"""
    m, plain = build("gqa", "rope", norm_eps=1e-10, **RECIPE), build("gqa", "rope", norm_eps=1e-10, logit_softcap=CAP)
    scaled = flax.core.unfreeze(jax.tree.map(np.array, m.params))
    scaled["layers"]["attn"]["k"]["kernel"][:, 1] *= 5.0  # [L, G, K, D]: key head 1 of every layer
    scaled["layers"]["attn"]["q"]["kernel"][:, 0] *= 3.0  # [L, H, K, D]: query head 0
    ref = m.forward(m.params, m.tokens)
    np.testing.assert_allclose(m.forward(scaled, m.tokens), ref, **TOL)
    plain_ref = plain.forward(without_qk_norm(m.params), m.tokens)
    assert max_diff(plain_ref, ref) > 1e-3
    assert max_diff(plain.forward(without_qk_norm(scaled), m.tokens), plain_ref) > 1e-3


def without_qk_norm(params):
    """The qk-norm model's params without q_norm / k_norm: the tree of the model without qk_norm."""
    attn = {k: v for k, v in params["layers"]["attn"].items() if k not in ("q_norm", "k_norm")}
    return {**params, "layers": {**params["layers"], "attn": attn}}


def test_qk_norm_caches_normalised_keys():
    """With gains of one, every cached key (normalised, then rotated: a rotation keeps the length)
    has RMS 1 over K."""
    m = build("gqa", "rope", **RECIPE)
    params = flax.core.unfreeze(jax.tree.map(np.array, m.params))
    params["layers"]["attn"]["k_norm"]["scale"][:] = 1.0
    _, cache = m.step(params, m.tokens[:, :5], np.broadcast_to(np.arange(5), (2, 5)), init_cache(m.cfg, 2, 8))
    k = np.asarray(cache[0].k)[:, :, :5]  # layer 0, [B, G, S, K], the 5 written slots
    np.testing.assert_allclose(np.sqrt(np.mean(k**2, axis=-1)), 1.0, rtol=1e-4)


# ----------------------------------------------------------------------------- zero init


# Learned positions, RMSNorm and an untied head: the init fields change only how these parameters start.
ZERO_CFG = ModelConfig(**SMALL, position="learned", norm="rmsnorm", use_bias=False, tie_embeddings=False)


def test_zero_init_out_zeroes_w_o_and_fc_out_and_zero_init_head_the_head_and_nothing_else():
    """W_o and fc_out (or the head) start at zero; every other parameter is the default init's, draw
    for draw."""
    default = flat(init(ZERO_CFG, jax.random.key(0)))
    for field, zeroed in (("zero_init_out", ("o/kernel", "fc_out/kernel")), ("zero_init_head", ("head/kernel",))):
        started = flat(init(ZERO_CFG.replace(**{field: True}), jax.random.key(0)))
        assert set(started) == set(default)
        for name, x in started.items():
            if name.endswith(zeroed):
                assert not x.any() and default[name].any(), name
            else:
                np.testing.assert_array_equal(x, default[name], err_msg=f"{field}: {name}")


def test_zero_init_out_starts_as_the_embedding_only_model():
    """Every block starts as the identity: the initial logits are head(final_norm(embedding +
    position)), computed by hand; the default init's are not."""
    tokens = np.random.default_rng(0).integers(0, ZERO_CFG.vocab_size, (2, 8)).astype(np.int32)
    forward = jit(lambda p: Decoder(ZERO_CFG).apply({"params": p}, tokens)[0])  # the init fields do not apply
    p = init(ZERO_CFG.replace(zero_init_out=True), jax.random.key(0))
    x = np.asarray(p["embed"]["embedding"])[tokens] + np.asarray(p["pos_embed"])[:8]  # [B, T, D]
    expected = ops.rms_norm(jnp.asarray(x), p["final_norm"]["scale"], ZERO_CFG.norm_eps) @ p["head"]["kernel"].T
    np.testing.assert_allclose(forward(p), expected, rtol=1e-5, atol=1e-6)
    assert max_diff(forward(init(ZERO_CFG, jax.random.key(0))), expected) > 1e-4


# ----------------------------------------------------------------------------- all options together


@pytest.mark.parametrize("attention, activation, prenorm", [("gqa", "relu2", True), ("mqa", "swiglu", True),
                                                            ("mha", "relu2", False)])
def test_cached_decoding_equals_forward_with_every_option(attention, activation, prenorm):
    """RoPE, RMSNorm, no biases, untied head, qk_norm, relu2 or SwiGLU, a soft-cap: prefill + one-token
    decoding == the forward, a ragged batch == rows alone, causality (MHA post-norm)."""
    m = build(attention, "rope", prenorm, activation=activation, **RECIPE)
    check_causality(m)
    check_cached_decoding_equals_forward(m)
    check_ragged_batch_equals_rows_alone(m)


@pytest.mark.slow  # make test-all only (the default set's time: docs/performance.md)
def test_scanned_and_unscanned_stacks_agree_with_every_option():
    m = build("gqa", "rope", activation="relu2", **RECIPE)
    unscanned = build("gqa", "rope", activation="relu2", **RECIPE, scan_layers=False)
    params = unstack_layers(m.params, m.cfg.num_layers)
    assert set(params["layers_0"]["attn"]) >= {"q_norm", "k_norm"}
    np.testing.assert_allclose(unscanned.forward(params, m.tokens), m.forward(m.params, m.tokens), **TOL)
    check_cached_decoding_equals_forward(unscanned)

