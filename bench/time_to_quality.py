"""Time to quality: the wall time and steps that (a) our default recipe, (b) our lecture GPT and (c) a
PyTorch GPT of the lecture's shape take to reach the validation loss (c) reaches at its last step.

    python bench/time_to_quality.py                    # 2 rounds of 3 runs of 1000 steps: ~45 min on 2 cores
    python bench/time_to_quality.py --quick            # 1 round of 100 steps each (figure into runs/)
    python bench/time_to_quality.py --sides ca --rounds 1   # PyTorch and the default alone (figure into runs/)
    python bench/time_to_quality.py --default configs/modern.py --rounds 3 --workdir runs/ttq

Every side is a process of its own, started as `make train` starts train.py:

- (a) `python train.py --config DEFAULT --workdir ...` (--default, configs/modern.py unless given);
- (b) `python train.py --config LECTURE --workdir ...` (--lecture, configs/shakespeare.py);
- (c) `python bench/torch_gpt.py --config LECTURE --workdir ...`: Hugging Face's GPT2LMHeadModel of
  the lecture's shape in PyTorch with the same recipe (AdamW, decay groups, clipping, warm-up +
  cosine), the same batches in the same order and the same validation batches.

Every side gets train.eval_every = --eval_every (default 50 rather than the configs' 250, for a
finer curve; evaluations cost time on every side alike) and any --config.X=Y given here. Each
reads the time from its own log: elapsed_seconds, from its process's start, so start-up, imports,
compiling, evaluations and checkpoints all count. The rounds interleave the sides, (c), (a), (b),
(c), (a), (b), ..., so the shared machine's noise falls on all of them alike; the token cache is
filled before the first round (the sides share the lecture config's data: give --default a config
with the same data, batch size, sequence length and seed for the same data order).

The target is (c)'s validation loss at its last step, in each round. A side's steps and seconds to
the target are interpolated linearly between its last evaluation above the target and its first at
or below it; the ratio divides them by (c)'s seconds in the same round (for (c), its last step
unless an earlier evaluation was lower). Prints a Markdown table; draws the validation loss against
wall time of every side and round into --figure: by default the committed docs/figures/time_to_quality.png
for the page's own comparison (every side, the default configs, their steps, no overrides), else
runs/time_to_quality_other.png, so that another comparison leaves the page's figure alone.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
DEFAULT_FIGURE = os.path.join(ROOT, "docs", "figures", "time_to_quality.png")
OTHER_FIGURE = os.path.join(ROOT, "runs", "time_to_quality_other.png")  # any other comparison's: the page's stays
QUICK = dict(steps=100, eval_every=20, rounds=1)


@dataclass(frozen=True)
class Side:
    """One contender: a script run on a config."""

    key: str  # "a", "b" or "c": its folder in each round
    name: str
    script: str  # relative to the repository
    config: str


@dataclass(frozen=True)
class Run:
    """One side's run in one round: its evaluations and the process's own wall time."""

    side: Side
    round: int
    evals: list[dict]  # metrics.jsonl's rows with val_loss, by step: {step, val_loss, elapsed_seconds}
    setup_seconds: float  # elapsed_seconds when the set-up ended (imports, data, model, compiling)
    process_seconds: float  # the whole process, as this script timed it (the final sample included)


def sides(default: str, lecture: str) -> list[Side]:
    """The contenders in the order each round runs them: the reference first."""
    return [Side("c", "(c) PyTorch GPT-2", "bench/torch_gpt.py", lecture),
            Side("a", "(a) default recipe", "train.py", default),
            Side("b", "(b) lecture GPT", "train.py", lecture)]


def data_order(config) -> dict:
    """The fields that decide which batches a run sees, and in which order."""
    t = config.train
    return {"train.batch_size": t.batch_size, "train.seq_len": t.seq_len, "train.seed": t.seed,
            **{f"data.{k}": v for k, v in config.data.to_dict().items() if k != "cache_dir"}}


def command(side: Side, workdir: str, overrides: list[str]) -> list[str]:
    return [sys.executable, os.path.join(ROOT, side.script), "--config", side.config, "--workdir", workdir,
            *overrides]


def child_env() -> dict:
    """The environment of the runs: this checkout's packages first (not another installed copy)."""
    path = os.environ.get("PYTHONPATH")
    return dict(os.environ, PYTHONPATH=ROOT + (os.pathsep + path if path else ""))


def run_side(side: Side, round_: int, workdir: str, overrides: list[str]) -> Run:
    """Runs one side to the end (its output to workdir/run.log) and reads its metrics.jsonl."""
    from transformer.run.metrics import read_metrics

    os.makedirs(workdir)
    log = os.path.join(workdir, "run.log")
    print(f"round {round_}, {side.name}: {' '.join(command(side, workdir, overrides)[1:])}", file=sys.stderr,
          flush=True)
    started = time.perf_counter()
    with open(log, "w") as out:
        code = subprocess.run(command(side, workdir, overrides), stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                              env=child_env()).returncode
    seconds = time.perf_counter() - started
    if code != 0:
        with open(log) as f:
            tail = f.read()[-2000:]
        raise RuntimeError(f"{side.name} failed with exit code {code} (log: {log}):\n{tail}")
    rows = read_metrics(os.path.join(workdir, "metrics.jsonl"))
    evals = sorted({r["step"]: r for r in rows if "val_loss" in r}.values(), key=lambda r: r["step"])
    setup = next(r["elapsed_seconds"] for r in rows if "elapsed_seconds" in r and "val_loss" not in r)
    print(f"  {seconds:.0f} s; val loss {evals[-1]['val_loss']:.4f} at step {evals[-1]['step']}", file=sys.stderr,
          flush=True)
    return Run(side, round_, evals, setup, seconds)


def load_config(path: str, overrides: list[str]):
    """The config file's get_config() with the --config.X=Y `overrides`, parsed as train.py parses them."""
    from absl import flags
    from ml_collections import config_flags

    argv = ["time_to_quality", f"--config={path}", *overrides]
    values = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, flag_values=values, sys_argv=argv)
    values(argv)
    return values.config


def warm_token_cache(lecture: str, overrides: list[str]) -> None:
    """Fills the token cache before the first round, so that no side's time includes tokenizing the
    corpus (the sides share the lecture config's data)."""
    from bench.torch_gpt import load_tokens

    load_tokens(load_config(lecture, overrides))


def time_to_target(evals: list[dict], target: float) -> tuple[float, float] | None:
    """(steps, seconds) at which the validation loss first reaches `target`: interpolated linearly
    between the last evaluation above it and the first at or below it; None if none reaches it."""
    previous = None
    for row in evals:
        if row["val_loss"] <= target:
            if previous is None:
                return float(row["step"]), row["elapsed_seconds"]
            f = (previous["val_loss"] - target) / (previous["val_loss"] - row["val_loss"])
            return (previous["step"] + f * (row["step"] - previous["step"]),
                    previous["elapsed_seconds"] + f * (row["elapsed_seconds"] - previous["elapsed_seconds"]))
        previous = row
    return None


def targets(runs: list[Run]) -> dict[int, float]:
    """{round: the reference's validation loss at its last step}."""
    return {r.round: r.evals[-1]["val_loss"] for r in runs if r.side.key == "c"}


def table(runs: list[Run], eval_every: str) -> str:
    """The Markdown table: one row per side and round, then each side's mean over the rounds."""
    target = targets(runs)
    reference = {r.round: time_to_target(r.evals, target[r.round])[1] for r in runs if r.side.key == "c"}
    steps = runs[0].evals[-1]["step"]
    lines = [
        f"Target: the validation loss of (c) at its last step (step {steps}) in each round: "
        + ", ".join(f"round {k}: {v:.4f}" for k, v in target.items())
        + f" nats/token. Evaluations every {eval_every} steps on every side; steps and seconds to the target "
        "interpolated between the evaluations around it; seconds from each process's start (imports, data, "
        "compiling, evaluations and checkpoints included). x (c): seconds to the target over (c)'s in the "
        "same round. Whole run x (c): the side's whole process (every step, the final sample included) over "
        "(c)'s whole process in the same round.", "",
        "| side | config | round | set-up s | steps to target | seconds to target | x (c) | final val loss | "
        "process s | whole run x (c) |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    whole_reference = {r.round: r.process_seconds for r in runs if r.side.key == "c"}
    whole: dict[str, list[float]] = {}
    ratios: dict[str, list[float]] = {}
    for r in runs:
        reached = time_to_target(r.evals, target[r.round])
        cells = ("not reached", "—", "—")
        if reached:
            ratio = reached[1] / reference[r.round]
            ratios.setdefault(r.side.name, []).append(ratio)
            cells = (f"{reached[0]:.0f}", f"{reached[1]:.1f}", f"{ratio:.2f}")
        whole.setdefault(r.side.name, []).append(r.process_seconds / whole_reference[r.round])
        lines.append(f"| {r.side.name} | `{os.path.relpath(r.side.config, ROOT)}` | {r.round} | "
                     f"{r.setup_seconds:.1f} | {' | '.join(cells)} | {r.evals[-1]['val_loss']:.4f} | "
                     f"{r.process_seconds:.1f} | {whole[r.side.name][-1]:.2f} |")
    lines += ["", "Mean over the rounds of x (c): " + "; ".join(
        f"{name} {statistics.mean(v):.2f}" + (f" ({len(v)} of {len(targets(runs))} rounds reached it)"
                                              if len(v) < len(target) else "")
        for name, v in ratios.items()) + ".",
        "Mean over the rounds of whole run x (c): " + "; ".join(
        f"{name} {statistics.mean(v):.2f}" for name, v in whole.items()) + "."]
    return "\n".join(lines)


def plot(runs: list[Run], path: str) -> None:
    """Validation loss against seconds since each process's start, every side and round, with the targets."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"c": "tab:gray", "a": "tab:blue", "b": "tab:orange"}
    styles = ["-", "--", ":", "-."]
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=100)
    for r in runs:
        ax.plot([e["elapsed_seconds"] for e in r.evals], [e["val_loss"] for e in r.evals],
                styles[(r.round - 1) % len(styles)], color=colors[r.side.key], marker=".", lw=1.2,
                label=f"{r.side.name}, round {r.round}")
    target = targets(runs)
    for value in sorted(set(round(v, 4) for v in target.values())):
        ax.axhline(value, color="black", ls=":", lw=0.8)
    low = min(e["val_loss"] for r in runs for e in r.evals)
    ax.set_ylim(low - 0.05, max(target.values()) + 1.0)  # the approach to the target, not the first steps
    ax.set_xlim(left=0)  # from the processes' start: the set-up shows as the gap before the first point
    ax.set_xlabel("wall time since the process started (s)")
    ax.set_ylabel("validation loss (nats per token)")
    ax.set_title("time to quality (dotted: (c)'s loss at its last step)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def parse(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     epilog="Any --config.section.field=value is passed to every side.")
    parser.add_argument("--default", default="configs/modern.py", help="(a)'s config: our default recipe")
    parser.add_argument("--lecture", default="configs/shakespeare.py", help="(b)'s and (c)'s config")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of (c), (a), (b)")
    parser.add_argument("--eval_every", type=int, default=50,
                        help="train.eval_every of every side (0: each config's own)")
    parser.add_argument("--steps", type=int, default=0, help="train.steps of every side (0: each config's own)")
    parser.add_argument("--sides", default="cab", help="which sides run, e.g. 'ca' for (c) and (a) alone")
    parser.add_argument("--figure", default="", help=f"where to save the loss-against-time figure (default "
                        f"{os.path.relpath(DEFAULT_FIGURE, ROOT)} for every side with the default configs and "
                        f"steps, else {os.path.relpath(OTHER_FIGURE, ROOT)})")
    parser.add_argument("--workdir", default="", help="keep the runs here (a new folder); default: a temporary one")
    parser.add_argument("--quick", action="store_true",
                        help=f"short runs: {QUICK['rounds']} round of {QUICK['steps']} steps, an evaluation every "
                             f"{QUICK['eval_every']}")
    args, overrides = parser.parse_known_args(argv)
    if bad := [o for o in overrides if not o.startswith("--config.")]:
        parser.error(f"unknown arguments {bad}; config overrides take the form --config.train.seed=1")
    if args.quick:
        args.steps, args.eval_every, args.rounds = QUICK["steps"], QUICK["eval_every"], QUICK["rounds"]
    pages_own = (sorted(args.sides) == sorted("cab") and not args.steps and not overrides
                 and (args.default, args.lecture) == (parser.get_default("default"), parser.get_default("lecture")))
    args.figure = args.figure or (DEFAULT_FIGURE if pages_own else OTHER_FIGURE)
    if "c" not in args.sides or set(args.sides) - set("cab"):
        parser.error(f"--sides={args.sides!r}: letters of 'cab', with c, the reference that sets the target")
    if args.rounds < 1:
        parser.error(f"--rounds={args.rounds}: run at least one round")
    for path in (args.default, args.lecture):
        if not os.path.isfile(os.path.join(ROOT, path)):
            parser.error(f"no config file {path} (paths are relative to the repository, {ROOT})")
    if args.workdir and os.path.exists(args.workdir) and os.listdir(args.workdir):
        parser.error(f"--workdir {args.workdir} is not empty: the runs need a new folder (train.py would resume)")
    args.default, args.lecture = (os.path.join(ROOT, p) for p in (args.default, args.lecture))
    given = [f"--config.train.steps={args.steps}"] * (args.steps > 0) + \
        [f"--config.train.eval_every={args.eval_every}"] * (args.eval_every > 0)
    return args, given + overrides  # the command line's own overrides last: they win


def main(argv: list[str] | None = None) -> None:
    args, overrides = parse(argv)
    eval_every = str(args.eval_every) if args.eval_every > 0 else "the configs' train.eval_every"
    with tempfile.TemporaryDirectory(prefix="time_to_quality.") as scratch:
        workdir = os.path.abspath(args.workdir or scratch)
        warm_token_cache(args.lecture, overrides)
        runs = [run_side(side, r, os.path.join(workdir, f"round{r}", side.key), overrides)
                for r in range(1, args.rounds + 1) for side in sides(args.default, args.lecture)
                if side.key in args.sides]
    print(table(runs, eval_every))
    default, lecture = (data_order(load_config(p, overrides)) for p in (args.default, args.lecture))
    if "a" in args.sides and default != lecture:
        print("\n**(a) sees other batches than (b) and (c)**: " + ", ".join(
            f"{k} {default.get(k)} against {lecture.get(k)}" for k in sorted(set(default) | set(lecture))
            if default.get(k) != lecture.get(k)) + ".")
    plot(runs, args.figure)
    print(f"wrote {args.figure}", file=sys.stderr)


if __name__ == "__main__":
    main()
