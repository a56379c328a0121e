"""The optimizer: AdamW with a warm-up + cosine learning-rate schedule and global-norm clipping.

    tx, schedule = make_optimizer(config.optim, steps)   # an optax transformation, step -> lr
    lr = schedule(step)                                   # float32 scalar

Weight decay applies to the projection matrices only (`decay_mask`: a pytree of bools shaped like
the params), not to norm gains, biases or (unless asked) embeddings.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import optax


def decay_mask(params: Any, decay_embeddings: bool = False) -> Any:
    """True for the weights AdamW decays: projection matrices (and embeddings if asked).

    Norm gains and biases are never decayed; matching by name, not by ndim, because scanned
    layers give every bias a leading layer axis.
    """

    def decays(path, _) -> bool:
        name = path[-1].key
        if name in ("embedding", "pos_embed"):
            return decay_embeddings
        return name in ("kernel", "k_up", "v_up")

    return jax.tree_util.tree_map_with_path(decays, params)


def make_schedule(optim: Mapping[str, Any], steps: int) -> optax.Schedule:
    """The learning rate at each step: linear warm-up from 0, cosine decay to min_lr_ratio x the peak
    over `optim.decay_steps` steps (0: all `steps`), then constant at that final rate.

    A run extended past its decay (train.steps raised, decay_steps kept) continues at the final rate.
    """
    decay_steps = optim.get("decay_steps", 0) or steps
    warmup = min(optim["warmup_steps"], max(decay_steps - 1, 0))
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=optim["learning_rate"],
        warmup_steps=warmup,
        decay_steps=max(decay_steps, warmup + 1),
        end_value=optim["learning_rate"] * optim["min_lr_ratio"],
    )


def make_optimizer(optim: Mapping[str, Any], steps: int) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """AdamW on `make_schedule`'s learning rate, with global-norm clipping and a weight-decay mask.

    optim: the config's `optim` fields (learning_rate, warmup_steps, decay_steps, min_lr_ratio, b1,
    b2, eps, weight_decay, decay_embeddings, grad_clip).
    """
    schedule = make_schedule(optim, steps)
    tx = optax.chain(
        optax.clip_by_global_norm(optim["grad_clip"]) if optim["grad_clip"] > 0 else optax.identity(),
        optax.adamw(
            schedule, b1=optim["b1"], b2=optim["b2"], eps=optim["eps"],
            weight_decay=optim["weight_decay"],
            mask=lambda p: decay_mask(p, optim["decay_embeddings"]),
        ),
    )
    return tx, schedule
