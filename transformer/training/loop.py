"""The training loop: `train(run)` trains a set-up run (setup.py) to train.steps, knowing no data task
or metric by name. Batch s depends only on (seed, s), so a resume sees an unbroken run's batches;
SIGINT / SIGTERM save at the next step (Interrupted); a diverged loss raises Diverged without saving."""

from __future__ import annotations

import contextlib
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from tqdm import tqdm

from transformer.data.batches import with_start_token
from transformer.data.prefetch import Prefetcher
from transformer.run.checkpoint import Checkpointer, latest_step
from transformer.run.metrics import MetricWriter
from transformer.run.workdir import WorkdirLock, check_unchanged, write_run_files
from transformer.run.signals import StopOnSignal
from transformer.training.setup import Run
from transformer.training.steps import TrainState

OnComplete = Callable[[Run, TrainState], None]  # called once a run reaches train.steps (e.g. to print a sample)


class Diverged(RuntimeError):
    """The loss became NaN or infinite."""


def train(run: Run, progress: bool = True, started: float | None = None, on_complete: OnComplete | None = None
          ) -> dict:
    """Trains `run` from its state to train.steps (or train.run_steps more); returns the last
    evaluation ({} if the run was complete). started: the time.perf_counter() elapsed_seconds count
    from (default: now); on_complete(run, state): called when the run reaches train.steps."""
    started = time.perf_counter() if started is None else started
    workdir, state, t = run.workdir, run.state, run.config.train
    start = int(state.step)
    if start >= t.steps:
        print(f"the run in {workdir} is already complete at step {start} (train.steps={t.steps}); "
              "raise train.steps to continue it (docs/usage.md: 'Continuing a run')")
        return {}
    with StopOnSignal(training=True) as stop:
        # One run writes a workdir at a time (the first host of a multi-host run holds the lock).
        with WorkdirLock(workdir) if run.host == 0 else contextlib.nullcontext():
            check_unchanged(workdir, start if run.ckpt else None)
            write_run_files(workdir, run.host, run.tokenizer, run.record, run.corpus)
            ckpt = run.ckpt or Checkpointer(workdir, keep=t.keep_checkpoints)  # every host saves its shards
            state, last_eval, seconds = train_and_report(run, state, ckpt, stop, progress, started)
    done = int(state.step)
    if run.host == 0:
        print_summary(run, done, done - start, last_eval, ckpt, seconds, time.perf_counter() - started)
    if stop.requested:
        raise stop.stopped_after_saving(done)
    if done == t.steps and on_complete is not None:
        on_complete(run, state)
    return last_eval


def train_and_report(run: Run, state: TrainState, ckpt: Checkpointer, stop: StopOnSignal, progress: bool,
                     started: float) -> tuple[TrainState, dict, float]:
    """The loop with its metric writer, progress bar and prefetched batches; returns the state, the
    last evaluation and the seconds spent in the loop."""
    t, start = run.config.train, int(state.step)
    writer = MetricWriter(run.workdir, enabled=run.host == 0, start_step=start)  # rows past `start` are redone
    writer.write({"step": start, "compile_seconds": run.steps.compile_seconds,
                  "elapsed_seconds": time.perf_counter() - started})  # the set-up's end
    batches = training_batches(run, start)
    tty = sys.stdout.isatty()  # redirected to a file: a line every 30 s, not one line of carriage returns
    bar = tqdm(total=t.steps, initial=start, disable=run.host != 0 or not progress, dynamic_ncols=True, file=sys.stdout,
               mininterval=0.1 if tty else 30, bar_format=None if tty else "{l_bar}{bar:20}{r_bar}\n")
    report = Report(writer, bar, started, window_step=start)
    end = t.steps if t.run_steps <= 0 else min(t.steps, start + t.run_steps)  # run_steps: a part, then resume
    looping = time.perf_counter()
    try:
        state, last_eval = train_steps(run, state, ckpt, batches, report, stop, end)
    finally:
        bar.close()
        batches.close()
        ckpt.wait()  # saves are asynchronous: the last one must be on disk before we return
        writer.close()
    return state, last_eval, time.perf_counter() - looping


def training_batches(run: Run, start: int) -> Prefetcher:
    """Batches for steps start, start + 1, ..., loaded in a background thread."""
    t = run.config.train
    return Prefetcher(
        lambda s: with_start_token(run.task.batch_at(run.train_tokens, seed=t.seed, step=s, batch_size=t.batch_size,
                                                     seq_len=t.seq_len, host_index=run.host, host_count=run.hosts),
                                   run.config.data.get("start_token", -1)),
        start,
    )


@dataclass
class Report:
    """Where the loop reports (metric rows, the progress bar) and its throughput window's start."""

    writer: MetricWriter
    bar: tqdm
    started: float  # time.perf_counter() at the run's start: the zero of elapsed_seconds
    window_step: int
    window_time: float = field(default_factory=time.perf_counter)


def train_steps(run: Run, state: TrainState, ckpt: Checkpointer, batches: Prefetcher, report: Report,
                stop: StopOnSignal, end: int) -> tuple[TrainState, dict]:
    """Trains until step `end` or a stop request, logging, evaluating and saving on the config's
    schedule; returns the state and the last evaluation."""
    t = run.config.train
    last_eval: dict = {}
    pending = None  # the previous step's metrics: read one step late so the host never stalls
    for step in range(int(state.step), end):
        inputs, targets = next(batches)
        # The metrics stay on the device: reading them waits for the step to finish.
        state, metrics = run.steps.train(state, run.steps.put(inputs), run.steps.put(targets))
        done = step + 1
        if pending is not None:
            check_finite(run, *pending)
        pending = (done, metrics)
        stopping = stop.requested  # read once: a signal arriving mid-iteration waits a step
        last = done == end or stopping
        log_due = done % t.log_every == 0 or last
        eval_due = done % t.eval_every == 0 or done == t.steps
        save_due = done % t.checkpoint_every == 0 or last
        if log_due or eval_due or save_due:
            check_finite(run, *pending)  # never log, evaluate or save a diverged state
        if log_due:
            log_train_metrics(run, report, done, metrics)
        if eval_due:
            last_eval = evaluate(run, report, state.params, done)
            log_evaluation(report, last_eval)
        if save_due:
            last_eval = save_checkpoint(run, state, ckpt, report, last_eval)
        report.bar.update(1)
        if stopping:
            break
    return state, last_eval


def log_train_metrics(run: Run, report: Report, step: int, metrics: dict) -> None:
    """Writes the step's training metrics and the throughput since the last row; shows them on the bar."""
    tps = (step - report.window_step) * run.config.train.batch_size * run.config.train.seq_len / max(
        time.perf_counter() - report.window_time, 1e-9)
    row = {"step": step, **{k: float(v) for k, v in metrics.items()},
           "tokens_per_sec": tps, "mfu": tps * run.flops_per_token / run.config.train.peak_flops}
    report.writer.write(row)
    muon_lr = {"muon_lr": f"{row['muon_learning_rate']:.2e}"} if "muon_learning_rate" in row else {}
    report.bar.set_postfix(loss=f"{row['loss']:.3f}", lr=f"{row['learning_rate']:.2e}", **muon_lr,
                           tok_s=f"{tps:,.0f}", mfu=f"{row['mfu']:.2f}")
    report.window_step, report.window_time = step, time.perf_counter()  # after writing: the window times training


def evaluate(run: Run, report: Report, params, step: int) -> dict:
    """The validation loss of `params` (its perplexity, and for a text task bits per byte), the run's
    metrics, and elapsed_seconds: the wall time from the run's start (set-up and compiling
    included), so the time taken to reach a validation loss reads off metrics.jsonl."""
    loss = float(np.mean([float(run.steps.eval(params, x, y)) for x, y in run.eval_set]))
    row = {"step": step, "val_loss": loss, "val_perplexity": math.exp(min(loss, 50.0))}
    if run.bytes_per_token:
        row["val_bits_per_byte"] = loss / math.log(2) / run.bytes_per_token
    for measure in run.steps.metrics.values():
        row.update(measure(params, run.eval_set))
    return {**row, "elapsed_seconds": time.perf_counter() - report.started}


def log_evaluation(report: Report, evaluation: dict) -> None:
    """Writes an evaluation row and prints it above the progress bar."""
    report.writer.write(evaluation)
    report.bar.write(f"step {evaluation['step']}: val loss {evaluation['val_loss']:.4f} nats/token"
                     + bits_per_byte(evaluation))


def bits_per_byte(evaluation: dict) -> str:
    """', 1.234 bits/byte' for an evaluation of a text task, '' for one without text."""
    return f", {evaluation['val_bits_per_byte']:.3f} bits/byte" if "val_bits_per_byte" in evaluation else ""


def save_checkpoint(run: Run, state: TrainState, ckpt: Checkpointer, report: Report, last_eval: dict) -> dict:
    """Saves the state (asynchronously) with its step's evaluation, which the checkpointer keeps the
    best by: `last_eval` if it is this step's, else a new one (written, not printed). Returns it."""
    step = int(state.step)
    if last_eval.get("step") != step:
        last_eval = evaluate(run, report, state.params, step)
        report.writer.write(last_eval)
    ckpt.save(step, state, run.record, run.tokenizer, last_eval["val_loss"])
    return last_eval


def check_finite(run: Run, step: int, metrics: dict) -> None:
    """Stops the run if step `step`'s loss or updated parameters are NaN or infinite."""
    for name in ("loss", "param_norm"):
        value = float(metrics[name])
        if not math.isfinite(value):
            kept, clip = latest_step(run.workdir), run.config.optim.get("grad_clip")
            raise Diverged(
                f"the training {name} became {value} at step {step}; stopped without saving (" + (
                    "no checkpoint was saved yet" if kept is None else f"the checkpoint of step {kept} is intact")
                + "). Lower optim.learning_rate" + ("" if clip else " or set optim.grad_clip=1.0") + ", then rerun")


def print_summary(run: Run, step: int, steps: int, last_eval: dict, ckpt: Checkpointer, training_seconds: float,
                  seconds: float) -> None:
    """One line: the step reached, wall time (set-up and compiling included), training throughput
    over this invocation's `steps`, the last validation loss, where the checkpoints are."""
    tokens_per_sec = steps * run.config.train.batch_size * run.config.train.seq_len / max(training_seconds, 1e-9)
    loss = f"; val loss {last_eval['val_loss']:.4f} nats/token{bits_per_byte(last_eval)}" if last_eval else ""
    print(f"done: step {step} of {run.config.train.steps} in {seconds:.0f} s "
          f"({run.steps.compile_seconds:.1f} s compiling; {tokens_per_sec:,.0f} tokens/s training){loss}; "
          f"checkpoints in {ckpt.directory}")
