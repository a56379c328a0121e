"""Evaluation metrics, measured beside the validation loss and written to its row; the loop takes
them as arguments (experiments/catalog.py chooses them). A metric is two plain functions:
`measure(cfg, inputs)` -> (params, inputs [B, T], targets [B, T]) -> {name: array}, compiled once
(`inputs`: the first validation batch, for a metric that draws its own data from it), and
`report(cfg, measures)`, the validation batches' measures (all, or the first) -> the row's floats.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from transformer.model.config import ModelConfig
from transformer.training.sharding import Rules, batch_sharding, sharded_jit, state_sharding

Measure = Callable[[Any, jax.Array, jax.Array], dict[str, jax.Array]]  # (params, inputs, targets) -> arrays
MetricFn = Callable[[Any, list], dict[str, float]]  # (params, [(inputs, targets)]) -> the row's entries


@dataclass(frozen=True)
class EvalMetric:
    name: str
    measure: Callable[[ModelConfig, jax.Array], Measure]  # (cfg, first validation inputs) -> the measure
    report: Callable[[ModelConfig, list[dict]], dict[str, float]]  # (cfg, one measure per batch) -> row entries
    first_batch: bool = False  # measured on the first validation batch alone


def compile_metric(metric: EvalMetric, cfg: ModelConfig, mesh: Mesh, state: Any, rules: Rules, inputs: jax.Array,
                   targets: jax.Array | None = None) -> MetricFn:
    """The metric compiled for the validation batches' shape: (params, eval_set) -> its row entries;
    targets: a batch's, when their shape is not the inputs' [B, T] (an image's [B, 1])."""
    data = batch_sharding(mesh, rules)
    targets = jax.ShapeDtypeStruct(inputs.shape[:2] if targets is None else targets.shape, jnp.int32)
    measure = sharded_jit(metric.measure(cfg, inputs), mesh, rules, (state_sharding(state.params, mesh, rules), data, data)
                          ).lower(state.params, inputs, targets).compile()

    def measured(params: Any, eval_set: list) -> dict[str, float]:
        batches = eval_set[:1] if metric.first_batch else eval_set
        return metric.report(cfg, [measure(params, x, y) for x, y in batches])

    return measured
