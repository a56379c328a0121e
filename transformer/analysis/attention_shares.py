"""How much of each head's attention goes to the first token, the registers and the sink column."""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

from transformer.model.config import ModelConfig

Array = jax.Array


@flax.struct.dataclass  # a pytree: a jitted function may return it
class AttentionShares:
    """Mean share per layer and head [L, H] on the first token, the registers, the sink (zeros when off)."""

    first_token: Array
    registers: Array
    sink: Array


def shares_from_weights(cfg: ModelConfig, weights: Array) -> AttentionShares:
    """Shares of weights [L, B, H, T, R + S (+1)] (registers first, sink last), mean over b and rows t >= 1."""
    r = cfg.num_registers
    rows = weights[:, :, :, 1:]  # [L, B, H, T - 1, columns]: rows t >= 1
    mean = lambda x: x.mean(axis=(1, 3))  # noqa: E731  [L, B, H, T - 1] -> [L, H]
    zeros = jnp.zeros(weights.shape[0:1] + weights.shape[2:3], weights.dtype)  # [L, H]
    return AttentionShares(first_token=mean(rows[..., r]),
                           registers=mean(rows[..., :r].sum(-1)) if r else zeros,
                           sink=mean(rows[..., -1]) if cfg.attention_sink else zeros)
