"""A sweep's results: one row per run read back from its folder (metrics.jsonl, config.json,
checkpoints), a Markdown table (results.md) and the validation-loss curves (val_loss.png)."""

from __future__ import annotations

import json
import math
import os
import statistics
from typing import TYPE_CHECKING

import jax

from transformer.model.config import ModelConfig
from transformer.model.decoder import Decoder, count_params, example_input
from transformer.model.execution import resolve_auto
from transformer.model.kv_cache import kv_cache_bytes_per_token
from transformer.training.checkpoint import latest_step
from transformer.training.metrics import read_metrics

if TYPE_CHECKING:  # a sweep.Job; sweep.py imports this module
    from transformer.training.sweep import Job


def num_params(cfg: ModelConfig) -> int:
    """The model's parameter count, from shapes alone (jax.eval_shape: nothing is allocated)."""
    shapes = jax.eval_shape(lambda: Decoder(cfg).init(jax.random.key(0), example_input(cfg)))
    return count_params(shapes["params"])


def collect(job: Job, failure: str | None = None) -> dict:
    """One run's results from its folder: metrics.jsonl, config.json, checkpoints."""
    saved = os.path.join(job.workdir, "config.json")
    if os.path.isfile(saved):
        with open(saved) as f:
            cfg = ModelConfig.from_dict(json.load(f)["model"])
    else:  # never started
        cfg = resolve_auto(ModelConfig.from_dict(job.config.model)).cfg  # 'auto': as train.py would choose
    metrics = os.path.join(job.workdir, "metrics.jsonl")
    rows = read_metrics(metrics) if os.path.isfile(metrics) else []
    evals = {r["step"]: r for r in rows if "val_loss" in r}  # a resumed run's repeated steps: the last
    step, steps = latest_step(job.workdir), job.config.train.steps
    status = (f"failed: {failure[:150]}".replace("|", "/") if failure else "done" if step == steps
              else f"at step {step or 0} of {steps}")
    return dict(
        name=job.name, changes=job.changes, params=num_params(cfg), kv_bytes=kv_cache_bytes_per_token(cfg),
        val_loss={s: evals[s]["val_loss"] for s in sorted(evals)},
        final=evals[max(evals)] if evals else None, best=min(evals.values(), key=lambda r: r["val_loss"], default=None),
        tokens_per_sec=statistics.median([r["tokens_per_sec"] for r in rows if "tokens_per_sec" in r] or [math.nan]),
        wall_seconds=sum(r["wall_seconds"] for r in rows if "wall_seconds" in r), status=status,
    )


def table(results: list[dict], title: str) -> str:
    """The results as Markdown: one row per run, parameters relative to the first row."""
    lines = [
        f"# {title}", "",
        "Validation loss in nats per token on the fixed validation batches (final: at the last step; best: "
        "the lowest evaluation); bits per byte at the last step; parameters relative to the first row; "
        "tokens/s the median over the logged windows; wall time of the sweep's train() calls, set-up and "
        "compiling included.", "",
        "| run | changes from the base | parameters | KV cache (bytes/token) | val loss (final) | "
        "val loss (best, step) | bits/byte | tokens/s | wall time | status |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|---|",
    ]
    first = results[0]["params"]
    for r in results:
        changes = ", ".join(f"`{k}={v!r}`" for k, v in r["changes"].items()) or "(the base)"
        params = f"{r['params']:,}" + (f" ({100 * (r['params'] / first - 1):+.1f}%)" if r is not results[0] else "")
        final, best = r["final"], r["best"]
        lines.append(" | ".join([
            f"| {r['name']}", changes, params, f"{r['kv_bytes']:,}",
            f"{final['val_loss']:.4f}" if final else "-",
            f"{best['val_loss']:.4f} ({best['step']})" if best else "-",
            f"{final['val_bits_per_byte']:.3f}" if final else "-",
            f"{r['tokens_per_sec']:,.0f}" if math.isfinite(r["tokens_per_sec"]) else "-",
            duration(r["wall_seconds"]), r["status"] + " |",
        ]))
    return "\n".join(lines) + "\n"


def duration(seconds: float) -> str:
    return "-" if not seconds else f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def plot(results: list[dict], path: str, title: str) -> None:
    """Validation loss against step, one line per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5), dpi=100)
    colors = plt.get_cmap("tab20").colors[::2] + plt.get_cmap("tab20").colors[1::2]  # 10 strong, then pale
    for i, r in enumerate(results):
        steps = list(r["val_loss"])
        ax.plot(steps, [r["val_loss"][s] for s in steps], "o-", ms=3, lw=1.2, color=colors[i % 20], label=r["name"])
    ax.set_xlabel("step")
    ax.set_ylabel("validation loss (nats per token)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
