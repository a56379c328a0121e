"""The PyTorch reference of bench/time_to_quality.py: a config's GPT trained in PyTorch the way train.py
trains it, as a process of its own.

    python bench/torch_gpt.py --config configs/shakespeare.py --workdir runs/torch_gpt
    python bench/torch_gpt.py --config configs/shakespeare.py --workdir DIR --config.train.eval_every=50

The model is Hugging Face's GPT2LMHeadModel of the config's shape (bench/steps.py torch_gpt2: learned
positions, exact GELU, layer norm with bias, tied embeddings, float32), its weights drawn after
torch.manual_seed(train.seed). The recipe is the config's: torch.optim.AdamW with optim.py's
weight-decay groups, betas, eps and weight decay, global-norm clipping at optim.grad_clip, and
optim.py's warm-up + cosine schedule (make_schedule's rate at every step, applied through LambdaLR).
The data are train.py's: the corpus tokens from the same token cache, training batch s =
batch_at(seed=train.seed, step=s), the same fixed validation batches (eval_batches). One thread per
core.

workdir/metrics.jsonl gets the rows train.py writes, with the same fields: one when the set-up ends,
{step, loss, learning_rate} every train.log_every steps, {step, val_loss, elapsed_seconds} every
train.eval_every steps and at the last; elapsed_seconds is the wall time since this process started.
Byte tokens and the text task only; there is no resuming (a workdir with metrics.jsonl is refused).
"""

from __future__ import annotations

import time

STARTED = time.perf_counter()  # the process's start, before the heavy imports, as in train.py

import json
import math
import os
import sys

import numpy as np
from absl import app, flags, logging
from ml_collections import ConfigDict, config_flags

from bench.steps import model_config, torch_adamw, torch_gpt2, torch_loss, torch_train_step
from transformer.data.batches import batch_at, eval_batches, with_start_token
from transformer.cli import config_flags_parser
from transformer.training.optimizer import make_schedule
from transformer.training.setup import resolve
from transformer.data.corpus import load_corpus
from transformer.data.tokenizer import make_tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository
DEFAULT_CACHE_DIR = os.path.join(ROOT, ".cache", "tokens")  # train.py's: the same token cache
DEFAULT_CONFIG = os.path.join(ROOT, "configs", "shakespeare.py")

FLAGS = flags.FLAGS


def load_tokens(config: ConfigDict) -> tuple[np.ndarray, np.ndarray]:
    """The corpus's (training, validation) tokens [N_train], [N_val] as train.py loads them: the
    config's data.path, byte tokens, data.val_fraction, the token cache (data.cache_dir, "" = train.py's)."""
    if config.data.tokenizer != "bytes" or config.data.task != "text":
        raise ValueError(f"the PyTorch reference trains on byte tokens of text (data.tokenizer='bytes', "
                         f"data.task='text'); this config has {config.data.tokenizer!r}, {config.data.task!r}")
    config = resolve(config, DEFAULT_CACHE_DIR)
    corpus = load_corpus(config.data.path or None, make_tokenizer("bytes"), config.data.cache_dir,
                         config.data.val_fraction)
    return corpus.train, corpus.val


def training_batch(config: ConfigDict, tokens: np.ndarray, step: int) -> tuple[np.ndarray, np.ndarray]:
    """Training batch `step`, as train.py draws it: (inputs, targets) int32 [B, T]."""
    t = config.train
    batch = batch_at(tokens, seed=t.seed, step=step, batch_size=t.batch_size, seq_len=t.seq_len)
    return with_start_token(batch, config.data.start_token)


def validation_batches(config: ConfigDict, tokens: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """train.py's fixed validation batches: train.eval_batches (inputs, targets) pairs, int32 [B, T]."""
    t = config.train
    return [with_start_token(b, config.data.start_token) for b in eval_batches(
        tokens, num_batches=t.eval_batches, batch_size=t.batch_size, seq_len=t.seq_len)]


def init_model(config: ConfigDict):
    """The config's model as a GPT2LMHeadModel, its weights drawn after torch.manual_seed(train.seed)."""
    import torch

    torch.manual_seed(config.train.seed)
    return torch_gpt2(model_config(config.model))


def as_torch(batch: tuple[np.ndarray, np.ndarray]) -> tuple:
    """(inputs, targets) int32 [B, T] -> int64 tensors, the index type PyTorch's embedding wants."""
    import torch

    return tuple(torch.from_numpy(np.asarray(x, dtype=np.int64)) for x in batch)


def evaluate(model, eval_set: list[tuple]) -> float:
    """The mean loss over the validation batches (tensors), as train.py's evaluate averages them."""
    import torch

    model.eval()
    with torch.inference_mode():
        loss = float(np.mean([float(torch_loss(model, x, y)) for x, y in eval_set]))
    model.train()
    return loss


def train(config: ConfigDict, workdir: str, started: float) -> dict:
    """Trains train.steps steps from scratch, writing workdir/metrics.jsonl; returns the last evaluation.

    started: the time.perf_counter() that elapsed_seconds counts from (the process's start).
    """
    import torch

    metrics_path = os.path.join(workdir, "metrics.jsonl")
    if os.path.exists(metrics_path):
        raise ValueError(f"{metrics_path} exists: the PyTorch reference does not resume; give a new --workdir")
    torch.set_num_threads(os.cpu_count() or 1)
    t, o = config.train, config.optim
    train_tokens, val_tokens = load_tokens(config)
    eval_set = [as_torch(b) for b in validation_batches(config, val_tokens)]
    model = init_model(config).train()
    optimizer = torch_adamw(model, o)
    rates = np.asarray(make_schedule(o, t.steps)(np.arange(t.steps + 1)), dtype=np.float64)  # step -> rate
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: rates[min(s, t.steps)] / o.learning_rate)
    os.makedirs(workdir, exist_ok=True)
    last_eval: dict = {}
    with open(metrics_path, "a", buffering=1) as log:  # line-buffered, as MetricWriter's

        def write(row: dict) -> None:
            log.write(json.dumps(row) + "\n")

        write({"step": 0, "elapsed_seconds": time.perf_counter() - started})  # the set-up's end
        print(f"model: GPT2LMHeadModel, {sum(p.numel() for p in model.parameters()):,} parameters; "
              f"PyTorch {torch.__version__}, {torch.get_num_threads()} threads; set up in "
              f"{time.perf_counter() - started:.1f} s", flush=True)
        for step in range(t.steps):
            inputs, targets = as_torch(training_batch(config, train_tokens, step))
            rate = optimizer.param_groups[0]["lr"]
            loss = torch_train_step(model, optimizer, inputs, targets, o.grad_clip)
            schedule.step()
            done = step + 1
            if done % t.log_every == 0 or done == t.steps:
                value = float(loss)
                if not math.isfinite(value):
                    raise ValueError(f"the training loss became {value} at step {done}")
                write({"step": done, "loss": value, "learning_rate": rate})
            if done % t.eval_every == 0 or done == t.steps:
                last_eval = {"step": done, "val_loss": evaluate(model, eval_set)}
                last_eval["elapsed_seconds"] = time.perf_counter() - started
                write(last_eval)
                print(f"step {done}: val loss {last_eval['val_loss']:.4f} nats/token", flush=True)
    print(f"done: step {t.steps} in {time.perf_counter() - started:.0f} s", flush=True)
    return last_eval


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}; overrides take the form --config.train.steps=10")
    if not FLAGS["verbosity"].present:  # the libraries' INFO lines, hidden as train.py hides them
        logging.set_verbosity(logging.WARNING)
    try:
        train(FLAGS.config, FLAGS.workdir, STARTED)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    config_flags.DEFINE_config_file("config", None, f"Config file (get_config()); default {DEFAULT_CONFIG}.")
    flags.DEFINE_string("workdir", None, "Folder for metrics.jsonl.", required=True)
    app.run(main, flags_parser=config_flags_parser(DEFAULT_CONFIG))
