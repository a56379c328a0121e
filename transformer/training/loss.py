"""The training objective: next-token cross-entropy of the decoder's logits, in float32 whatever the
model's dtype, over the targets that are not `batches.IGNORED` (the needle task grades only the
answer; a table model's training rows are IGNORED, its test rows graded by class).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

from transformer.data.batches import IGNORED
from transformer.model.config import ModelConfig
from transformer.model.decoder import Decoder

Array = jax.Array


def cross_entropy(logits: Array, targets: Array) -> Array:
    """logits [B, T, V], targets [B, T] -> the mean over the graded targets, float32 nats (0: none graded)."""
    graded = targets != IGNORED
    losses = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), jnp.where(graded, targets, 0))
    return jnp.sum(jnp.where(graded, losses, 0.0)) / jnp.maximum(jnp.sum(graded), 1)


def loss_fn(params: Any, cfg: ModelConfig, inputs: Array, targets: Array, dropout_key: Array | None) -> Array:
    """`cross_entropy` of the decoder's logits on inputs [B, T] (or a table's rows [B, T, F + 1]): float32 nats."""
    deterministic = dropout_key is None or cfg.dropout == 0.0
    rngs = None if deterministic else {"dropout": dropout_key}
    logits, _ = Decoder(cfg).apply({"params": params}, inputs, deterministic=deterministic, rngs=rngs)
    return cross_entropy(logits, targets)
