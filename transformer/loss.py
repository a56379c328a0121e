"""The training objective: next-token cross-entropy of the decoder's logits.

    loss = loss_fn(params, cfg, inputs [B, T], targets [B, T], dropout_key)   # float32 scalar, nats
    loss = cross_entropy(logits [B, T, V], targets [B, T])

targets[:, t] is the token that follows inputs[:, t]; the loss is the mean over all B x T positions
of -log softmax(logits)[target], computed in float32 whatever the model's dtype.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

from transformer.config import ModelConfig
from transformer.model import Decoder

Array = jax.Array


def cross_entropy(logits: Array, targets: Array) -> Array:
    """Mean next-token cross-entropy in nats, in float32. logits [B, T, V], targets [B, T]."""
    return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), targets).mean()


def loss_fn(params: Any, cfg: ModelConfig, inputs: Array, targets: Array, dropout_key: Array | None) -> Array:
    """The training objective: cross-entropy of the decoder's logits on [B, T] token windows."""
    deterministic = dropout_key is None or cfg.dropout == 0.0
    rngs = None if deterministic else {"dropout": dropout_key}
    logits, _ = Decoder(cfg).apply({"params": params}, inputs, deterministic=deterministic, rngs=rngs)
    return cross_entropy(logits, targets)
