"""Position schemes, declared once: how a token's position enters the model. A scheme does one of:

    embed       a vector added to the token's x before the first layer     learned, sinusoidal
    rotate      q and k turned by their positions inside the attention     rope
    score_bias  an additive bias on the scores, per head, from q_t - k_s   alibi

`relative`: the scores depend on position differences only, so a cache may roll past the context.
Every other module reads this table; a new scheme is one entry here.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from transformer.model import ops

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class PositionScheme:
    """embed(module, cfg, positions [B, T]) -> [B, T, D]; rotate(x [B, T, N, K], positions [B, T], cfg,
    theta=None: cfg.rope_theta) -> x turned; score_bias(cfg, q [B, T], k [B, S]) -> [B, H, T, S]; None where
    the scheme does not do it."""

    relative: bool
    embed: Callable | None = None
    rotate: Callable | None = None
    score_bias: Callable | None = None


def learned_embedding(module: nn.Module, cfg, positions: Array) -> Array:
    """P[positions] [B, T, D], P [max_seq_len, D] the parameter `pos_embed` of `module` (the decoder)."""
    table = module.param("pos_embed", nn.initializers.normal(0.01), (cfg.max_seq_len, cfg.d_model))
    return jnp.take(table, positions, axis=0, mode="clip").astype(cfg.dtype)


def sinusoidal_embedding(module: nn.Module, cfg, positions: Array) -> Array:
    """The fixed sines and cosines of Vaswani et al. 2017 at `positions` [B, T] -> [B, T, D]."""
    return ops.sinusoidal_positions(positions, cfg.d_model).astype(cfg.dtype)


def alibi_slopes(num_heads: int) -> np.ndarray:
    """ALiBi's head slopes m_h [H] (Press et al. 2022): for H a power of two the geometric sequence
    m_h = 2^(-8 (h + 1) / H); otherwise the slopes of the power of two below H, then every other
    slope of the one above, as many as are missing (the paper's interleaving)."""
    def geometric(n: int) -> list[float]:
        return [2.0 ** (-8.0 * (h + 1) / n) for h in range(n)]

    below = 2 ** math.floor(math.log2(num_heads))
    return np.array(geometric(below) + geometric(2 * below)[0::2][: num_heads - below], np.float32)


def alibi_bias(cfg, q_positions: Array, k_positions: Array) -> Array:
    """-m_h |pos_t - pos_s| [B, H, T, S] float32: each head penalises distance linearly, with its own
    slope; the causal mask hides the keys after the query (for them |.| keeps the bias <= 0)."""
    distance = jnp.abs(q_positions[:, :, None] - k_positions[:, None, :]).astype(jnp.float32)  # [B, T, S]
    return -jnp.asarray(alibi_slopes(cfg.num_heads))[:, None, None] * distance[:, None]  # [B, H, T, S]


SCHEMES = {
    "learned": PositionScheme(relative=False, embed=learned_embedding),
    "sinusoidal": PositionScheme(relative=False, embed=sinusoidal_embedding),
    "rope": PositionScheme(relative=True, rotate=lambda x, positions, cfg, theta=None: ops.rope(
        x, positions, cfg.rope_theta if theta is None else theta)),
    "none": PositionScheme(relative=True),
    "alibi": PositionScheme(relative=True, score_bias=alibi_bias),
}


def scheme(cfg) -> PositionScheme:
    return SCHEMES[cfg.position]
