"""The training objective: next-token cross-entropy of the decoder's logits.

    loss = loss_fn(params, cfg, inputs [B, T], targets [B, T], dropout_key)   # float32 scalar, nats
    loss = cross_entropy(logits [B, T, V], targets [B, T])

targets[:, t] is the token that follows inputs[:, t]; the loss is the mean over the graded
positions of -log softmax(logits)[target], computed in float32 whatever the model's dtype. A target
of `batches.IGNORED` is not graded (the needle task grades only the answer); text windows grade all
B x T positions. A table model (ModelConfig.inputs='table') takes rows [B, T, F + 1] as its inputs
and gives class logits [B, T, C]: the same loss, its targets the test rows' classes, the training
rows' IGNORED (experiments/tables/table_rows.py).
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
    """Mean next-token cross-entropy in nats over the targets that are not IGNORED, in float32.
    logits [B, T, V], targets [B, T]. Zero when nothing is graded."""
    graded = targets != IGNORED
    losses = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), jnp.where(graded, targets, 0))
    return jnp.sum(jnp.where(graded, losses, 0.0)) / jnp.maximum(jnp.sum(graded), 1)


def loss_fn(params: Any, cfg: ModelConfig, inputs: Array, targets: Array, dropout_key: Array | None) -> Array:
    """The training objective: cross-entropy of the decoder's logits on [B, T] token windows (or a
    table's rows [B, T, F + 1])."""
    deterministic = dropout_key is None or cfg.dropout == 0.0
    rngs = None if deterministic else {"dropout": dropout_key}
    logits, _ = Decoder(cfg).apply({"params": params}, inputs, deterministic=deterministic, rngs=rngs)
    return cross_entropy(logits, targets)
