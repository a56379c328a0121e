"""Position schemes, declared once: how a token's position enters the model, and what follows from it.

A scheme does one of three things (or nothing):

    embed       a vector added to the token's x before the first layer     learned, sinusoidal
    rotate      q and k turned by their positions inside the attention     rope
    score_bias  an additive bias on the scores, per head, from q_t - k_s   alibi

`relative`: the scores depend on positions only through their differences, so shifting every position
changes nothing and a cache may roll past the context (kv_cache.init_rolling_cache). Every other
module reads this table (ModelConfig's choices, the key view, the decoder, the named points); a new
scheme is one entry here.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer.model import ops

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class PositionScheme:
    """relative: scores depend on q_t - k_s only. embed(module, cfg, positions [B, T]) -> [B, T, D];
    rotate(x [B, T, N, K], positions [B, T], cfg) -> x turned; score_bias(cfg, q [B, T], k [B, S]) ->
    [B, H, T, S]. None where the scheme does not do it."""

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


def rotary(x: Array, positions: Array, cfg) -> Array:
    """RoPE: x [B, T, N, K] with each pair of features turned by position * frequency."""
    return ops.rope(x, positions, cfg.rope_theta)


SCHEMES = {
    "learned": PositionScheme(relative=False, embed=learned_embedding),
    "sinusoidal": PositionScheme(relative=False, embed=sinusoidal_embedding),
    "rope": PositionScheme(relative=True, rotate=rotary),
    "none": PositionScheme(relative=True),
}


def scheme(cfg) -> PositionScheme:
    """The position scheme of a ModelConfig (its `position` field)."""
    return SCHEMES[cfg.position]
