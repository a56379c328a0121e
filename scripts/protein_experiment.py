"""Contacts from attention against the coevolution baselines: docs/experiments/proteins.json.

    python scripts/protein_experiment.py --workdir runs/proteins                 # 3 seeds of configs/proteins.py
    python scripts/protein_experiment.py --workdir runs/proteins --seeds 1 --steps 100   # a quick look

Draws the families of configs/proteins.py once, fits the baselines on each held-out family (APC-corrected
mutual information and a pseudo-likelihood Potts fit, on the family's held-out sequences and on all its
sequences), then trains one model per seed (RUN/seed_K) and reads contacts from its attention at every
checkpoint: every head's symmetrised, APC-corrected map averaged over a family's held-out sequences;
the best head (chosen on the training families) and a logistic regression over the heads (fitted on
them), both scored on the held-out families. Precision of the top L/5 and L pairs with |i - j| >= 6.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

from transformer.experiments import catalog
from transformer.experiments.proteins import contacts as cp
from transformer.experiments.proteins.families import FamilySpec, family
from transformer.experiments.proteins.fold import separation_mask
from transformer.run.checkpoint import Checkpointer, restore_for_inference
from transformer.run.config_files import load_config


def precisions(scores: np.ndarray, contacts: np.ndarray) -> dict[str, float]:
    length = len(contacts)
    return {"top_L5": cp.precision(scores, contacts, length // 5), "top_L": cp.precision(scores, contacts, length)}


def mean_over(per_family: list[dict[str, float]]) -> dict[str, float]:
    return {k: float(np.mean([p[k] for p in per_family])) for k in per_family[0]}


def baselines(spec: FamilySpec, held_out: list[int]) -> dict:
    """{method: {'per_family': [...], mean}}: MI and the Potts fit on held-out and on all sequences, chance."""
    out = {name: [] for name in ("mi_held_out", "mi_all", "plm_held_out", "plm_all", "chance")}
    for i in held_out:
        f = family(spec, i)
        test, every = f.sequences[-spec.held_out:].astype(int), f.sequences.astype(int)
        out["mi_held_out"].append(precisions(cp.apc(cp.mutual_information(test)), f.contacts))
        out["mi_all"].append(precisions(cp.apc(cp.mutual_information(every)), f.contacts))
        out["plm_held_out"].append(precisions(cp.apc(cp.pseudolikelihood_couplings(test)), f.contacts))
        out["plm_all"].append(precisions(cp.apc(cp.pseudolikelihood_couplings(every)), f.contacts))
        density = float(cp.pairs(f.contacts).mean())  # chance: a random ranking's expected precision
        out["chance"].append({"top_L5": density, "top_L": density})
        print(f"family {i} (L={len(f.contacts)}): {out['mi_held_out'][-1]} {out['plm_all'][-1]}", flush=True)
    return {name: {"per_family": values, **mean_over(values)} for name, values in out.items()}


def read_contacts(workdir: str, step: int, spec: FamilySpec) -> dict:
    """The best head's and the regression's precision on the held-out families at checkpoint `step`."""
    cfg, params, _ = restore_for_inference(workdir, step=step)
    scores = [cp.family_attention(params, cfg, family(spec, i).sequences[-spec.held_out:].astype(int))
              for i in range(spec.families)]
    truth = [family(spec, i).contacts for i in range(spec.families)]
    train, test = slice(0, spec.train_families), slice(spec.train_families, None)
    head = cp.best_head(scores[train], truth[train])
    model = cp.head_regression(scores[train], truth[train])
    return {"step": step, "best_head": head,
            "head": mean_over([precisions(s[head], c) for s, c in zip(scores[test], truth[test])]),
            "regression": mean_over([precisions(cp.regression_scores(model, s), c)
                                     for s, c in zip(scores[test], truth[test])])}


def spread(values: list[float]) -> dict[str, float]:
    return {"mean": float(np.mean(values)), "std": float(np.std(values, ddof=1)) if len(values) > 1 else 0.0,
            "values": [float(v) for v in values]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", required=True, help="runs go to WORKDIR/seed_K")
    parser.add_argument("--config", default="configs/proteins.py")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=0, help="train.steps, 4 checkpoints (0: the config's)")
    parser.add_argument("--out", default="docs/experiments/proteins.json")
    args = parser.parse_args()
    started = time.perf_counter()
    config = load_config(args.config)
    if args.steps:
        config.train.steps = args.steps
        config.train.checkpoint_every = config.train.eval_every = max(1, args.steps // 4)  # contacts read at each
    spec = FamilySpec.from_config(config.data.proteins)
    for i in range(spec.families):
        family(spec, i)
    generated = time.perf_counter() - started
    held_out = list(range(spec.train_families, spec.families))
    results = {"command": "python scripts/protein_experiment.py " + " ".join(
        f"--{k} {v}" for k, v in vars(args).items() if k != "out"),
        "source": "scripts/protein_experiment.py: every number from this run", "generation_s": generated,
        "lengths": [len(family(spec, i).contacts) for i in range(spec.families)],
        "contacts": [int(cp.pairs(family(spec, i).contacts).sum()) for i in range(spec.families)],
        "pairs": [int(cp.pairs(separation_mask(len(family(spec, i).contacts))).sum()) for i in range(spec.families)],
        "baselines": baselines(spec, held_out), "seeds": []}
    results["generation_s_per_family"] = generated / spec.families
    results["baselines_s"] = time.perf_counter() - started - generated
    for seed in range(args.seeds):
        config.train.seed = seed
        workdir = os.path.join(args.workdir, f"seed_{seed}")
        t = time.perf_counter()
        summary = catalog.train(config, workdir)
        train_s = time.perf_counter() - t
        steps = sorted(Checkpointer(workdir, read_only=True).all_steps())
        curve = [read_contacts(workdir, step, spec) for step in steps]
        results["seeds"].append({"seed": seed, "train_s": train_s, "val_loss": summary.get("val_loss"),
                                 "curve": curve})
        print(f"seed {seed}: {curve[-1]} ({train_s:.0f} s)", flush=True)
    for method in ("head", "regression"):
        for k in ("top_L5", "top_L"):
            results[f"{method}_{k}"] = spread([s["curve"][-1][method][k] for s in results["seeds"]])
            results[f"{method}_{k}_by_step"] = {str(c["step"]): spread([s["curve"][n][method][k] for s in results["seeds"]])
                                                for n, c in enumerate(results["seeds"][0]["curve"])}
    results["total_s"] = time.perf_counter() - started
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    print(json.dumps({k: v for k, v in results.items() if k.endswith(("_L5", "_L"))}, indent=1))


if __name__ == "__main__":
    main()
