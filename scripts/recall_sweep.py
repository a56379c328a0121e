"""The table and figure of configs/sweeps/recall.py: per variant, how many seeds left the copy-any-value
plateau, and by which step.

    python sweep.py --sweep configs/sweeps/recall.py --workdir runs/sweeps/recall   # the 32 runs
    python scripts/recall_sweep.py runs/sweeps/recall     # reads their metrics, rewrites docs/sweeps/recall.json
    python scripts/recall_sweep.py                         # from docs/sweeps/recall.json (as measured)

Prints a markdown table (one row per variant: its seeds' exact match at the last step, the first
evaluated step at which each reached 0.9, and how many of them did) and draws
docs/figures/recall_recipe.png (exact match against step, a line per run, the chance line 1/3).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from transformer.cli import exit_with_error  # noqa: E402
from transformer.data.atomic_files import write_atomically  # noqa: E402
from transformer.run.metrics import read_metrics  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CURVES = os.path.join(ROOT, "docs", "sweeps", "recall.json")
FIGURE = os.path.join(ROOT, "docs", "figures", "recall_recipe.png")
TARGET = 0.9  # issue 28's exact match over the trained lengths
CHANCE = 1 / 3  # a model copying any of the 3 values (needle.copy_any_value_accuracy)

Curves = dict[str, list[list[float]]]  # run -> [[step, val_loss, val_exact_match], ...]


def read_runs(workdir: str) -> Curves:
    """The evaluations of every run folder under a sweep's workdir."""
    curves = {}
    for path in sorted(glob.glob(os.path.join(workdir, "*", "metrics.jsonl"))):
        evals = {r["step"]: r for r in read_metrics(path) if "val_exact_match" in r}  # a resumed run's repeats: the last
        curves[os.path.basename(os.path.dirname(path))] = [
            [step, round(evals[step]["val_loss"], 3), round(evals[step]["val_exact_match"], 3)] for step in sorted(evals)]
    if not curves:
        raise SystemExit(f"error: {workdir} holds no run folder with metrics.jsonl; train the sweep first "
                         f"(python sweep.py --sweep configs/sweeps/recall.py --workdir {workdir})")
    return curves


def by_variant(curves: Curves) -> dict[str, dict[int, list[list[float]]]]:
    """{variant: {seed: curve}} from run names '<variant>-seed<s>' (sweep.py's seeds) or '<variant>_seed<s>'
    (configs/sweeps/recall.py's variants), in the file's order; ValueError for any other name."""
    variants: dict[str, dict[int, list[list[float]]]] = {}
    for run, curve in curves.items():
        named = re.fullmatch(r"(.+)[-_]seed(\d+)", run)
        if not named:
            raise ValueError(f"run {run!r} is not named <variant>-seed<s>: this table compares the seeds of each "
                             "variant, so pass a sweep with seeds (configs/sweeps/recall.py)")
        if not curve:
            raise ValueError(f"run {run!r} has no evaluation with val_exact_match yet: is it a recall run? "
                             "Train it past its first evaluation")
        variants.setdefault(named[1], {})[int(named[2])] = curve
    return variants


def first_at(curve: list[list[float]], target: float) -> int | None:
    """The first evaluated step whose exact match is >= target, or None."""
    return next((int(step) for step, _, em in curve if em >= target), None)


def table(curves: Curves) -> str:
    lines = ["| variant | seeds | last step | exact match at the last step, by seed | first step >= 0.9, by seed | seeds >= 0.9 |",
             "|---|--:|--:|---|---|--:|"]
    for variant, seeds in by_variant(curves).items():
        ends = [seeds[s][-1] for s in sorted(seeds)]
        firsts = [first_at(seeds[s], TARGET) for s in sorted(seeds)]
        lines.append(f"| {variant} | {len(seeds)} | {int(ends[0][0]):,} | "
                     f"{', '.join(f'{e[2]:.3f}' for e in ends)} | "
                     f"{', '.join('-' if f is None else f'{f:,}' for f in firsts)} | "
                     f"{sum(e[2] >= TARGET for e in ends)} of {len(seeds)} |")
    return "\n".join(lines)


def plot(curves: Curves, path: str) -> None:
    variants = by_variant(curves)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), sharey=True)
    for ax, prefix, title in ((axes[0], "before", "round 1: one question a row, 2,500 steps"),
                              (axes[1], "recipe", "round 2: configs/recall.py and near variants")):
        names = [v for v in variants if v.split("_")[0] == prefix]
        for i, variant in enumerate(names):
            for j, seed in enumerate(sorted(variants[variant])):
                steps, _, em = zip(*variants[variant][seed])
                ax.plot(steps, em, color=f"C{i}", alpha=0.8, label=variant if j == 0 else None)
        ax.axhline(CHANCE, color="grey", ls=":", label="copy any value (1/3)")
        ax.axhline(TARGET, color="black", ls="--", lw=0.8, label="0.9")
        ax.set(title=title, xlabel="step")
        ax.legend(fontsize=7)
    axes[0].set_ylabel("val exact match (256 documents)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workdir", nargs="?", help="a sweep's workdir to read (default: the committed curves)")
    parser.add_argument("--figure", default=FIGURE)
    args = parser.parse_args()
    try:
        curves = read_runs(args.workdir) if args.workdir else json.load(open(CURVES))
        text = table(curves)  # checks every run's name and curve before anything is written
    except ValueError as e:
        exit_with_error(ValueError(f"{args.workdir or CURVES}: {e}"))
    if args.workdir:
        rows = ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in curves.items())
        write_atomically(CURVES, "{\n" + rows + "\n}\n")
    print(text)
    plot(curves, args.figure)
    print(f"figure: {os.path.relpath(args.figure, ROOT)}")


if __name__ == "__main__":
    main()
