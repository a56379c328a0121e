"""A table's rows as the decoder's input (ModelConfig.inputs='table'): a TabPFN-style classifier.

TabPFN (Hollmann et al. 2023) reads a whole classification table in one forward pass: the training
rows with their labels and the test rows without, and gives each test row its class. In the
lecture's words: test row = query, training rows = keys, their labels = values, the soft dictionary
look-up. Here it is the same decoder with another input and another head:

    rows [B, T, F + 1]: row t's F features, then its label: a class id 0..C-1 for a training row,
                        UNLABELLED (-1) for a test row (or a padding row) the model must classify
    x_t = W_row [features_t, onehot(label_t)] + b       [B, T, D]   (a test row's one-hot is zero)
    mask: every row sees the training rows and itself    (`row_order`, in place of the causal mask)
    ... the decoder's blocks, final norm ...
    logits = W_head h                                   [B, T, C]   float32, for every row

No positions: a table's rows are a set (position='none'). Training rows see one another in full (a
causal mask would make a training row depend on which rows come before it); a test row sees the
training rows and itself, never another test row, so its class does not depend on which rows are
asked with it, and a large test set can be cut into any batches.
"""

from __future__ import annotations

import types

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from transformer.model import ops
from transformer.model.config import ModelConfig
from transformer.model.linear import Linear
from transformer.model.points import point

Array = jax.Array

UNLABELLED = -1  # the label column of a row whose class is asked (a test row) or of padding


def features_and_labels(rows: Array) -> tuple[Array, Array]:
    """rows [B, T, F + 1] -> (features [B, T, F], labels int32 [B, T]: a class id, or UNLABELLED)."""
    return rows[..., :-1], jnp.round(rows[..., -1]).astype(jnp.int32)


def training_rows(rows: Array) -> Array:
    """[B, T] bool: the rows that carry a label (the keys every row sees)."""
    return features_and_labels(rows)[1] >= 0


def row_order(rows: Array) -> Array:
    """[B, 1, T, T] additive: 0 where row t sees row s (s a training row, or s = t), else a large negative logit."""
    t = rows.shape[1]
    seen = training_rows(rows)[:, None, :] | jnp.eye(t, dtype=bool)[None]  # [B, T, S]
    return jnp.where(seen, 0.0, ops.mask_value())[:, None]


def example(cfg: ModelConfig, length: int = 1) -> Array:
    return jnp.zeros((1, length, cfg.row_width), jnp.float32)


def embed(module: nn.Module, cfg: ModelConfig, rows: Array, positions: Array | None, cache, deterministic: bool
          ) -> tuple[Array, Array, Array]:
    """rows [B, T, F + 1] -> (x [B, T, D] = W_row [features, onehot(label)] + b, positions 0..T-1, `row_order`)."""
    if cache is not None:
        raise ValueError("a table model reads a table in one forward pass, without a KV cache; pass cache=None")
    check_rows(cfg, rows)
    features, labels = features_and_labels(rows)
    onehot = jax.nn.one_hot(labels, cfg.num_classes, dtype=features.dtype)  # [B, T, C]; -1 -> zeros
    row = jnp.concatenate([features, onehot], axis=-1)  # [B, T, F + C]
    x = point(module, "token_embedding", Linear(cfg.d_model, use_bias=True, dtype=cfg.dtype, name="row_embed")(row))
    positions = jnp.broadcast_to(jnp.arange(rows.shape[1]), rows.shape[:2])  # [B, T]
    return nn.Dropout(cfg.dropout, deterministic=deterministic)(x), positions, row_order(rows)


def logits(module: nn.Module, cfg: ModelConfig, h: Array, rows: Array, positions: Array, cache) -> Array:
    """h [B, T, D] -> class logits [B, T, C] float32 (the class head `head` W [C, D], no bias)."""
    out = Linear(cfg.num_classes, use_bias=False, dtype=cfg.dtype, name="head")(h).astype(jnp.float32)
    return point(module, "logits", nn.with_logical_constraint(out, ("batch", "length", "vocab")))


def check_rows(cfg: ModelConfig, rows: Array) -> None:
    """Raises a clear error for rows that are not [B, T, F + 1] with labels in {-1, 0..C-1}, when known
    (under jit a label >= C has a zero one-hot and is still a training row)."""
    if rows.ndim != 3 or rows.shape[-1] != cfg.row_width:
        raise ValueError(f"a table model of num_features={cfg.num_features} reads rows [B, T, {cfg.row_width}] (the "
                         f"features, then the label), got an array of shape {tuple(rows.shape)}; build batches with "
                         "transformer.experiments.tables.table_rows (features zero-padded to num_features)")
    if isinstance(rows, jax.core.Tracer):
        return
    labels = np.round(np.asarray(rows)[..., -1]).astype(np.int64)
    bad = (labels < UNLABELLED) | (labels >= cfg.num_classes)
    if bad.any():
        b, t = np.argwhere(bad)[0]
        raise ValueError(f"row {t} of table {b} has the label {labels[b, t]}, outside 0..{cfg.num_classes - 1} "
                         f"(num_classes={cfg.num_classes}) and not {UNLABELLED} (a row to classify); relabel the "
                         "classes 0..C-1, or train a model with more classes")


ROWS = types.SimpleNamespace(example=example, embed=embed, logits=logits)  # an input kind (model/inputs.py)
