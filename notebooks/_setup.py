"""What the notebooks share: smoke mode, plots, and a small trained model.

The notebooks import the installed project (`make notebooks` installs it editable: transformer,
configs); this file is imported from beside them (Jupyter starts a notebook's kernel in notebooks/).

Environment variables (a relative path is read from the current folder if it exists there, else
from the repository root: Jupyter starts a notebook's kernel in notebooks/, and the README names
paths from the root, so NOTEBOOK_CHECKPOINT=runs/NAME works from either):
  NOTEBOOK_CHECKPOINT   workdir of a trained run (holding checkpoints/) to use instead of training one.
  NOTEBOOK_WORKDIR      where the notebooks' own model is trained (default runs/notebook_model, or a
                        temporary folder in smoke mode).
  NOTEBOOK_FIGURES      folder for the figures the notebooks save (default: figures/ in the run's
                        folder, the one of the two above in use). Only `make figures` sets it, to
                        docs/figures: exploring never rewrites the committed figures.
  NOTEBOOK_DATA         the text a run was trained on (file, folder or glob), when the run's own
                        data.path is not found (a relative data.path is read from the repository root,
                        where train.py runs).
  NOTEBOOK_SMOKE=1      tiny model, few steps (the tests); the default run and its figures go to a
                        temporary folder (in the repository only the git-ignored .cache/tokens is written).
  TRANSFORMER_ROOT      the repository whose runs/, .cache/ and train.py are used (default: the folder
                        above this file); the packages imported are the installed project's.
"""

import contextlib
import functools
import importlib.util
import os
import sys
import tempfile
from collections.abc import Mapping

import matplotlib.pyplot as plt
from absl import logging as absl_logging

ROOT = os.path.abspath(os.environ.get("TRANSFORMER_ROOT") or os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
SMOKE = os.environ.get("NOTEBOOK_SMOKE", "") not in ("", "0")
TOKEN_CACHE = os.path.join(ROOT, ".cache", "tokens")  # git-ignored; train.py uses the same cache

absl_logging.set_verbosity(absl_logging.ERROR)  # orbax's notes on read-only checkpoint folders

plt.rcParams.update({"figure.dpi": 80, "savefig.dpi": 100, "font.size": 10, "axes.titlesize": 10})


def resolve(path: str) -> str:
    """`path` from the current folder if it exists there (or is absolute), else from the repository root."""
    path = os.path.expanduser(path)
    return os.path.abspath(path) if os.path.isabs(path) or os.path.exists(path) else os.path.join(ROOT, path)


@functools.cache
def _smoke_workdir() -> str:
    return tempfile.mkdtemp(prefix="notebook-smoke-")


def run_folder(env: Mapping[str, str] = os.environ, smoke: bool = SMOKE) -> str:
    """The run the notebooks use: NOTEBOOK_CHECKPOINT, else NOTEBOOK_WORKDIR, else runs/notebook_model
    (a temporary folder in smoke mode)."""
    for name in ("NOTEBOOK_CHECKPOINT", "NOTEBOOK_WORKDIR"):
        if env.get(name):
            return resolve(env[name])
    return _smoke_workdir() if smoke else os.path.join(ROOT, "runs", "notebook_model")


def figures_folder(env: Mapping[str, str] = os.environ, smoke: bool = SMOKE) -> str:
    """Where save_figure writes: NOTEBOOK_FIGURES if set, else figures/ in the run's folder."""
    if env.get("NOTEBOOK_FIGURES"):
        return resolve(env["NOTEBOOK_FIGURES"])
    return os.path.join(run_folder(env, smoke), "figures")


def save_figure(fig, name: str) -> str:
    """Writes `fig` to <figures_folder()>/<name>.png and returns the path."""
    folder = figures_folder()
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{name}.png")
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


def load_model():
    """(cfg, params, tokenizer, workdir): NOTEBOOK_CHECKPOINT's model, else the notebooks' own one,
    trained first if its workdir holds no finished run (a stopped run resumes)."""
    from transformer.checkpoint import Checkpointer, restore_for_inference

    workdir = run_folder()
    if os.environ.get("NOTEBOOK_CHECKPOINT"):
        if not os.path.isdir(workdir):
            raise FileNotFoundError(
                f"NOTEBOOK_CHECKPOINT={os.environ['NOTEBOOK_CHECKPOINT']!r} is not a folder, neither from "
                f"{os.getcwd()} nor from the repository root {ROOT}. Set it to the --workdir of a trained "
                "run (e.g. runs/shakespeare after `make train`), or unset it to train the notebooks' own model.")
    else:
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


@functools.cache
def _train_script():
    """The repository's train.py (a script beside the packages, not one of them), loaded from ROOT once."""
    spec = importlib.util.spec_from_file_location("train", os.path.join(ROOT, "train.py"))
    module = sys.modules["train"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _train(config, workdir: str) -> None:
    train = _train_script()
    os.makedirs(workdir, exist_ok=True)
    log = os.path.join(workdir, "train.log")
    print(f"training {config.train.steps} steps into {workdir} (progress in train.log there) ...", flush=True)
    with open(log, "a") as f, contextlib.redirect_stdout(f):  # the evaluation lines and sample
        metrics = train.train(config, workdir, progress=False)
    print(f"done: validation loss {metrics['val_loss']:.3f} nats/token "
          f"({metrics['val_bits_per_byte']:.2f} bits/byte) after {metrics['step']} steps")


def data_path(workdir: str) -> str | None:
    """The text the run in `workdir` was trained on: NOTEBOOK_DATA if set, else the run's data.path
    (a relative one from the repository root); None for the bundled plays. Raises FileNotFoundError
    naming the path and the fix if no text is there."""
    from transformer.checkpoint import Checkpointer
    from transformer.corpus import corpus_files

    if os.environ.get("NOTEBOOK_DATA"):
        given, path = f"NOTEBOOK_DATA={os.environ['NOTEBOOK_DATA']!r}", resolve(os.environ["NOTEBOOK_DATA"])
    else:
        saved = Checkpointer(workdir, read_only=True).config()["data"]["path"]
        if not saved:
            return None
        given, path = f"the run's data.path {saved!r}", os.path.join(ROOT, os.path.expanduser(saved))
    try:
        corpus_files(path)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{given}: no text at {path} (run {workdir}). Set NOTEBOOK_DATA to the file, folder or glob the "
            "run was trained on (in the shell that starts Jupyter, or `%env NOTEBOOK_DATA=...` in the "
            "notebook) and run the cell again.") from None
    return path


def validation_tokens(workdir: str, tokenizer):
    """The validation split of the corpus the run in `workdir` was trained on (1-D token array),
    from the run's token cache if its data.cache_dir is still there, else from .cache/tokens."""
    from transformer.checkpoint import Checkpointer
    from transformer.token_cache import load_corpus

    saved = Checkpointer(workdir, read_only=True).config()["data"]
    cache = os.path.join(ROOT, os.path.expanduser(saved["cache_dir"]))
    cache = cache if os.path.isdir(cache) else TOKEN_CACHE
    return load_corpus(data_path(workdir), tokenizer, cache, saved["val_fraction"]).val
