"""docs/experiments/default_run.json from a timed `make train` and the run it wrote.

    rm -rf runs/shakespeare
    /usr/bin/time -f "WALL %e s" make train > runs/make_train.log 2>&1
    python scripts/default_run.py --log runs/make_train.log --workdir runs/shakespeare \
        --out docs/experiments/default_run.json

From the log: the model line's parameter count, train.py's closing line (its wall time, compile time
and training tokens/s) and /usr/bin/time's WALL line (the whole command, sample included). From the
run's metrics.jsonl: the validation loss at every evaluation. From its config.json: steps and batch.
A log without those lines, or a run that did not reach train.steps, is refused: the page would read
numbers of an unfinished run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import re
import sys

from transformer.run.metrics import read_metrics

PARAMETERS = re.compile(r"^model: ([\d,]+) parameters", re.MULTILINE)
DONE = re.compile(r"^done: step (\d+) of (\d+) in (\d+) s \(([\d.]+) s compiling; ([\d,]+) tokens/s training\)",
                  re.MULTILINE)
WALL = re.compile(r"^WALL ([\d.]+) s$", re.MULTILINE)


def read_log(text: str) -> dict:
    """{parameters, train_py_seconds, compile_seconds, tokens_per_second, command_seconds} from a
    timed `make train`'s output."""
    found = {name: pattern.search(text) for name, pattern in (("model line", PARAMETERS), ("done line", DONE),
                                                               ("WALL line", WALL))}
    missing = [name for name, match in found.items() if match is None]
    if missing:
        raise ValueError(f"the log has no {', '.join(missing)}: time the whole command as the docstring shows "
                         "(/usr/bin/time -f 'WALL %e s' make train > LOG 2>&1) and let it finish")
    done = found["done line"]
    if done[1] != done[2]:
        raise ValueError(f"the run stopped at step {done[1]} of {done[2]}: rerun `make train` to the end")
    return {"parameters": int(found["model line"][1].replace(",", "")), "train_py_seconds": int(done[3]),
            "compile_seconds": float(done[4]), "tokens_per_second": int(done[5].replace(",", "")),
            "command_seconds": round(float(found["WALL line"][1]))}


def read_run(workdir: str) -> dict:
    """{steps, batch_size, seq_len, val_loss_at: {step: loss}} of a finished run."""
    if not os.path.isfile(os.path.join(workdir, "config.json")):
        raise FileNotFoundError(f"no run in {workdir}: run `make train` (or give --workdir the run's folder)")
    with open(os.path.join(workdir, "config.json")) as f:
        train = json.load(f)["train"]
    evals = {r["step"]: r["val_loss"] for r in read_metrics(os.path.join(workdir, "metrics.jsonl")) if "val_loss" in r}
    if train["steps"] not in evals:
        raise ValueError(f"{workdir} has no evaluation at its last step {train['steps']}: rerun `make train` to the end")
    return {"steps": train["steps"], "batch_size": train["batch_size"], "seq_len": train["seq_len"],
            "val_loss_at": {str(step): round(loss, 4) for step, loss in sorted(evals.items())}}


def summary(log: dict, run: dict, date: str) -> dict:
    val_loss = run["val_loss_at"][str(run["steps"])]
    return {"command": "make train (python train.py --config configs/modern.py --workdir runs/shakespeare)",
            "source": "python scripts/default_run.py --log runs/make_train.log --workdir runs/shakespeare "
                      "(a timed make train on a quiet machine)", "date": date,
            "parameters_millions": round(log["parameters"] / 1e6, 2), **run, "val_loss": val_loss,
            "bits_per_byte": round(val_loss / math.log(2), 2),
            **{k: log[k] for k in ("command_seconds", "train_py_seconds", "compile_seconds", "tokens_per_second")}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--log", required=True, help="the timed make train's output")
    p.add_argument("--workdir", default="runs/shakespeare", help="the run it wrote")
    p.add_argument("--out", help="write the summary here as JSON")
    args = p.parse_args(argv)
    try:
        if not os.path.isfile(args.log):
            raise FileNotFoundError(f"no log {args.log}: write it first, as the docstring shows")
        with open(args.log, encoding="utf-8", errors="replace") as f:
            log = read_log(f.read())
        result = summary(log, read_run(args.workdir), datetime.date.today().isoformat())
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    text = json.dumps(result, indent=1) + "\n"
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
