"""Plot a run's training and validation loss from its metrics.jsonl.

    python scripts/plot_metrics.py runs/NAME/metrics.jsonl runs/NAME/loss_curve.png   # = make plot RUN=runs/NAME
    python scripts/plot_metrics.py runs/NAME runs/NAME/loss_curve.png                 # the run's folder works too
"""

from __future__ import annotations

import argparse
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from transformer.cli import exit_with_error  # noqa: E402
from transformer.run.metrics import read_metrics  # noqa: E402


def metrics_file(path: str) -> str:
    """`path` itself, or `path`/metrics.jsonl for a run's folder; SystemExit if there is none."""
    file = os.path.join(path, "metrics.jsonl") if os.path.isdir(path) else path
    if not os.path.isfile(file):
        raise SystemExit(
            f"no metrics file at {file}: train the run first (`make train`, or `python train.py --config ... "
            "--workdir RUN`), then plot RUN/metrics.jsonl")
    return file


def plot(metrics_path: str, out_path: str, target: float | None = None) -> None:
    metrics_path = metrics_file(metrics_path)
    kind = os.path.splitext(out_path)[1].lstrip(".").lower()
    if kind not in Figure().canvas.get_supported_filetypes():
        raise SystemExit(f"cannot write {out_path!r}: name the output file with an image extension such as .png")
    rows = read_metrics(metrics_path)
    train = {r["step"]: r["loss"] for r in rows if "loss" in r}  # a resumed run overwrites its repeats
    val = {r["step"]: r["val_loss"] for r in rows if "val_loss" in r}
    if not train:
        raise SystemExit(f"{metrics_path} holds no training rows yet: let the run log a few steps first")
    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=100)
    ax.plot(sorted(train), [train[s] for s in sorted(train)], label="train (batch)", lw=1)
    ax.plot(sorted(val), [val[s] for s in sorted(val)], "o-", label="validation", lw=1.5)
    if target is not None:
        ax.axhline(target, color="gray", ls="--", lw=1, label=f"target {target}")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats per token)")
    ax.set_title(os.path.basename(os.path.dirname(os.path.abspath(metrics_path))))
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    fig.savefig(out_path)
    plt.close(fig)
    print(f"wrote {out_path}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("metrics", help="a run's metrics.jsonl, or the run's folder")
    p.add_argument("out", help="the image to write, e.g. runs/NAME/loss_curve.png")
    p.add_argument("--target", type=float, default=None, help="draw a horizontal line at this loss")
    a = p.parse_args()
    try:
        plot(a.metrics, a.out, a.target)
    except (OSError, ValueError) as e:  # an output folder that cannot be written, say
        exit_with_error(e)


if __name__ == "__main__":
    main()
