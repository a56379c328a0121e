"""A seed sweep's final validation losses, each variant against a baseline variant, paired by seed.

    python sweep.py --sweep configs/sweeps/fewer_bytes_shorter.py --workdir runs/sweeps/fewer_bytes_shorter --jobs 2
    python scripts/seed_sweep.py runs/sweeps/fewer_bytes_shorter --baseline recipe \
        --out docs/experiments/fewer_bytes_shorter.json

Reads each run's metrics.jsonl in the sweep's folder (runs named VARIANT-seedK, as sweep.py names them):
the validation loss at its last step (train.steps; an unfinished run is left out). Per variant: the losses by seed, their mean and maximum, the
paired differences from the baseline's run of the same seed, their bootstrap interval and verdict
(transformer.analysis.statistics: 'no difference' when the interval holds 0). Writes JSON and prints a
Markdown table. A variant without a finished run for every seed of the baseline is refused.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

import numpy as np

from transformer.analysis.statistics import bootstrap_interval, verdict
from transformer.run.metrics import read_metrics

RUN = re.compile(r"^(?P<variant>.+)-seed(?P<seed>\d+)$")


def final_losses(folder: str) -> dict[str, dict[int, float]]:
    """{variant: {seed: validation loss at train.steps}} of the finished runs in `folder` (a run is
    finished when it has an evaluation at its config.json's train.steps)."""
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"no sweep folder {folder}: give the --workdir the sweep was run with")
    losses: dict[str, dict[int, float]] = {}
    for name in sorted(os.listdir(folder)):
        match, run = RUN.match(name), os.path.join(folder, name)
        if not match or not os.path.isfile(os.path.join(run, "metrics.jsonl")):
            continue
        with open(os.path.join(run, "config.json")) as f:
            steps = json.load(f)["train"]["steps"]
        final = [r["val_loss"] for r in read_metrics(os.path.join(run, "metrics.jsonl"))
                 if "val_loss" in r and r["step"] == steps]
        if final:
            losses.setdefault(match["variant"], {})[int(match["seed"])] = round(final[-1], 4)
    return losses


def compare(losses: dict[str, dict[int, float]], baseline: str) -> dict:
    """Per variant: val_loss by seed, mean, max, and (but the baseline) the paired differences from the
    baseline, their bootstrap interval and verdict."""
    if baseline not in losses:
        raise ValueError(f"no finished run of the baseline {baseline!r}; variants found: {sorted(losses)}")
    seeds = sorted(losses[baseline])
    table = {}
    for variant, by_seed in losses.items():
        missing = [s for s in seeds if s not in by_seed]
        if missing:
            raise ValueError(f"{variant!r} has no finished run for seeds {missing}; finish the sweep first "
                             "(the same sweep.py command resumes it)")
        values = np.array([by_seed[s] for s in seeds])
        row = {"val_loss": values.tolist(), "mean": round(float(values.mean()), 4), "max": float(values.max())}
        if variant != baseline:
            differences = values - np.array([losses[baseline][s] for s in seeds])
            low, high = bootstrap_interval(differences)
            row.update(differences=[round(float(d), 4) for d in differences],
                       mean_difference=round(float(differences.mean()), 4),
                       interval=[round(float(low), 4), round(float(high), 4)], verdict=verdict(differences))
        table[variant] = row
    return {"seeds": seeds, "baseline": baseline, "variants": table}


def markdown(result: dict) -> str:
    lines = [f"| variant | val loss by seed {result['seeds']} | mean | max | - {result['baseline']} (interval) | verdict |",
             "|---|---|--:|--:|---|---|"]
    for name, row in result["variants"].items():
        diff = (f"{row['mean_difference']:+.4f} ({row['interval'][0]:+.4f} to {row['interval'][1]:+.4f})"
                if "verdict" in row else "")
        lines.append(f"| {name} | {' / '.join(f'{v:.4f}' for v in row['val_loss'])} | {row['mean']:.4f} | "
                     f"{row['max']:.4f} | {diff} | {row.get('verdict', '(baseline)')} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folder", help="the sweep's --workdir")
    p.add_argument("--baseline", required=True, help="the variant the others are compared with")
    p.add_argument("--out", help="write the comparison here as JSON")
    args = p.parse_args(argv)
    try:
        result = compare(final_losses(args.folder), args.baseline)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    result = {"command": " ".join(["python scripts/seed_sweep.py", *(argv if argv is not None else sys.argv[1:])]),
              **result}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
