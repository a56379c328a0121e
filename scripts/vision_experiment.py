"""The ViT measurements of docs/experiments/vision.md: accuracy over seeds against pixel baselines, the
[CLS] token's attention on the object, and registers (Darcet et al. 2024) measured.

    python scripts/vision_experiment.py train --runs runs/vision      # 3 seeds x (shapes, shapes + 4 registers, digits)
    python scripts/vision_experiment.py measure --runs runs/vision    # -> docs/experiments/vision.json

`train` skips a run whose last checkpoint exists; `measure` reads the runs (transformer/experiments/vision/).
"""

from __future__ import annotations

import argparse
import json
import os
import time

from transformer.experiments.catalog import train
from transformer.run.config_files import load_config

SEEDS = (0, 1, 2)
RUNS = {"shapes": ("configs/vit.py", 0), "shapes_registers": ("configs/vit.py", 4), "digits": ("configs/vit_digits.py", 0)}


def run_dir(runs: str, name: str, seed: int) -> str:
    return os.path.join(runs, f"{name}_seed{seed}")


def train_all(runs: str) -> None:
    """Every run of RUNS for every seed, timed; a finished run is kept."""
    for seed in SEEDS:
        for name, (path, registers) in RUNS.items():
            config = load_config(path)
            config.train.seed, config.model.num_registers = seed, registers
            workdir = run_dir(runs, name, seed)
            if os.path.isdir(os.path.join(workdir, "checkpoints", str(config.train.steps))):
                continue
            started = time.perf_counter()
            train(config, workdir)
            print(f"{workdir}: {time.perf_counter() - started:.0f} s", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("phase", choices=("train", "measure"))
    parser.add_argument("--runs", default="runs/vision", help="the runs' parent folder")
    parser.add_argument("--out", default="docs/experiments/vision.json")
    args = parser.parse_args()
    if args.phase == "train":
        train_all(args.runs)
        return
    from transformer.experiments.vision import measures

    results = measures.everything({name: [run_dir(args.runs, name, s) for s in SEEDS] for name in RUNS})
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
        f.write("\n")
    print(json.dumps(results["summary"], indent=1))


if __name__ == "__main__":
    main()
