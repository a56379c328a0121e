"""Evaluation metrics as plug-ins of the training loop: measured on the first validation batch at
every evaluation, beside the validation loss, and written to the same metric row.

The module that defines a metric registers it; the loop asks which metrics a run's config enables
and knows none by name, so the training layer imports no analysis module:

    register_eval_metric(EvalMetric("attention_shares", enabled, compile))   # analysis/sinks.py
    register_eval_metric(EvalMetric("exact_match", enabled, compile))        # analysis/retrieval.py

`enabled(config)` says whether a run's config asks for the metric (e.g. train.eval_attention_shares).
`compile(cfg, mesh, state, rules, inputs)` returns a function (params, eval_set) -> {name: float},
compiled once at set-up like the train step (inputs [B, T]: the first validation batch, on the mesh;
eval_set: every validation batch, a list of (inputs, targets) on the mesh). `transformer`'s package import loads the analysis modules that register metrics.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

MetricFn = Callable[[Any, Any], dict[str, float]]  # (params, [(inputs, targets)]) -> metric row entries


@dataclass(frozen=True)
class EvalMetric:
    name: str
    enabled: Callable[[Any], bool]  # (the run's config) -> measure it?
    compile: Callable[..., MetricFn]  # (cfg, mesh, state, rules, inputs) -> the compiled measurement


_METRICS: dict[str, EvalMetric] = {}


def register_eval_metric(metric: EvalMetric) -> None:
    """Makes the loop measure `metric` in every run whose config enables it."""
    if metric.name in _METRICS and _METRICS[metric.name] != metric:
        raise ValueError(f"an evaluation metric named {metric.name!r} is already registered; choose another name")
    _METRICS[metric.name] = metric


def enabled_metrics(config: Any) -> list[EvalMetric]:
    """The registered metrics that `config` asks for, in registration order."""
    return [m for m in _METRICS.values() if m.enabled(config)]
