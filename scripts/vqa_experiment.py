"""Image question answering with cross-attention: configs/vqa.py over seeds, against the text-only chance line.

    python scripts/vqa_experiment.py --runs runs/vqa --seeds 0 1 2    # trains runs/vqa/seed{s} (or reuses
                                                                      # them), writes docs/experiments/vqa.json

Per seed: the training run (`catalog.train`, as train.py runs it; its wall time), then on held-out pictures
(seeds TEST_SEED + i, none of training's or validation's) the exact match of greedily decoded answers
(the sampler: prefill with the picture, then cached steps), overall and per kind of question; the text-only
chance line (each question answered by its majority answer over the run's first CHANCE_STEPS training
batches); the share of the answer bytes' cross-attention on the asked object's patches per layer and
head against its area share. The spread over seeds, and the paired accuracy - chance with its bootstrap
interval and verdict (analysis/statistics.py). The figure: seed 0's maps, docs/figures/vqa_cross_attention.png.
"""

from __future__ import annotations

import argparse
import os
import time

import jax
import numpy as np

from transformer.analysis.statistics import bootstrap_interval, paired_differences, verdict
from transformer.data.atomic_files import save_json
from transformer.experiments import catalog
from transformer.experiments.vqa import questions
from transformer.experiments.vqa.answers import answer_attention, answer_span, exact_match, object_shares, plot_answer_maps
from transformer.run.checkpoint import latest_step, restore_for_inference
from transformer.run.config_files import load_config_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEST_SEED, TEST_BATCHES, BATCH, CHANCE_STEPS = 20_000, 8, 64, 200


def spread(values: list[float]) -> dict:
    return {"mean": float(np.mean(values)), "sd": float(np.std(values, ddof=1)), "min": float(np.min(values)),
            "max": float(np.max(values))}


def trained(runs: str, seed: int, config_file: str, overrides: dict) -> tuple[str, float | None]:
    """The run of `seed` (trained here unless its last checkpoint exists) and its training seconds (None: reused)."""
    workdir = os.path.join(runs, f"seed{seed}")
    config = load_config_file(config_file)
    config.train.seed = seed
    for name, value in overrides.items():
        config.train[name] = value
    if os.path.isdir(workdir) and latest_step(workdir) == config.train.steps:
        return workdir, None
    start = time.perf_counter()
    catalog.train(config, workdir)
    return workdir, time.perf_counter() - start


def measure(workdir: str, seed: int, seq_len: int, batch_size: int) -> tuple[dict, tuple]:
    """One run's numbers on the test pictures, and (weights, graded, drawn) of the first batch for the figure."""
    cfg, params, _ = restore_for_inference(workdir)
    match = jax.jit(exact_match, static_argnums=1)
    attend = jax.jit(answer_attention, static_argnums=1)
    right, asked, shares, chances, first = [], [], [], [], None
    for i in range(TEST_BATCHES):
        drawn = questions.draw(BATCH, [TEST_SEED + i])
        inputs, targets = questions.encode(drawn, seq_len)
        right.append(np.asarray(match(params, cfg, inputs, targets)))
        asked.append(np.array([questions.QUESTIONS[q][0] for q in drawn["question"]]))
        weights, graded = np.asarray(attend(params, cfg, inputs, targets)), np.asarray(answer_span(targets)[2])
        found = object_shares(weights, graded, drawn, cfg.encoder)
        shares.append(found["share"]), chances.append(found["chance"])
        first = first or (weights, graded, drawn)
    right, asked = np.concatenate(right), np.concatenate(asked)
    train = [questions.draw(batch_size, [seed, step, 0]) for step in range(CHANCE_STEPS)]  # the run's own draws
    test = [questions.draw(BATCH, [TEST_SEED + i]) for i in range(TEST_BATCHES)]
    join = lambda draws: {k: np.concatenate([d[k] for d in draws]) for k in ("question", "answer")}  # noqa: E731
    share = np.mean(shares, axis=0)  # [L, H]
    return {"accuracy": float(right.mean()), "chance": questions.chance_accuracy(join(train), join(test)),
            "accuracy_by_kind": {kind: float(right[asked == kind].mean()) for kind in ("colour", "position", "shape")},
            "object_share": share.tolist(), "object_share_per_layer": share.mean(axis=1).tolist(),
            "object_share_best_head": float(share.max()), "area_share": float(np.mean(chances))}, first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", default="runs/vqa", help="the runs' folder: one seed{s} per seed")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--config", default=os.path.join(ROOT, "configs", "vqa.py"))
    parser.add_argument("--steps", type=int, default=0, help="train.steps (0: the config's)")
    parser.add_argument("--out", default=os.path.join(ROOT, "docs", "experiments", "vqa.json"))
    parser.add_argument("--figure", default=os.path.join(ROOT, "docs", "figures", "vqa_cross_attention.png"))
    args = parser.parse_args()
    config = load_config_file(args.config)
    overrides = {"steps": args.steps} if args.steps else {}
    seeds, figure = {}, None
    for seed in args.seeds:
        workdir, seconds = trained(args.runs, seed, args.config, overrides)
        seeds[seed], first = measure(workdir, seed, config.train.seq_len, config.train.batch_size)
        seeds[seed]["train_seconds"] = seconds
        figure = figure or first
        print(f"seed {seed}: {seeds[seed]}", flush=True)
    accuracy, chance = (np.array([seeds[s][k] for s in args.seeds]) for k in ("accuracy", "chance"))
    share, area = (np.array([seeds[s][k] for s in args.seeds]) for k in ("object_share_best_head", "area_share"))
    layer_share = np.array([seeds[s]["object_share_per_layer"] for s in args.seeds])  # [seeds, L]
    above = paired_differences(accuracy, chance)
    results = {
        "command": "python scripts/vqa_experiment.py --runs runs/vqa --seeds " + " ".join(map(str, args.seeds)),
        "source": "the runs trained here from configs/vqa.py (runs/vqa/seed<s>, the latest checkpoint), measured on "
                  "held-out pictures drawn from seeds TEST_SEED + i",
        "steps": args.steps or config.train.steps, "test_pictures": TEST_BATCHES * BATCH, "seeds": seeds,
        "accuracy": spread(list(accuracy)), "chance": spread(list(chance)),
        "above_chance": {**spread(list(above)), "interval": bootstrap_interval(above),
                         "verdict": verdict(above, lower_is_better=False)},
        "area_share": spread(list(area)), "object_share_best_head": spread(list(share)),
        "object_share_per_layer": [spread(list(layer_share[:, l])) for l in range(layer_share.shape[1])],
        "train_seconds": [seeds[s]["train_seconds"] for s in args.seeds],
    }
    for l in range(layer_share.shape[1]):  # each layer's share against the area share, paired by seed
        d = paired_differences(layer_share[:, l], area)
        results["object_share_per_layer"][l].update(above_area=spread(list(d)), interval=bootstrap_interval(d),
                                                    verdict=verdict(d, lower_is_better=False))
    save_json(args.out, results)
    weights, graded, drawn = figure
    plot_answer_maps(weights, graded, drawn, restore_for_inference(os.path.join(args.runs, f"seed{args.seeds[0]}"))[0]
                     .encoder).savefig(args.figure, dpi=150)
    print(f"wrote {args.out} and {args.figure}")


if __name__ == "__main__":
    main()
