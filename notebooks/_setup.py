"""What the notebooks share: the repository on sys.path, smoke mode, plots, and a small trained model.

Environment variables:
  NOTEBOOK_SMOKE=1      tiny model, few steps (the tests); runs and figures go to temporary folders
                        (only the git-ignored token cache .cache/tokens may be written).
  NOTEBOOK_CHECKPOINT   workdir of a trained run (holding checkpoints/) to use instead of training one.
  NOTEBOOK_WORKDIR      where the notebooks' own model is trained (default runs/notebook_model, or a
                        temporary folder in smoke mode).
  TRANSFORMER_ROOT      the repository (default: the folder above this file).
"""

import contextlib
import os
import sys
import tempfile

ROOT = os.path.abspath(os.environ.get("TRANSFORMER_ROOT") or os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
SMOKE = os.environ.get("NOTEBOOK_SMOKE", "") not in ("", "0")
TOKEN_CACHE = os.path.join(ROOT, ".cache", "tokens")  # git-ignored; train.py uses the same cache
FIGURES = tempfile.mkdtemp(prefix="notebook-figures-") if SMOKE else os.path.join(ROOT, "docs", "figures")

import matplotlib.pyplot as plt  # noqa: E402
from absl import logging as absl_logging  # noqa: E402

absl_logging.set_verbosity(absl_logging.ERROR)  # orbax's notes on read-only checkpoint folders

plt.rcParams.update({"figure.dpi": 80, "savefig.dpi": 100, "font.size": 10, "axes.titlesize": 10})


def save_figure(fig, name: str) -> str:
    """Writes `fig` to docs/figures/<name>.png (a temporary folder in smoke mode)."""
    os.makedirs(FIGURES, exist_ok=True)
    path = os.path.join(FIGURES, f"{name}.png")
    fig.savefig(path, bbox_inches="tight", facecolor="white")
    return path


def train_config():
    """The notebooks' model: configs/shakespeare.py made smaller and shorter (tiny.py in smoke mode)."""
    if SMOKE:
        from configs import tiny

        c = tiny.get_config()
        c.train.steps = 10
    else:
        from configs import shakespeare

        c = shakespeare.get_config()
        c.model.d_model = 128  # 4 layers x 4 heads of width 32
        c.model.num_heads = 4
        c.train.steps = 500  # ~2 minutes on 2 CPU cores
        c.train.batch_size = 16
        c.train.eval_every = 250
        c.train.checkpoint_every = 500
        c.train.eval_batches = 4
        c.optim.learning_rate = 3e-3
        c.optim.warmup_steps = 50
    c.train.sample_tokens = 0
    c.data.cache_dir = TOKEN_CACHE
    return c


def _workdir() -> str:
    if os.environ.get("NOTEBOOK_WORKDIR"):
        return os.environ["NOTEBOOK_WORKDIR"]
    return tempfile.mkdtemp(prefix="notebook-smoke-") if SMOKE else os.path.join(ROOT, "runs", "notebook_model")


def load_model():
    """(cfg, params, tokenizer, workdir): NOTEBOOK_CHECKPOINT's model, else the notebooks' own one,
    trained first if its workdir holds no finished run (a stopped run resumes)."""
    from transformer.checkpoint import Checkpointer, restore_for_inference

    workdir = os.environ.get("NOTEBOOK_CHECKPOINT")
    if not workdir:
        workdir = _workdir()
        config = train_config()
        done = os.path.isdir(os.path.join(workdir, "checkpoints")) and (
            Checkpointer(workdir, read_only=True).latest_step() or 0) >= config.train.steps
        if not done:
            _train(config, workdir)
    cfg, params, tokenizer = restore_for_inference(workdir)
    print(f"model: {_describe(workdir)}")
    return cfg, params, tokenizer, workdir


def _describe(workdir: str) -> str:
    """'runs/notebook_model, step 500, validation loss 2.099 nats/token' (what the workdir records)."""
    from transformer.checkpoint import Checkpointer
    from transformer.metrics import read_metrics

    name = os.path.relpath(workdir, ROOT) if os.path.abspath(workdir).startswith(ROOT + os.sep) else workdir
    text = f"{name}, step {Checkpointer(workdir, read_only=True).latest_step()}"
    metrics = os.path.join(workdir, "metrics.jsonl")
    losses = [r["val_loss"] for r in read_metrics(metrics) if "val_loss" in r] if os.path.exists(metrics) else []
    return text + (f", validation loss {losses[-1]:.3f} nats/token" if losses else "")


def _train(config, workdir: str) -> None:
    import train  # the repository's train.py

    os.makedirs(workdir, exist_ok=True)
    log = os.path.join(workdir, "train.log")
    print(f"training {config.train.steps} steps into {workdir} (progress in train.log there) ...", flush=True)
    with open(log, "a") as f, contextlib.redirect_stdout(f):  # the evaluation lines and sample
        metrics = train.train(config, workdir, progress=False)
    print(f"done: validation loss {metrics['val_loss']:.3f} nats/token "
          f"({metrics['val_bits_per_byte']:.2f} bits/byte) after {metrics['step']} steps")


def validation_tokens(workdir: str, tokenizer):
    """The validation split of the corpus the run in `workdir` was trained on (1-D token array)."""
    from transformer import data
    from transformer.checkpoint import Checkpointer

    d = Checkpointer(workdir, read_only=True).config()["data"]
    return data.load_corpus(d["path"] or None, tokenizer, TOKEN_CACHE, d["val_fraction"]).val
