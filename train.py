"""Train a decoder from a config file.

    python train.py --config configs/shakespeare.py --workdir runs/shakespeare
    python train.py --config configs/llama.py --workdir runs/llama --config.train.steps=2000

Any config field can be overridden from the command line (--config.section.field=value).
Starting in a workdir that has checkpoints resumes from the latest one. SIGTERM (or Ctrl-C)
saves a checkpoint and exits; a kill -9 loses at most the steps since the last checkpoint.
Metrics go to the console, to workdir/metrics.jsonl and to TensorBoard files in workdir/tb.
"""

from __future__ import annotations

import json
import math
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from absl import app, flags
from ml_collections import config_flags

if TYPE_CHECKING:  # for annotations only: the functions import jax and the model code when run
    import jax
    import numpy as np
    from jax.sharding import Mesh
    from ml_collections import ConfigDict
    from optax import GradientTransformation
    from tqdm import tqdm

    from transformer.checkpoint import Checkpointer
    from transformer.config import ModelConfig
    from transformer.data import Prefetcher
    from transformer.metrics import MetricWriter
    from transformer.tokenizer import Tokenizer
    from transformer.training import TrainState

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", "configs/shakespeare.py", "Config file (get_config()).")
flags.DEFINE_string("workdir", None, "Folder for checkpoints, metrics and the tokenizer.", required=True)


def maybe_initialize_distributed() -> None:
    """Joins a multi-host run when the environment describes one (see the README)."""
    import jax

    if os.environ.get("JAX_COORDINATOR_ADDRESS") or os.environ.get("JAX_NUM_PROCESSES"):
        jax.distributed.initialize()


class StopOnSignal:
    """While active, SIGTERM / SIGINT set `requested`: the loop saves and exits at the next step.

    A context manager, so the previous handlers come back afterwards (Ctrl-C in a notebook kernel
    works again once train() returns).
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        self.requested = False
        self.previous = {}

    def __enter__(self) -> "StopOnSignal":
        for sig in self.SIGNALS:
            self.previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        self.requested = True

    def __exit__(self, *exc_info) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


class Diverged(RuntimeError):
    """The loss became NaN or infinite."""


def train(config: ConfigDict, workdir: str, progress: bool = True) -> dict:
    """Runs (or resumes) training; returns the last evaluation's metrics.

    progress=False hides the progress bar (e.g. in a notebook); metrics still go to the workdir.
    """
    from tqdm import tqdm

    from transformer.checkpoint import save_json
    from transformer.metrics import MetricWriter

    run = set_up_run(config, workdir)
    t = config.train
    start = int(run.state.step)
    writer = MetricWriter(workdir, enabled=run.host == 0)
    save_json(os.path.join(workdir, "config.json"), config.to_dict())
    batches = training_batches(run, start)
    throughput = Throughput(start, tokens_per_step=t.batch_size * t.seq_len)
    bar = tqdm(total=t.steps, initial=start, disable=run.host != 0 or not progress, dynamic_ncols=True,
               file=sys.stdout)
    end = t.steps if t.run_steps <= 0 else min(t.steps, start + t.run_steps)  # run_steps: a part, then resume
    with StopOnSignal() as stop:
        try:
            done, last_eval = train_steps(run, batches, Report(writer, throughput, bar), stop, start, end)
        finally:
            bar.close()
            batches.close()
            run.ckpt.wait()  # saves are asynchronous: the last one must be on disk before we return
            writer.close()

    if done == t.steps and t.sample_tokens and run.host == 0:
        print_sample(run.cfg, run.state.params, run.tokenizer, t.sample_tokens, t.seed)
    return last_eval


# --- set-up ------------------------------------------------------------------------------------


@dataclass
class Run:
    """The pieces of one training run, built by `set_up_run`. Only `state` changes as it trains."""

    config: ConfigDict
    cfg: ModelConfig
    tokenizer: Tokenizer
    ckpt: Checkpointer
    state: TrainState
    train_step: Callable  # (state, inputs, targets) -> (state, metrics); donates the state
    eval_step: Callable  # (params, inputs, targets) -> mean loss
    put: Callable  # a host-local batch -> a global array split over the mesh
    train_tokens: np.ndarray
    eval_set: list[tuple[jax.Array, jax.Array]]  # fixed validation batches, on the mesh
    bytes_per_token: float
    flops_per_token: float
    host: int
    hosts: int


def set_up_run(config: ConfigDict, workdir: str) -> Run:
    """Tokenizer, corpus, mesh, optimizer, checkpointer, state and compiled steps for a run.

    The state is the latest checkpoint's when the workdir has one (the run resumes).
    """
    import jax

    from transformer import data, training
    from transformer.checkpoint import Checkpointer
    from transformer.config import ModelConfig
    from transformer.model import count_params

    cfg = ModelConfig.from_dict(config.model)
    t = config.train
    check_train_config(config, cfg)
    os.makedirs(workdir, exist_ok=True)
    host, hosts = jax.process_index(), jax.process_count()
    tokenizer = load_or_make_tokenizer(config, cfg, workdir)
    train_tokens, val_tokens, bytes_per_token = data.load_corpus(
        config.data.path or None, tokenizer, config.data.cache_dir, config.data.val_fraction
    )

    mesh = training.make_mesh(config.mesh.data, config.mesh.fsdp)
    tx, schedule = training.make_optimizer(config.optim, t.steps)
    ckpt = Checkpointer(workdir, keep=t.keep_checkpoints)
    state = create_or_restore_state(config, cfg, tx, mesh, ckpt)

    num_params = count_params(state.params)
    flops_per_token = training.flops_per_token(cfg, num_params, t.seq_len)
    print(f"model: {num_params:,} parameters, {flops_per_token / 1e6:.1f} MFLOP per token "
          f"(6N + 12 L T d); {len(jax.devices())} device(s), mesh {dict(mesh.shape)}")
    train_step = training.make_train_step(cfg, tx, schedule, mesh, state, t.grad_accum)
    eval_step = training.make_eval_step(cfg, mesh, state)
    put = lambda x: jax.make_array_from_process_local_data(training.batch_sharding(mesh), x)  # noqa: E731
    eval_set = [
        (put(x), put(y))
        for x, y in data.eval_batches(val_tokens, num_batches=t.eval_batches, batch_size=t.batch_size,
                                      seq_len=t.seq_len, host_index=host, host_count=hosts)
    ]
    return Run(config=config, cfg=cfg, tokenizer=tokenizer, ckpt=ckpt, state=state, train_step=train_step,
               eval_step=eval_step, put=put, train_tokens=train_tokens, eval_set=eval_set,
               bytes_per_token=bytes_per_token, flops_per_token=flops_per_token, host=host, hosts=hosts)


def load_or_make_tokenizer(config: ConfigDict, cfg: ModelConfig, workdir: str) -> Tokenizer:
    """The run's tokenizer: the one saved in the workdir, else the imported model's, else a new one.

    It is saved with the run, so a resumed run and sample.py encode the same way.
    """
    from transformer import data
    from transformer.tokenizer import load_tokenizer, make_tokenizer, save_tokenizer

    tok_dir = os.path.join(workdir, "tokenizer")
    hf_tokenizer = config.init_from_hf and os.path.isfile(os.path.join(config.init_from_hf, "tokenizer.json"))
    if os.path.isdir(tok_dir):
        tokenizer = load_tokenizer(tok_dir)
    elif hf_tokenizer:  # imported weights only make sense with the ids they were trained on
        tokenizer = load_tokenizer(config.init_from_hf)
        save_tokenizer(tokenizer, tok_dir)
    else:
        texts = [] if config.data.tokenizer == "bytes" else data.load_texts(config.data.path or None)
        tokenizer = make_tokenizer(config.data.tokenizer, texts, config.data.vocab_size)
        save_tokenizer(tokenizer, tok_dir)
    if tokenizer.vocab_size > cfg.vocab_size:
        raise ValueError(
            f"the tokenizer has {tokenizer.vocab_size} tokens but model.vocab_size={cfg.vocab_size}; "
            f"set --config.model.vocab_size={tokenizer.vocab_size}"
        )
    return tokenizer


def create_or_restore_state(config: ConfigDict, cfg: ModelConfig, tx: GradientTransformation, mesh: Mesh,
                            ckpt: Checkpointer) -> TrainState:
    """The latest checkpoint's state if there is one (resume), else a new one at step 0.

    A new state starts from the weights in config.init_from_hf when set, else from a random init.
    """
    from transformer import training

    resuming = ckpt.latest_step() is not None
    params = None
    if config.init_from_hf and not resuming:  # a resumed run has its own weights in the checkpoint
        from transformer.hf import check_same_architecture, from_hf

        hf_cfg, params = from_hf(config.init_from_hf, scan_layers=cfg.scan_layers)
        check_same_architecture(hf_cfg, cfg)
    state = training.create_state(cfg, tx, config.train.seed, mesh, params)
    if resuming:  # the fresh state gives the shapes and shardings to restore into
        state = ckpt.restore_state(state, config.model)
        print(f"resumed from the checkpoint at step {int(state.step)} in {ckpt.directory}")
    return state


def training_batches(run: Run, start: int) -> Prefetcher:
    """Batches for steps start, start + 1, ..., loaded in a background thread.

    Batch s depends only on (seed, s), so a resumed run sees the batches an unbroken run would.
    """
    from transformer import data

    t = run.config.train
    return data.Prefetcher(
        lambda s: data.batch_at(run.train_tokens, seed=t.seed, step=s, batch_size=t.batch_size,
                                seq_len=t.seq_len, host_index=run.host, host_count=run.hosts),
        start,
    )


# --- the loop ----------------------------------------------------------------------------------


class Throughput:
    """Training tokens per second over the steps since the last `restart`."""

    def __init__(self, step: int, tokens_per_step: int):
        self.tokens_per_step = tokens_per_step
        self.restart(step)

    def restart(self, step: int) -> None:
        """Starts a new window at `step`."""
        self.time, self.step = time.perf_counter(), step

    def tokens_per_sec(self, step: int) -> float:
        """Tokens per second from the window's start to `step`, now."""
        elapsed = time.perf_counter() - self.time
        return (step - self.step) * self.tokens_per_step / max(elapsed, 1e-9)


@dataclass
class Report:
    """Where the loop reports: metric rows (metrics.jsonl, TensorBoard) and the progress bar."""

    writer: MetricWriter
    throughput: Throughput
    bar: tqdm


def train_steps(run: Run, batches: Prefetcher, report: Report, stop: StopOnSignal, start: int,
                end: int) -> tuple[int, dict]:
    """Trains until `end` steps are done or a stop is requested, logging, evaluating and saving on
    the config's schedule; returns the number of steps done and the last evaluation.
    """
    t = run.config.train
    last_eval: dict = {}
    pending = None  # the previous step's metrics: read one step late so the host never stalls
    done = start
    for step in range(start, end):
        metrics = take_step(run, batches)
        done = step + 1
        if pending is not None:
            check_finite(*pending)
        pending = (done, metrics)
        stopping = stop.requested  # read once: a signal arriving mid-iteration waits a step
        last = done == end or stopping
        log_due = done % t.log_every == 0 or last
        eval_due = done % t.eval_every == 0 or done == t.steps
        save_due = done % t.checkpoint_every == 0 or last
        if log_due or eval_due or save_due:
            check_finite(*pending)  # never log, evaluate or save a diverged state
        if log_due:
            log_train_metrics(run, report, done, metrics)
        if eval_due:
            last_eval = evaluate(run, done)
            log_evaluation(report, last_eval)
        if save_due:
            last_eval = save_checkpoint(run, report, done, last_eval)
        report.bar.update(1)
        if stopping:
            report.bar.write(f"stop requested: saved the checkpoint at step {done}; rerun to resume")
            break
    return done, last_eval


def take_step(run: Run, batches: Prefetcher) -> dict:
    """One optimizer step on the next batch; advances run.state and returns the step's metrics.

    The metrics stay on the device: reading them waits for the step to finish.
    """
    inputs, targets = next(batches)
    run.state, metrics = run.train_step(run.state, run.put(inputs), run.put(targets))
    return metrics


def log_train_metrics(run: Run, report: Report, step: int, metrics: dict) -> None:
    """Writes the step's training metrics and the throughput since the last row; shows them on the bar."""
    tps = report.throughput.tokens_per_sec(step)
    row = {"step": step, **{k: float(v) for k, v in metrics.items()},
           "tokens_per_sec": tps, "mfu": tps * run.flops_per_token / run.config.train.peak_flops}
    report.writer.write(row)
    report.bar.set_postfix(loss=f"{row['loss']:.3f}", lr=f"{row['learning_rate']:.2e}",
                           tok_s=f"{tps:,.0f}", mfu=f"{row['mfu']:.2f}")
    report.throughput.restart(step)  # after writing, so the next window times training only


def evaluate(run: Run, step: int) -> dict:
    """The validation loss of the current parameters (and its perplexity and bits per byte)."""
    import numpy as np

    loss = float(np.mean([float(run.eval_step(run.state.params, x, y)) for x, y in run.eval_set]))
    return {"step": step, "val_loss": loss, "val_perplexity": math.exp(min(loss, 50.0)),
            "val_bits_per_byte": loss / math.log(2) / run.bytes_per_token}


def log_evaluation(report: Report, evaluation: dict) -> None:
    """Writes an evaluation row and prints it above the progress bar."""
    report.writer.write(evaluation)
    report.bar.write(f"step {evaluation['step']}: val loss {evaluation['val_loss']:.4f} nats/token, "
                     f"{evaluation['val_bits_per_byte']:.3f} bits/byte")


def save_checkpoint(run: Run, report: Report, step: int, last_eval: dict) -> dict:
    """Saves checkpoint `step` (asynchronously) with its validation loss; returns that evaluation.

    The checkpointer keeps the best checkpoint by validation loss, so each one needs an evaluation
    of its own step: `last_eval` if it is this step's, else a new one (written, not printed).
    """
    if last_eval.get("step") != step:
        last_eval = evaluate(run, step)
        report.writer.write(last_eval)
    run.ckpt.save(step, run.state, run.config.to_dict(), run.tokenizer, last_eval["val_loss"])
    return last_eval


def check_finite(step: int, metrics: dict) -> None:
    """Stops the run if step `step`'s loss or updated parameters are NaN or infinite."""
    for name in ("loss", "param_norm"):
        value = float(metrics[name])
        if not math.isfinite(value):
            raise Diverged(
                f"the training {name} became {value} at step {step}; stopped without saving, so the "
                "last good checkpoint is intact. Lower optim.learning_rate or set optim.grad_clip, "
                "then rerun"
            )


def check_train_config(config, cfg) -> None:
    """Errors for training fields that cannot work together, naming the fix."""
    t = config.train
    import jax

    if t.seq_len > cfg.max_seq_len:
        raise ValueError(f"train.seq_len={t.seq_len} exceeds model.max_seq_len={cfg.max_seq_len}")
    if t.batch_size % t.grad_accum:
        raise ValueError(f"train.batch_size={t.batch_size} is not divisible by train.grad_accum={t.grad_accum}")
    n = jax.device_count()
    if (t.batch_size // t.grad_accum) % n:
        raise ValueError(
            f"each micro-batch of {t.batch_size // t.grad_accum} rows must split evenly over {n} devices; "
            "change train.batch_size or train.grad_accum"
        )
    for name in ("steps", "log_every", "eval_every", "checkpoint_every", "eval_batches", "keep_checkpoints"):
        if t[name] <= 0:
            raise ValueError(f"train.{name}={t[name]} must be positive")


def print_sample(cfg, params, tokenizer, num_tokens: int, seed: int) -> None:
    """A short sample from the trained model, to see what it learned."""
    import jax

    from transformer.sampling import generate

    prompt = tokenizer.encode("\n")
    n = min(num_tokens, cfg.max_seq_len - len(prompt))
    out = generate(params, cfg, [list(prompt)], jax.random.key(seed), max_new_tokens=n, temperature=0.8)
    print("\n--- sample ---\n" + tokenizer.decode(list(out.tokens[0][: int(out.lengths[0])])))


def main(argv) -> None:
    del argv
    maybe_initialize_distributed()
    from transformer.checkpoint import CheckpointError

    try:
        train(FLAGS.config, FLAGS.workdir)
    except (ValueError, FileNotFoundError, CheckpointError, Diverged) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)

if __name__ == "__main__":
    app.run(main)
