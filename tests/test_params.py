"""Parameter counts and dtypes, without allocating the parameters (jax.eval_shape)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from configs import gpt2
from transformer import Decoder, ModelConfig, count_params


def _shapes(cfg: ModelConfig):
    tokens = jax.ShapeDtypeStruct((1, 8), jnp.int32)
    return jax.eval_shape(Decoder(cfg).init, jax.random.key(0), tokens)["params"]


def test_gpt2_small_has_124_439_808_parameters():
    cfg = ModelConfig.from_dict(gpt2.get_config().model)
    assert count_params(_shapes(cfg)) == 124_439_808
    # The same count by hand: tied embeddings, learned positions, biases everywhere.
    v, s, d, f, n = 50257, 1024, 768, 3072, 12
    per_layer = (3 * d * d + 3 * d) + (d * d + d) + (d * f + f) + (f * d + d) + 2 * 2 * d
    assert v * d + s * d + n * per_layer + 2 * d == 124_439_808


def test_params_are_float32_with_bfloat16_compute():
    cfg = ModelConfig.from_dict(gpt2.get_config().model).replace(dtype="bfloat16")
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
