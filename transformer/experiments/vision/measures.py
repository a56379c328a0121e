"""The ViT measured (scripts/vision_experiment.py, docs/experiments/vision.md), on held-out pictures:

    accuracies(params, cfg, name)        # the ViT, and logistic regression and kNN on the pixels
    attention_on_object(pattern, cfg, on_object)   # the [CLS] row's share on the object's patches
    register_story(pattern, last, cfg, on_object)  # Darcet et al. 2024: high-norm patch tokens, registers
    everything({name: [run folder per seed]})      # all of it per seed, with mean and spread

A patch is the object's when it holds one of its pixels; the chance line of the [CLS] share is the
share of such patches (what attention spread evenly over the patches would put there). Weights over
the patches are renormalised (without [CLS] itself and the registers)."""

from __future__ import annotations

import functools
import json
import os
from typing import Any

import jax
import numpy as np

from transformer.analysis import statistics
from transformer.analysis.capture import capture
from transformer.data import images
from transformer.experiments.vision.image_task import EVAL_SEED, SETS
from transformer.run.checkpoint import restore_for_inference
from transformer.model import image
from transformer.model.config import ModelConfig

HELD_OUT = 1000  # held-out shapes (the digits: their test split of 360)
BASELINE_TRAIN = 2000  # pictures the pixel baselines are fitted on (shapes; the digits: their training split)
OUTLIER = 2.0  # a patch token is an outlier when its output norm exceeds this many times its picture's median


def held_out(name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(images [n, H, W, C], classes [n], the object's masks bool [n, H, W] or None for the digits)."""
    if name == "digits":
        test = images.digits("test")
        return test["images"], test["label"], None
    data = images.shapes(HELD_OUT, EVAL_SEED, objects=(1, 1))
    return data["images"], data["shape"][:, 0], data["masks"][:, 0]


@functools.partial(jax.jit, static_argnums=1)
def attention_points(params: Any, cfg: ModelConfig, x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(class logits [B, C], every layer's weights [L, B, H, T, R + T], the last layer's output [B, T, D])."""
    last = f"blocks.{cfg.num_layers - 1}.resid_post"
    logits, _, got = capture(params, cfg, x, ["blocks.*.attn.pattern", last])
    return logits[:, 0], got["blocks.*.attn.pattern"], got[last]


def pixel_baselines(name: str, seed: int, x_test: np.ndarray, y_test: np.ndarray) -> dict[str, float]:
    """{'logistic', 'knn'}: held-out accuracy of scikit-learn's logistic regression and 5-nearest
    neighbours on the raw pixels, fitted on BASELINE_TRAIN shapes drawn from `seed` (the digits: their training split)."""
    from sklearn.linear_model import LogisticRegression  # optional: the dev and notebooks extras
    from sklearn.neighbors import KNeighborsClassifier

    if name == "digits":
        train = images.digits("train")
        x, y = train["images"], train["label"]
    else:
        x, y = images.classification(name, BASELINE_TRAIN, [seed, 1])
    x, x_test = x.reshape(len(x), -1), x_test.reshape(len(x_test), -1)
    models = {"logistic": LogisticRegression(max_iter=300), "knn": KNeighborsClassifier(5)}
    return {m: float(np.mean(model.fit(x, y).predict(x_test) == y_test)) for m, model in models.items()}


def attention_on_object(pattern: np.ndarray, cfg: ModelConfig, on_object: np.ndarray) -> dict[str, Any]:
    """pattern [L, B, H, T, R + T], on_object bool [B, N] -> {'share' [L], 'per_head' [L, H]: the [CLS]
    row's weight on the object's patches; 'chance': their share of the patches}."""
    cls = pattern[:, :, :, 0, cfg.num_registers + 1:]  # [L, B, H, N]
    share = (cls * on_object[None, :, None]).sum(-1) / cls.sum(-1)  # [L, B, H]
    return {"share": share.mean(axis=(1, 2)).tolist(), "per_head": share.mean(axis=1).tolist(),
            "chance": float(on_object.mean())}


def register_story(pattern: np.ndarray, last: np.ndarray, cfg: ModelConfig, on_object: np.ndarray) -> dict[str, Any]:
    """Darcet et al.'s measures from pattern [L, B, H, T, R + T] and the last layer's output last [B, T, D]:
    the share of patch tokens whose norm is an OUTLIER x its picture's median, the attention an outlier and
    another patch receive (the last layer's, mean over heads and queries), the outliers' and all patches'
    share on the background, the largest norm ratio, and the attention on the registers per layer."""
    r = cfg.num_registers
    norms = np.linalg.norm(last[:, cfg.cls_token:], axis=-1)  # [B, N]
    ratio = norms / np.median(norms, axis=1, keepdims=True)
    outlier = ratio > OUTLIER
    received = pattern[-1][..., r + cfg.cls_token:].mean(axis=(1, 2))  # [B, N]
    mean_or_none = lambda a: float(a.mean()) if a.size else None  # noqa: E731
    return {"outlier_share": float(outlier.mean()), "max_ratio": float(ratio.max()),
            "p99_ratio": float(np.quantile(ratio, 0.99)),
            "received_outlier": mean_or_none(received[outlier]), "received_other": mean_or_none(received[~outlier]),
            "outliers_on_background": mean_or_none(~on_object[outlier]), "background": float((~on_object).mean()),
            "on_registers": pattern[..., :r].sum(-1).mean(axis=(1, 2, 3)).tolist()}


def measure_run(workdir: str, name: str, seed: int) -> dict[str, Any]:
    """Everything of one run on the held-out pictures (shapes: the [CLS] and register measures too)."""
    cfg, params, _ = restore_for_inference(workdir)
    x, y, masks = held_out(name)
    logits, pattern, last = (np.asarray(a) for a in attention_points(params, cfg, x))
    with open(os.path.join(workdir, "metrics.jsonl")) as f:  # the last evaluation's time since the start
        seconds = [json.loads(line)["elapsed_seconds"] for line in f if "val_loss" in line][-1]
    out = {"accuracy": float(np.mean(logits.argmax(-1) == y)), "train_seconds": seconds,
           **pixel_baselines(name, seed, x, y)}
    if masks is not None:
        on_object = np.asarray(image.patches(masks[..., None], cfg.patch_size).any(-1))  # [B, N]
        out |= {"cls": attention_on_object(pattern, cfg, on_object),
                "registers": register_story(pattern, last, cfg, on_object)}
    return out


def spread(values: list) -> dict[str, Any]:
    """{mean, sd, values} over seeds (None values left out)."""
    kept = np.array([v for v in values if v is not None], float)
    return {"mean": float(kept.mean()) if kept.size else None, "sd": float(kept.std()) if kept.size else None,
            "values": values}


def everything(runs: dict[str, list[str]]) -> dict[str, Any]:
    """{'runs': per run name, per seed `measure_run`; 'summary': the spreads and verdicts over seeds}."""
    found = {name: [measure_run(w, name.split("_")[0], s) for s, w in enumerate(folders)] for name, folders in runs.items()}
    summary = {name: {k: spread([r[k] for r in per]) for k in ("accuracy", "logistic", "knn", "train_seconds")}
               for name, per in found.items()}
    for name in summary:
        summary[name]["chance"] = 1 / SETS[name.split("_")[0]][2]  # 1 / classes    for name in ("shapes", "shapes_registers"):
        per = found[name]
        layers = np.array([r["cls"]["share"] for r in per])  # [seeds, L]
        chance = np.array([r["cls"]["chance"] for r in per])
        summary[name]["cls_share"] = [spread(layers[:, l].tolist()) for l in range(layers.shape[1])]
        summary[name]["cls_chance"] = float(chance.mean())
        summary[name]["cls_verdict"] = [statistics.verdict(layers[:, l] - chance, lower_is_better=False)
                                        for l in range(layers.shape[1])]  # 'better': above the chance line
        for key in ("outlier_share", "max_ratio", "p99_ratio", "received_outlier", "received_other",
                    "outliers_on_background", "background"):
            summary[name][key] = spread([r["registers"][key] for r in per])
        summary[name]["on_registers"] = spread([r["registers"]["on_registers"][-1] for r in per])
    differences = statistics.paired_differences([r["registers"]["outlier_share"] for r in found["shapes_registers"]],
                                                [r["registers"]["outlier_share"] for r in found["shapes"]])
    summary["registers_vs_none_outlier_share"] = {"verdict": statistics.verdict(differences),
                                                  "interval": statistics.bootstrap_interval(differences)}
    return {"command": "python scripts/vision_experiment.py train --runs runs/vision; "
                       "python scripts/vision_experiment.py measure --runs runs/vision",
            "source": "written by scripts/vision_experiment.py measure from the runs of its train phase (3 seeds)",
            "outlier_threshold": OUTLIER, "held_out_shapes": HELD_OUT, "summary": summary, "runs": found}
