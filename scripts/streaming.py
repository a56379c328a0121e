"""The StreamingLLM experiment at this scale: held-out text read 8x past the context through a rolling
cache keeping 0 / 1 / 4 first tokens, for the runs of configs/sweeps/sinks.py.

    python sweep.py --sweep configs/sweeps/sinks.py --workdir runs/sweeps/sinks   # the four runs
    python scripts/streaming.py                     # the table (markdown) and docs/figures/streaming.png

Each run reads the same `--rows` stretches of its validation split, `--times` x its context C long,
from evenly spaced starts (the run with a start token gets its byte 0 in front of each, as in
training). For each number of kept first tokens S, the table gives the mean next-byte loss (nats)
over the positions inside the context (t < C: the plain forward's, the same for every S) and past it
(C <= t < times x C), with the standard error over the rows; `experiments.sinks.streaming.rolling_nll` computes
each token's loss. The figure draws the loss against position (means over the rows in bins of C/2).
"""

from __future__ import annotations

import argparse
import os
import re

import numpy as np

from transformer.cli import exit_usage
from transformer.experiments.sinks.streaming import rolling_nll
from transformer.load import load_run, validation_tokens
from transformer.run.checkpoint import Checkpointer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def validation_rows(workdir: str, rows: int, length: int) -> np.ndarray:
    """[rows, length] int32: stretches of the run's validation split from evenly spaced starts."""
    val = validation_tokens(workdir)
    if len(val) < length:
        raise ValueError(f"{workdir}: the validation split holds {len(val)} tokens, fewer than one row of {length}; "
                         "use a smaller --times")
    starts = np.linspace(0, len(val) - length, rows).astype(int)
    return np.stack([val[s: s + length] for s in starts]).astype(np.int32)


def measure(workdir: str, rows: int, times: int, sinks: list[int]) -> dict:
    """{'inside': (mean, se), S: (mean, se), ...; 'curves': {S: [N - 1] mean nll per position}}."""
    cfg, params, _ = load_run(workdir)
    context = cfg.max_seq_len
    start_token = Checkpointer(workdir, read_only=True).config()["data"].get("start_token", -1)  # -1: none
    length = times * context - (start_token >= 0)
    tokens = validation_rows(workdir, rows, length)
    if start_token >= 0:  # the run saw this token first in every window
        tokens = np.concatenate([np.full((rows, 1), start_token, np.int32), tokens], axis=1)
    result, past = {"curves": {}, "context": context}, {}
    mean_se = lambda x: (x.mean(), x.std(ddof=1) / np.sqrt(len(x)))  # noqa: E731  over the rows
    for s in sinks:
        nll = np.asarray(rolling_nll(params, cfg, tokens, s))  # [rows, N - 1]
        result["curves"][s] = nll.mean(axis=0)
        inside, past[s] = nll[:, :context - 1].mean(axis=1), nll[:, context - 1:].mean(axis=1)  # per row
        result["inside"], result[s] = mean_se(inside), mean_se(past[s])
    # Paired by row (the same text read both ways): what the most sinks change against none.
    result["difference"] = mean_se(past[sinks[-1]] - past[sinks[0]])
    return result


def table(results: dict, sinks: list[int], rows: int, times: int) -> str:
    head = (["run", "inside the context (t < C)"] + [f"past it, S = {s}" for s in sinks]
            + [f"S = {sinks[-1]} minus S = {sinks[0]}, paired"])
    lines = ["| " + " | ".join(head) + " |", "| --- |" + " --: |" * (len(head) - 1)]
    for name, r in results.items():
        cells = [f"{m:.3f} ± {se:.3f}" for m, se in [r["inside"], *(r[s] for s in sinks)]]
        cells.append(f"{r['difference'][0]:+.4f} ± {r['difference'][1]:.4f}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + (f"\n\nnats per byte, mean ± standard error over {rows} rows of {times} x C bytes "
                               "(C = the context); S: first tokens kept in the rolling cache; the last column row by row.")


def plot(results: dict, sinks: list[int], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(4 * len(results), 3.2), sharey=True)
    for ax, (name, r) in zip(np.atleast_1d(axes), results.items()):
        bin_size = r["context"] // 2
        for s in sinks:
            curve = r["curves"][s]
            bins = len(curve) // bin_size
            means = curve[: bins * bin_size].reshape(bins, bin_size).mean(axis=1)
            ax.plot((np.arange(bins) + 0.5) * bin_size, means, label=f"S = {s}")
        ax.axvline(r["context"], color="grey", lw=0.8, ls="--")
        ax.set_title(name)
        ax.set_xlabel("position t (bytes)")
    np.atleast_1d(axes)[0].set_ylabel("next-byte loss (nats)")
    np.atleast_1d(axes)[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sweep_dir", default=os.path.join(ROOT, "runs", "sweeps", "sinks"))
    parser.add_argument("--runs", default="plain,sink,registers,start_token")
    parser.add_argument("--sinks", default="0,1,4")
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--times", type=int, default=8)
    parser.add_argument("--figure", default=os.path.join(ROOT, "docs", "figures", "streaming.png"))
    args = parser.parse_args()
    # A standard error needs two rows, a "past it" column a second context: nan otherwise.
    for flag, value in (("rows", args.rows), ("times", args.times)):
        if value < 2:
            exit_usage(f"--{flag} {value}: at least 2 (the default is {parser.get_default(flag)})")
    if not re.fullmatch(r"\d+(,\d+)*", args.sinks):
        exit_usage(f"--sinks {args.sinks!r}: a comma-separated list of counts >= 0, e.g. 0,1,4")
    sinks = [int(s) for s in args.sinks.split(",")]
    results = {}
    for name in args.runs.split(","):
        workdir = os.path.join(args.sweep_dir, name)
        if not os.path.isdir(workdir):
            raise SystemExit(f"no run at {workdir}: train the sweep first (python sweep.py --sweep "
                             f"configs/sweeps/sinks.py --workdir {args.sweep_dir}) or pass --sweep_dir")
        try:
            results[name] = measure(workdir, args.rows, args.times, sinks)
        except ValueError as e:  # a too-short split, sinks out of range, positions that cannot roll: one line
            raise SystemExit(f"error: {e}") from None
    print(table(results, sinks, args.rows, args.times))
    plot(results, sinks, args.figure)
    print(f"\nfigure: {os.path.relpath(args.figure, ROOT)}")


if __name__ == "__main__":
    main()
