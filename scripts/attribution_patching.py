"""Attribution patching against actual patching on the recall model and the copying model.

    python scripts/attribution_patching.py                       # writes docs/experiments/attribution_patching.json
    python scripts/attribution_patching.py --draws 3 --documents 8

For each draw (a seed) and patching pair, every grid is made both ways: by actual patching
(transformer/analysis/patching.py, one forward pass per cell, one compile) and by attribution patching
(transformer/analysis/attribution_patching.py, one backward pass): each head's z [L, H], each layer's
resid_pre at each position [L, T], and each head's queries and keys [L, H], the latter also with AtP*'s
recomputed softmax. Compared: Spearman's rank correlation of the cells' effects (the metric's change
from the corrupted run) over the cells either method moves, the overlap of the top-k cells by |effect|
(chance: k / cells, the expected share of a random top k), the share of each layer's attention rows
that one key holds (> 0.99: saturated, where the linear estimate through the softmax fails), the cells
where the estimate is badly off (a top-k cell of patching with the wrong
sign or outside the estimate's top 2k), and the time of each (first call: compile and run; second: run).
The pairs: recall, the question asking another of the document's facts (as retrieval.causal_scores), and
the facts changed, the asked fact's key swapped with another fact's in the needles, the question the same;
copying, one byte of the first copy changed (as notebooks/looking_inside.ipynb, section 6).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from scipy.stats import spearmanr

from transformer.analysis import attribution_patching as atp
from transformer.analysis import patching
from transformer.analysis.capture import capture
from transformer.analysis.statistics import bootstrap_interval, paired_differences, verdict
from transformer.data.atomic_files import save_json
from transformer.experiments.recall import needle, retrieval
from transformer.load import load_run, validation_tokens

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GRIDS = {"heads": ("blocks.*.attn.z", (0, 3), 3), "positions": ("blocks.*.resid_pre", (0, 2), 10),
         "queries": ("blocks.*.attn.q", (0, 3), 3), "keys": ("blocks.*.attn.k", (0, 3), 3)}  # point, cell axes, k
SATURATED = 0.99  # a row of attention weights is saturated when one key holds more than this


def swap_keys(document: needle.Document, other: int) -> needle.Document:
    """The document with the asked fact's key and fact `other`'s exchanged in their needles: the same
    question and length, whose answer is now the other fact's value (the facts changed)."""
    prompt, n = document.prompt.copy(), needle.KEY_LENGTH
    a, b = document.facts[document.asked].key_start, document.facts[other].key_start
    prompt[a: a + n], prompt[b: b + n] = document.prompt[b: b + n], document.prompt[a: a + n]
    return dataclasses.replace(document, prompt=prompt, answer=document.facts[other].value)


def recall_pairs(workdir: str, seed: int, documents: int) -> dict:
    """{pair: (clean, corrupted, metric)} for `documents` documents of the shortest trained length."""
    with open(os.path.join(workdir, "config.json")) as f:
        task = needle.NeedleTask.from_config(json.load(f)["data"]["needle"])
    filler = validation_tokens(workdir)
    docs = [needle.make_document(filler, np.random.default_rng([seed, i]), task.min_length, float(d), task.digits,
                                 task.facts, task.question) for i, d in enumerate(np.linspace(0, 1, documents))]
    other = [(d.asked + 1) % len(d.facts) for d in docs]
    as_asked, as_other, asked, others = retrieval.patching_pair(docs, other)
    metric = retrieval.recall_metric(asked, others, task.min_length)
    swapped = np.stack([swap_keys(d, o).prompt for d, o in zip(docs, other)])
    forced = lambda prompts: jnp.asarray(np.concatenate(  # noqa: E731  every prompt with each value, teacher forced
        [np.concatenate([prompts, v[:, :-1]], axis=1) for v in (np.asarray(asked), np.asarray(others))]))
    assert np.array_equal(forced(np.stack([d.prompt for d in docs])), np.asarray(as_asked))
    return {"ask_other": (as_other, as_asked, metric), "swap_keys": (forced(swapped), as_asked, metric)}


def copying_pair(tokenizer, seed: int, rows: int, length: int = 24, changed: int = 12) -> dict:
    """One byte of the first copy changed: rows of s + s[:changed], each s `length` distinct printable bytes."""
    rng = np.random.default_rng(seed)
    alphabet = [chr(c) for c in range(33, 127)]
    clean, corrupted, right, wrong = [], [], [], []
    for _ in range(rows):
        s = "".join(rng.choice(alphabet, length, replace=False))
        other = str(rng.choice([c for c in alphabet if c not in s]))
        clean.append(tokenizer.encode(s + s[:changed]))
        corrupted.append(tokenizer.encode(s[:changed] + other + s[changed + 1:] + s[:changed]))
        right.append(tokenizer.encode(s[changed])[0]), wrong.append(tokenizer.encode(other)[0])
    metric = patching.logit_difference(jnp.array(right), jnp.array(wrong))
    return {"change_byte": (jnp.asarray(clean), jnp.asarray(corrupted), metric)}


def timed(f, *args) -> tuple[object, float, float]:
    """f(*args) blocked on, its first call's seconds (compile and run) and a second call's (run)."""
    start = time.perf_counter()
    out = jax.block_until_ready(f(*args))
    first = time.perf_counter() - start
    start = time.perf_counter()
    jax.block_until_ready(f(*args))
    return out, first, time.perf_counter() - start


def compare(actual: patching.Patching, estimate: patching.Patching, k: int) -> dict:
    """Rank correlation, top-k overlap and the badly-off cells of an estimated grid against the actual one."""
    effect, guess = (np.asarray(g.grid - g.corrupted).ravel() for g in (actual, estimate))
    moved = (np.abs(effect) > 1e-6) | (np.abs(guess) > 1e-6)
    top, top_guess = (np.argsort(-np.abs(x), kind="stable") for x in (effect, guess))
    bad = [int(c) for c in top[:k] if np.sign(guess[c]) != np.sign(effect[c]) or c not in top_guess[: 2 * k]]
    shape = np.asarray(actual.grid).shape
    return {"spearman": float(spearmanr(effect[moved], guess[moved])[0]), "cells": int(moved.sum()),
            "top_k": len(set(top[:k]) & set(top_guess[:k])) / k, "chance_top_k": k / moved.sum(),
            "bad_cells": [[*(int(i) for i in np.unravel_index(c, shape)), float(effect[c]), float(guess[c])]
                          for c in bad],
            "metric_clean": float(actual.clean), "metric_corrupted": float(actual.corrupted)}


def measure(cfg, params, clean, corrupted, metric) -> dict:
    """Every grid both ways (and AtP* for queries and keys), compared and timed; each layer's saturated rows."""
    out = {}
    for grid, (name, axes, k) in GRIDS.items():
        make = jax.jit(lambda p, c, x: patching.patch_point(p, cfg, c, x, metric, name, axes))
        actual, patch_first, patch_run = timed(make, params, clean, corrupted)
        methods = {"atp": False, "atp_star": True} if grid in ("queries", "keys") else {"atp": False}
        for method, saturation in methods.items():
            estimate = jax.jit(lambda p, c, x: atp.attribute(p, cfg, c, x, metric, name, axes, saturation=saturation))
            guess, atp_first, atp_run = timed(estimate, params, clean, corrupted)
            out[f"{grid}_{method}"] = {**compare(actual, guess, k), "speedup_first_call": patch_first / atp_first,
                                       "speedup_run": patch_run / atp_run}
    weights = capture(params, cfg, corrupted, ["blocks.*.attn.pattern"])[2]["blocks.*.attn.pattern"]  # [L, B, H, T, S]
    out["saturated"] = (weights.max(axis=-1) > SATURATED).mean(axis=(1, 2, 3)).tolist()  # [L]: rows one key holds
    return out


def summary(draws: list[dict]) -> dict:
    """Each number's mean, standard deviation, min, max and draws, the bad cells of every draw, whether attribution
    is faster (a verdict on the log speed-ups) and AtP*'s gain in rank correlation over AtP (a paired verdict)."""
    out = {"saturated": np.mean([d["saturated"] for d in draws], axis=0).tolist()}  # [L], averaged over the draws
    for key in (k for k in draws[0] if k != "saturated"):
        stats = {}
        for field in ("spearman", "top_k", "chance_top_k", "speedup_first_call", "speedup_run", "cells"):
            values = np.array([d[key][field] for d in draws], float)
            stats[field] = {"mean": values.mean(), "sd": values.std(ddof=1), "min": values.min(), "max": values.max(),
                            "draws": values.tolist()}
        stats["bad_cells"] = [d[key]["bad_cells"] for d in draws]
        stats["metric"] = [[d[key]["metric_corrupted"], d[key]["metric_clean"]] for d in draws]
        stats["faster"] = verdict(np.log(stats["speedup_run"]["draws"]), lower_is_better=False)  # same time: log 1 = 0
        out[key] = stats
    for grid in ("queries", "keys"):  # AtP*'s rank correlation against AtP's, paired by draw
        gain = paired_differences(out[f"{grid}_atp_star"]["spearman"]["draws"], out[f"{grid}_atp"]["spearman"]["draws"])
        out[f"{grid}_star_gain"] = {"mean": gain.mean(), "interval": list(bootstrap_interval(gain)),
                                    "verdict": verdict(gain, lower_is_better=False)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--recall", default=os.path.join(ROOT, "runs/recall"), help="the recall run's folder")
    parser.add_argument("--copying", default=os.path.join(ROOT, "runs/looking_inside/copying"), help="the copying run")
    parser.add_argument("--draws", type=int, default=3, help="seeds: documents / strings drawn afresh for each")
    parser.add_argument("--documents", type=int, default=8, help="documents (recall) or strings (copying) per draw")
    parser.add_argument("--out", default=os.path.join(ROOT, "docs/experiments/attribution_patching.json"))
    args = parser.parse_args()
    results = {"command": "python scripts/attribution_patching.py", "draws": args.draws, "documents": args.documents,
               "source": "the latest checkpoints of the recall run and the copying run (--recall, --copying)",
               "device": jax.devices()[0].device_kind, "models": {}}
    for model, workdir in (("recall", args.recall), ("copying", args.copying)):
        cfg, params, tokenizer = load_run(workdir)
        per_pair: dict[str, list] = {}
        for seed in range(args.draws):
            pairs = (recall_pairs(workdir, seed, args.documents) if model == "recall"
                     else copying_pair(tokenizer, seed, args.documents))
            for pair, (clean, corrupted, metric) in pairs.items():
                per_pair.setdefault(pair, []).append(measure(cfg, params, clean, corrupted, metric))
                got = per_pair[pair][-1]
                print(model, pair, seed, {k: round(v["spearman"], 3) for k, v in got.items() if k != "saturated"},
                      flush=True)
        results["models"][model] = {"layers": cfg.num_layers, "heads": cfg.num_heads,
                                    **{pair: summary(draws) for pair, draws in per_pair.items()}}
    save_json(args.out, jax.tree.map(lambda x: round(float(x), 4) if isinstance(x, float) else x, results))
    print("wrote", args.out)


if __name__ == "__main__":
    main()
