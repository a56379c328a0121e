"""Attribution patching: every cell of a patching grid estimated at once, from one backward pass.

    heads = attribute_heads(params, cfg, clean, corrupted, metric)       # Patching, grid [L, H], as patch_heads
    where = attribute_positions(params, cfg, clean, corrupted, metric)   # Patching, grid [L, T], as patch_positions
    value, points, grads = gradients(params, cfg, tokens, metric, ["blocks.*.attn.z"])   # one jax.grad
    attribute(params, cfg, clean, corrupted, metric, "blocks.*.attn.k", axes=(0, 3), saturation=True)  # AtP*

Cell c's estimate of the patched metric is the first-order Taylor step from the corrupted run (Nanda
2023; Kramár et al. 2024): metric(corrupted) + sum over c of (a_clean - a_corrupted) * d metric / d a,
the gradient taken through an additive edit of zeros at the point (model/edits.py), whose gradient is
the point's. One forward pass on `clean`, one forward and backward pass on `corrupted`, one compile,
where `patching` runs a forward pass per cell. It is exact where the metric is linear in the point.

A saturated softmax breaks the linear step: a key that would win the softmax has gradient ~0 while it
loses. `saturation=True` at the queries or keys (attn.q, attn.k) is AtP*'s fix: each cell's change of
the attention weights is recomputed, softmax(scores + the cell's change of q k^T / sqrt(K)) - softmax(scores),
and only the step after the weights is linear: that change . d metric / d weights."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from transformer.analysis.capture import capture
from transformer.analysis.patching import Metric, Patching
from transformer.model import edits as edit
from transformer.model.config import ModelConfig

Array = jax.Array
SATURATION_POINTS = ("attn.q", "attn.k")  # the points AtP*'s softmax recomputation applies to


def gradients(params: Any, cfg: ModelConfig, tokens: Array, metric: Metric, names: Sequence[str],
              edits: Sequence[edit.Edit] = ()) -> tuple[Array, dict[str, Array], dict[str, Array]]:
    """metric(logits) of the model on `tokens` [B, T] with `edits`, and for each of `names` (any point, as
    `capture` names it: blocks.*.NAME stacked [L, ...]) its value and d metric / d value, same shape,
    from one `jax.grad` through an added edit of zeros at each point (after `edits`)."""
    names = list(dict.fromkeys(names))  # one edit per point: a second would double its gradient
    for name in names:
        edit.check_editable(cfg, name)
    shapes = jax.eval_shape(lambda p: capture(p, cfg, tokens, names, edits=edits)[2], params)

    def run(adds: dict[str, Array]) -> tuple[Array, dict[str, Array]]:
        zero_edits = [edit.at_layer(cfg, n, jnp.ones([1] * adds[n].ndim), adds[n]) for n in names]
        logits, _, got = capture(params, cfg, tokens, names, edits=[*edits, *zero_edits])
        return metric(logits), got

    zeros = {n: jnp.zeros(s.shape, s.dtype) for n, s in shapes.items()}
    (value, points), grads = jax.value_and_grad(run, has_aux=True)(zeros)
    return value, points, grads


def attribute(params: Any, cfg: ModelConfig, clean: Array, corrupted: Array, metric: Metric, name: str,
              axes: tuple[int, ...], edits: Sequence[edit.Edit] = (), saturation: bool = False) -> Patching:
    """The estimate of patching the point `name` from `clean` [B, T] into `corrupted` [B, T] one cell of
    its `axes` at a time (as patching.patch_point's cells): grid [*shape[axes]], clean and corrupted metrics.
    saturation: AtP*, the attention weights recomputed for each cell (`name` blocks.*.attn.q or .k)."""
    if clean.shape != corrupted.shape:
        raise ValueError(f"clean {tuple(clean.shape)} and corrupted {tuple(corrupted.shape)} differ in shape; "
                         "patching pairs need inputs of one shape (the same batch and number of tokens)")
    if saturation:
        _check_saturation(cfg, name)
    logits, _, got = capture(params, cfg, clean, [name], edits=edits)
    extra = [f"blocks.*.attn.{p}" for p in ("q", "k", "scores", "pattern")] if saturation else []
    value, points, grads = gradients(params, cfg, corrupted, metric, [name, *extra], edits)
    change = got[name] - points[name]  # a_clean - a_corrupted
    grid_shape = tuple(change.shape[a] for a in axes)
    if saturation:
        estimate = _recomputed_softmax(name, change, points, grads["blocks.*.attn.pattern"], axes)
    else:
        estimate = (change * grads[name]).sum(axis=tuple(a for a in range(change.ndim) if a not in axes))
    return Patching(value + estimate.reshape(grid_shape), metric(logits), value)


def attribute_heads(params: Any, cfg: ModelConfig, clean: Array, corrupted: Array, metric: Metric,
                    edits: Sequence[edit.Edit] = ()) -> Patching:
    """`patching.patch_heads` estimated: each head's z [L, B, T, H, Kv] patched at every position, grid [L, H]."""
    return attribute(params, cfg, clean, corrupted, metric, "blocks.*.attn.z", axes=(0, 3), edits=edits)


def attribute_positions(params: Any, cfg: ModelConfig, clean: Array, corrupted: Array, metric: Metric,
                        point: str = "resid_pre", edits: Sequence[edit.Edit] = ()) -> Patching:
    """`patching.patch_positions` estimated: layer l's [B, T, D] `point` patched at position t, grid [L, T]."""
    return attribute(params, cfg, clean, corrupted, metric, f"blocks.*.{point}", axes=(0, 2), edits=edits)


def _recomputed_softmax(name: str, change: Array, points: dict[str, Array], pattern_grad: Array,
                        axes: tuple[int, ...]) -> Array:
    """AtP*: for each cell of `axes`, sum (softmax(scores + the cell's change of the scores) - softmax(scores))
    * d metric / d weights, over all layers, rows and keys -> [N cells]. change: [L, B, T, H or G, K]."""
    q, k, scores = points["blocks.*.attn.q"], points["blocks.*.attn.k"], points["blocks.*.attn.scores"]
    repeat = lambda x: jnp.repeat(x, q.shape[3] // x.shape[3], axis=3)  # noqa: E731  [L, B, T, G, K] -> H heads
    scale = q.shape[-1] ** -0.5
    one_cell = [n if a in axes else 1 for a, n in enumerate(change.shape)]
    cells = jnp.eye(math.prod(change.shape[a] for a in axes)).reshape(-1, *one_cell)  # 1 at the patched cell
    before = jax.nn.softmax(scores, axis=-1)  # [L, B, H, T, S]

    def one(select: Array) -> Array:
        delta = change * select
        if name.endswith("attn.q"):  # the cell's queries move: rows t of head h
            moved = jnp.einsum("lbthk,lbshk->lbhts", delta, repeat(k))
        else:  # the cell's keys move: columns s of each head reading them
            moved = jnp.einsum("lbthk,lbshk->lbhts", q, repeat(delta))
        return ((jax.nn.softmax(scores + scale * moved, axis=-1) - before) * pattern_grad).sum()

    return jax.lax.map(one, cells)


def _check_saturation(cfg: ModelConfig, name: str) -> None:
    if not name.startswith("blocks.*.") or name.split(".", 2)[2] not in SATURATION_POINTS:
        raise ValueError(f"saturation=True recomputes the softmax for queries or keys; {name!r} is neither: use "
                         "blocks.*.attn.q or blocks.*.attn.k (or saturation=False for the linear estimate)")
    if cfg.attention == "mla" or cfg.attention_sink or cfg.num_registers:
        raise ValueError("saturation=True recomputes softmax(q k^T / sqrt(K) + mask) over this call's keys; models "
                         "with attention='mla', attention_sink or num_registers are not covered: use saturation=False")
