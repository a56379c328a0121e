"""The training objective: next-token cross-entropy of the decoder's logits, in float32 whatever the
model's dtype, over the targets that are not `batches.IGNORED` (the needle task grades only the
answer; a table model's training rows are IGNORED, its test rows graded by class). A mixture of experts
adds load_balance_coef x its balancing loss (model/moe.py) to the training objective, not to the eval loss.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

from transformer.data.batches import IGNORED
from transformer.model.config import ModelConfig
from transformer.model.decoder import Decoder
from transformer.model.moe import ROUTER_STATS, router_stats

Array = jax.Array


def cross_entropy(logits: Array, targets: Array) -> Array:
    """logits [B, T, V], targets [B, T] -> the mean over the graded targets, float32 nats (0: none graded)."""
    graded = targets != IGNORED
    losses = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), jnp.where(graded, targets, 0))
    return jnp.sum(jnp.where(graded, losses, 0.0)) / jnp.maximum(jnp.sum(graded), 1)


def forward(params: Any, cfg: ModelConfig, inputs: Array, dropout_key: Array | None) -> tuple[Array, dict]:
    """The decoder's logits [B, T, V] on inputs [B, T] (or a table's rows [B, T, F + 1]) and, with
    experts, the ROUTER_STATS it sows (else {})."""
    deterministic = dropout_key is None or cfg.dropout == 0.0
    rngs = None if deterministic else {"dropout": dropout_key}
    run = lambda **kw: Decoder(cfg).apply({"params": params}, inputs, deterministic=deterministic, rngs=rngs, **kw)  # noqa: E731
    if not cfg.num_experts:
        return run()[0], {}
    (logits, _), stats = run(mutable=[ROUTER_STATS])
    return logits, stats[ROUTER_STATS]


def loss_fn(params: Any, cfg: ModelConfig, inputs: Array, targets: Array, dropout_key: Array | None) -> Array:
    """`cross_entropy` of the decoder's logits on inputs [B, T] (or a table's rows [B, T, F + 1]): float32 nats."""
    return cross_entropy(forward(params, cfg, inputs, dropout_key)[0], targets)


def objective(params: Any, cfg: ModelConfig, inputs: Array, targets: Array,
              dropout_key: Array | None) -> tuple[Array, dict[str, Array]]:
    """(the training loss, its parts as metrics): `loss_fn`'s, plus with experts load_balance_coef x the
    balancing loss, with `balance_loss` and each layer's expert load `load/{l}/{e}` in the metrics."""
    logits, stats = forward(params, cfg, inputs, dropout_key)
    loss = cross_entropy(logits, targets)
    if not cfg.num_experts:
        return loss, {}
    load, balance = router_stats(stats, cfg.num_layers)  # [L, E], scalar
    metrics = {f"load/{l}/{e}": load[l, e] for l in range(load.shape[0]) for e in range(load.shape[1])}
    return loss + cfg.load_balance_coef * balance, {"balance_loss": balance, **metrics}
