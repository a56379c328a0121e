"""Activation patching over grids: which head, or which (layer, position), carries what decides an answer.

    metric = logit_difference(correct, wrong)                # logits [B, T, V] -> a number
    heads = patch_heads(params, cfg, clean, corrupted, metric)          # Patching, grid [L, H]
    where = patch_positions(params, cfg, clean, corrupted, metric)      # Patching, grid [L, T]
    where.normalised()                                       # 0: the corrupted run, 1: the clean run

Each cell runs the corrupted input with one piece of the clean run's activations put in: a head's
output z at every position (Wang et al. 2022, "denoising"), or the residual stream entering a layer
at one position (Meng et al. 2022). The cells are edits (model/edits.py) stacked along a leading
axis and run with `jax.lax.map`: one compile for the whole grid, one forward pass in memory.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from transformer.analysis.capture import capture
from transformer.model import edits
from transformer.model.config import ModelConfig

Array = jax.Array
Metric = Callable[[Array], Array]  # logits [B, T, V] -> a scalar


@flax.struct.dataclass
class Patching:
    """grid: the metric with each cell patched; clean, corrupted: the metric of the two runs unpatched."""

    grid: Array
    clean: Array
    corrupted: Array

    def normalised(self) -> Array:
        """(grid - corrupted) / (clean - corrupted): 1 where a cell restores the clean metric, 0 where
        it changes nothing."""
        return (self.grid - self.corrupted) / (self.clean - self.corrupted)


def logit_difference(correct: Array, wrong: Array, position: int = -1) -> Metric:
    """The metric mean over rows b of logits[b, position, correct[b]] - logits[b, position, wrong[b]]
    (correct, wrong: [B] token ids)."""
    rows = jnp.arange(len(correct))

    def metric(logits: Array) -> Array:
        at = logits[:, position]  # [B, V]
        return (at[rows, correct] - at[rows, wrong]).mean()

    return metric


def patch_heads(params: Any, cfg: ModelConfig, clean: Array, corrupted: Array, metric: Metric) -> Patching:
    """The metric on `corrupted` [B, T] with head h of layer l patched from `clean` [B, T] (its z,
    at every position): grid [L, H]."""
    name = "blocks.*.attn.z"
    source = capture(params, cfg, clean, [name])[2][name]  # [L, B, T, H, Kv]
    cells = jnp.eye(cfg.num_layers * cfg.num_heads).reshape(-1, cfg.num_layers, 1, 1, cfg.num_heads, 1)
    grid = _run_cells(params, cfg, corrupted, metric, name, source, cells)
    return Patching(grid.reshape(cfg.num_layers, cfg.num_heads), *_baselines(params, cfg, clean, corrupted, metric))


def patch_positions(params: Any, cfg: ModelConfig, clean: Array, corrupted: Array, metric: Metric,
                    point: str = "resid_pre") -> Patching:
    """The metric on `corrupted` with layer l's `point` (a [B, T, D] point: resid_pre, resid_mid,
    attn.out, mlp.out, ...) at position t patched from `clean`: grid [L, T]."""
    name = f"blocks.*.{point}"
    source = capture(params, cfg, clean, [name])[2][name]  # [L, B, T, ...]
    l, t = cfg.num_layers, clean.shape[1]
    cells = jnp.eye(l * t).reshape(-1, l, 1, t, *[1] * (source.ndim - 3))
    grid = _run_cells(params, cfg, corrupted, metric, name, source, cells)
    return Patching(grid.reshape(l, t), *_baselines(params, cfg, clean, corrupted, metric))


def _run_cells(params: Any, cfg: ModelConfig, tokens: Array, metric: Metric, name: str, source: Array,
               cells: Array) -> Array:
    """The metric for each cell's selection [N, L, ...] (1: patched from `source`) -> [N]."""
    def one(select: Array) -> Array:
        logits, _ = edits.run(params, cfg, tokens, [edits.Edit(name, 1.0 - select, source * select)])
        return metric(logits)

    return jax.lax.map(one, cells)


def _baselines(params: Any, cfg: ModelConfig, clean: Array, corrupted: Array, metric: Metric) -> tuple[Array, Array]:
    """The metric of the clean and of the corrupted run."""
    return metric(edits.run(params, cfg, clean, [])[0]), metric(edits.run(params, cfg, corrupted, [])[0])
