"""Mixture of experts against dense at equal active parameters: the results of configs/sweeps/moe.py.

    python sweep.py --sweep configs/sweeps/moe.py --workdir runs/sweeps/moe --jobs 1   # the 10 runs
    python scripts/moe_experiment.py runs/sweeps/moe      # reads them, times both steps, writes docs/experiments/moe.json

Reads each run's metrics.jsonl: the validation loss at every evaluation (mean and spread over the seeds,
the paired difference MoE - dense per seed with its bootstrap interval and verdict), and the MoE runs'
expert load over training. Then times one training step of each model side by side in this process
(alternating blocks, median), since the sweep's runs were timed on a shared machine one after another.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import time

import jax
import numpy as np

from transformer.analysis.statistics import bootstrap_interval, paired_differences, verdict
from transformer.data.atomic_files import save_json
from transformer.model.config import ModelConfig
from transformer.model.decoder import count_params
from transformer.run.metrics import read_metrics
from transformer.training.optimizer import make_optimizer
from transformer.training.steps import TrainState, init_params, train_step

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VARIANTS = ("moe", "dense")


def runs(workdir: str) -> dict[str, dict[int, str]]:
    """{variant: {seed: its folder}}."""
    found: dict[str, dict[int, str]] = {v: {} for v in VARIANTS}
    for name in sorted(os.listdir(workdir)):
        m = re.fullmatch(r"(\w+)-seed(\d+)", name)
        if m and m[1] in found:
            found[m[1]][int(m[2])] = os.path.join(workdir, name)
    return found


def spread(values: list[float]) -> dict:
    return {"mean": float(np.mean(values)), "sd": float(np.std(values, ddof=1)), "min": float(np.min(values)),
            "max": float(np.max(values))}


def step_seconds(saved: dict, blocks: int = 7, steps: int = 20) -> dict[str, list[float]]:
    """Seconds per training step of each variant's model (saved: {variant: its config.json}) in each of
    `blocks` alternating blocks of `steps` steps on the same random batch, after compiling both."""
    timed = {}
    for variant, config in saved.items():
        cfg = ModelConfig.from_dict({**config["model"], "dtype": "float32", "attention_impl": "reference"})
        tx, _ = make_optimizer(config["optim"], config["train"]["steps"])
        params = init_params(cfg, jax.random.key(0))
        state = TrainState(step=np.int32(0), params=params, opt_state=tx.init(params),
                           rng=jax.random.key_data(jax.random.key(1)))
        b, t = config["train"]["batch_size"], config["train"]["seq_len"]
        x = np.random.default_rng(0).integers(0, cfg.vocab_size, (b, t)).astype(np.int32)
        step = jax.jit(train_step(cfg, tx, {}))
        state, _ = step(state, x, x)  # compile
        timed[variant] = [step, state, x, []]
    for _ in range(blocks):
        for variant, (step, state, x, seconds) in timed.items():
            start = time.perf_counter()
            for _ in range(steps):
                state, metrics = step(state, x, x)
            jax.block_until_ready(metrics)
            seconds.append((time.perf_counter() - start) / steps)
            timed[variant][1] = state
    return {variant: seconds for variant, (_, _, _, seconds) in timed.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("workdir", help="the sweep's folder (runs/sweeps/moe)")
    parser.add_argument("--out", default=os.path.join(ROOT, "docs", "experiments", "moe.json"))
    args = parser.parse_args()
    found = runs(args.workdir)
    seeds = sorted(set(found["moe"]) & set(found["dense"]))
    metrics = {v: [read_metrics(os.path.join(found[v][s], "metrics.jsonl")) for s in seeds] for v in VARIANTS}
    val = {v: [{r["step"]: r["val_loss"] for r in rows if "val_loss" in r} for rows in metrics[v]] for v in VARIANTS}
    saved = {v: json.load(open(os.path.join(found[v][seeds[0]], "config.json"))) for v in VARIANTS}
    steps = sorted(set.intersection(*(set(runs_) for v in VARIANTS for runs_ in val[v])))
    at_step = {}
    for step in steps:
        losses = {v: [run[step] for run in val[v]] for v in VARIANTS}
        diffs = paired_differences(losses["moe"], losses["dense"])
        low, high = bootstrap_interval(diffs)
        at_step[str(step)] = {**{v: spread(losses[v]) for v in VARIANTS},
                              "moe_minus_dense": {"mean": float(diffs.mean()), "low": low, "high": high,
                                                  "per_seed": diffs.tolist(), "verdict": verdict(diffs)}}
    cfgs = {v: ModelConfig.from_dict(saved[v]["model"]) for v in VARIANTS}
    params = {v: count_params(jax.eval_shape(init_params, cfgs[v], jax.random.key(0))) for v in VARIANTS}
    moe = cfgs["moe"]
    idle = moe.num_layers * (moe.num_experts - moe.experts_per_token) * 3 * moe.d_model * moe.mlp_dim
    load = {}  # per layer: the largest and smallest expert's share of the tokens at each logged step, over seeds
    for layer in range(moe.num_layers):
        rows = [[r for r in run if f"load/{layer}/0" in r] for run in metrics["moe"]]
        loads = np.array([[[r[f"load/{layer}/{e}"] for e in range(moe.num_experts)] for r in run] for run in rows])
        load[str(layer)] = {"steps": [r["step"] for r in rows[0]], "max_mean": loads.max(-1).mean(0).tolist(),
                            "min_mean": loads.min(-1).mean(0).tolist()}
    balance = np.array([[r["balance_loss"] for r in run if "balance_loss" in r] for run in metrics["moe"]])
    seconds = step_seconds(saved)
    ratios = np.array(seconds["moe"]) / np.array(seconds["dense"])  # block by block: the machine's load cancels
    final = at_step[str(steps[-1])]
    results = {
        "command": "python sweep.py --sweep configs/sweeps/moe.py --workdir runs/sweeps/moe --jobs 1; "
                   "python scripts/moe_experiment.py runs/sweeps/moe",
        "source": "the sweep's runs (metrics.jsonl, config.json in runs/sweeps/moe/<variant>-seed<s>) and this "
                  "script's side-by-side timing of one training step of each model",
        "seeds": len(seeds), "steps": steps[-1],
        "tokens_per_run": steps[-1] * saved["moe"]["train"]["batch_size"] * saved["moe"]["train"]["seq_len"],
        "experts": moe.num_experts, "experts_per_token": moe.experts_per_token, "expert_width": moe.mlp_dim,
        "dense_width": cfgs["dense"].mlp_dim, "params": params,
        "active_params": {"moe": params["moe"] - idle, "dense": params["dense"]},
        "chance_loss": math.log(moe.vocab_size),  # a uniform guess over the bytes
        "final": final, "at_step": at_step, "balanced_load": moe.experts_per_token / moe.num_experts,
        "load": load, "balance_loss": {"first": spread(balance[:, 0].tolist()), "last": spread(balance[:, -1].tolist()),
                                       "balanced": float(moe.experts_per_token)},
        "step_ms": {v: 1000 * float(np.median(s)) for v, s in seconds.items()},
        "step_time_ratio": float(np.median(ratios)), "step_time_ratio_range": [float(min(ratios)), float(max(ratios))],
        "dispatch": "dense einsum over all experts, weights zero for the unchosen",
    }
    save_json(args.out, results)
    print(f"final val loss: MoE {final['moe']['mean']:.4f} ± {final['moe']['sd']:.4f}, dense {final['dense']['mean']:.4f} "
          f"± {final['dense']['sd']:.4f}; MoE - dense {final['moe_minus_dense']['mean']:+.4f} "
          f"[{final['moe_minus_dense']['low']:+.4f}, {final['moe_minus_dense']['high']:+.4f}]: "
          f"{final['moe_minus_dense']['verdict']}; step {results['step_ms']['moe']:.1f} ms (MoE) against "
          f"{results['step_ms']['dense']:.1f} ms (dense); wrote {args.out}")


if __name__ == "__main__":
    main()
