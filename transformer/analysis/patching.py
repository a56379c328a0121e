"""Activation patching over grids: which head, or which (layer, position), carries what decides an answer.

    metric = logit_difference(correct, wrong)                # logits [B, T, V] -> a number
    heads = patch_heads(params, cfg, clean, corrupted, metric)          # Patching, grid [L, H]
    where = patch_positions(params, cfg, clean, corrupted, metric)      # Patching, grid [L, T]
    where.normalised()                                       # 0: the corrupted run, 1: the clean run
    patch_point(params, cfg, clean, corrupted, metric, "blocks.*.attn.q", axes=(0, 2, 3))  # any point, any cells
    ablation_losses(params, cfg, tokens)                     # [L, H]: the loss change, each head off
Each cell runs the corrupted input with one piece of the clean run put in (Wang et al. 2022)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from transformer.analysis.capture import capture, loss
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
        """(grid - corrupted) / (clean - corrupted): 1 where a cell restores the clean metric."""
        return (self.grid - self.corrupted) / (self.clean - self.corrupted)


def ablation_losses(params: Any, cfg: ModelConfig, tokens: Array) -> Array:
    """[L, H]: the change of `loss` (nats) with each head switched off alone (`ablate_heads`), one compile."""
    off = 1.0 - jnp.eye(cfg.num_layers * cfg.num_heads).reshape(-1, cfg.num_layers, cfg.num_heads)  # [L*H, L, H]
    grid = jax.lax.map(lambda mask: loss(params, cfg, tokens, [edits.ablate_heads(cfg, mask)]), off)
    return grid.reshape(cfg.num_layers, cfg.num_heads) - loss(params, cfg, tokens)


def logit_difference(correct: Array, wrong: Array, position: int = -1) -> Metric:
    """The metric mean_b logits[b, position, correct[b]] - logits[b, position, wrong[b]] (correct, wrong: [B])."""
    rows = jnp.arange(len(correct))

    def metric(logits: Array) -> Array:
        at = logits[:, position]  # [B, V]
        return (at[rows, correct] - at[rows, wrong]).mean()

    return metric


def patch_heads(params: Any, cfg: ModelConfig, clean: Array, corrupted: Array, metric: Metric) -> Patching:
    """The metric on `corrupted` [B, T] with head (l, h)'s z patched from `clean` [B, T]: grid [L, H]."""
    return patch_point(params, cfg, clean, corrupted, metric, "blocks.*.attn.z", axes=(0, 3))  # z: [L, B, T, H, Kv]


def patch_positions(params: Any, cfg: ModelConfig, clean: Array, corrupted: Array, metric: Metric,
                    point: str = "resid_pre") -> Patching:
    """The metric with layer l's [B, T, D] `point` (resid_pre, attn.out, ...) at t from `clean`: grid [L, T]."""
    return patch_point(params, cfg, clean, corrupted, metric, f"blocks.*.{point}", axes=(0, 2))  # [L, B, T, ...]


def run_cells(params: Any, cfg: ModelConfig, tokens: Array, cells: Array,
              cell_edits: Callable[[Array], Sequence[edits.Edit]], read: Callable[[Array], Array]) -> Array:
    """read(logits) with cell_edits(cells[n]) for cells [N, ...] -> [N, ...]: `jax.lax.map`, one compile."""
    return jax.lax.map(lambda cell: read(edits.run(params, cfg, tokens, list(cell_edits(cell)))[0]), cells)


def patch_point(params: Any, cfg: ModelConfig, clean: Array, corrupted: Array, metric: Metric, name: str,
           axes: tuple[int, ...]) -> Patching:
    """Patches the point `name` (any point, e.g. "blocks.*.attn.q") from `clean` into `corrupted`, one cell
    of its `axes` at a time: grid [*shape[axes]] (patch_heads and patch_positions are two of these)."""
    source = capture(params, cfg, clean, [name])[2][name]
    grid_shape = tuple(source.shape[a] for a in axes)
    one_cell = [n if a in axes else 1 for a, n in enumerate(source.shape)]
    cells = jnp.eye(math.prod(grid_shape)).reshape(-1, *one_cell)  # [N, *one_cell]: 1 at the patched cell
    grid = run_cells(params, cfg, corrupted, cells, lambda select: [edits.Edit(name, 1.0 - select, source * select)],
                     metric)
    baseline = lambda tokens: metric(edits.run(params, cfg, tokens, [])[0])  # noqa: E731
    return Patching(grid.reshape(grid_shape), baseline(clean), baseline(corrupted))
