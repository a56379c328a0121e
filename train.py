"""Train a decoder from a config file.

    python train.py --config configs/modern.py --workdir runs/shakespeare
    python train.py --config configs/llama.py --workdir runs/llama --config.train.steps=2000

Any config field can be overridden from the command line (--config.section.field=value). Starting
in a workdir that has checkpoints resumes from the latest one; nothing is written to the workdir
until the run's set-up (config, tokenizer, corpus, state, compiled steps) has succeeded.

Exit codes: 0 when the run reached train.steps (or train.run_steps of them), 1 for an error (one
line naming it), 2 for a bad command line, 130 / 143 after SIGINT (Ctrl-C) / SIGTERM: training
stops at the next step, saves a checkpoint and exits, so `train.py ... && sample.py ...` does not
go on with a partial model. A kill -9 loses at most the steps since the last checkpoint.

Output: the model line, a progress bar, the evaluation lines and a summary. Metrics also go to
workdir/metrics.jsonl and TensorBoard files in workdir/tb. Its evaluation rows (and its first row,
written when the set-up ends) carry elapsed_seconds, the wall time since the process started, so the
time taken to reach a loss, start-up, compiling, evaluations and checkpoints included, reads off the
log (a resumed run counts from its own start). `--verbosity=0` shows the libraries' INFO logs
(absl, orbax), which are hidden by default.
"""

from __future__ import annotations

import time

STARTED = time.perf_counter()  # the process's start, taken before the heavy imports: elapsed_seconds counts from it

import os
import signal

if __name__ == "__main__":  # Ctrl-C while the libraries load: end at once (nothing is written yet)
    for _sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(_sig, lambda signum, frame: os._exit(128 + signum))

import functools
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass

import jax
import numpy as np
from absl import app, flags, logging
from ml_collections import ConfigDict, config_flags
from tqdm import tqdm

from transformer import training
from transformer.data import needle
from transformer.data.batches import batch_at, eval_batches, with_start_token
from transformer.model.kv_cache import kv_cache_bytes_per_token
from transformer.training.checkpoint import CheckpointError, Checkpointer, quiet_failed_reads
from transformer.cli import config_flags_parser
from transformer.model.config import ModelConfig
from transformer.data.corpus import load_texts, skipped_files
from transformer.data.atomic_files import save_json
from transformer.training.metrics import MetricWriter
from transformer.model.decoder import count_params
from transformer.training.optimizer import learning_rates, make_optimizer
from transformer.data.prefetch import Prefetcher
from transformer.training.run_config import (check_resume, check_tokenizer_left, check_train_config, check_workdir,
                                    choose_execution, resolve)
from transformer.training.sharding import batch_sharding, make_mesh, make_rules
from transformer.analysis import sinks
from transformer.analysis.sinks import share_metrics
from transformer.data.token_stream import load_corpus
from transformer.data.tokenizer import Tokenizer, load_tokenizer, make_tokenizer, save_tokenizer

ROOT = os.path.dirname(os.path.abspath(__file__))  # the repository
DEFAULT_CACHE_DIR = os.path.join(ROOT, ".cache", "tokens")  # data.cache_dir = ""
DEFAULT_CONFIG = os.path.join(ROOT, "configs", "modern.py")

FLAGS = flags.FLAGS


def define_flags() -> None:
    """The command line's flags, defined only when train.py runs as a script: importing train (the
    notebooks and sweep.py call `train()`) defines none, so it never clashes with sample.py's."""
    # No default here: absl would load it while defining the flag, before the flags parser can report a
    # bad override; config_flags_parser adds --config=DEFAULT_CONFIG when none is given.
    config_flags.DEFINE_config_file("config", None, f"Config file (get_config()); default {DEFAULT_CONFIG}.")
    flags.DEFINE_string("workdir", None, "Folder for checkpoints, metrics and the tokenizer.", required=True)


class Diverged(RuntimeError):
    """The loss became NaN or infinite."""


class Interrupted(Exception):
    """SIGINT or SIGTERM stopped the run; the exit code is 128 + the signal's number."""

    def __init__(self, signum: int, message: str):
        super().__init__(message)
        self.exit_code = 128 + signum


class StopOnSignal:
    """While active, SIGTERM / SIGINT stop the run: during set-up at once, during training at the
    next step, which saves a checkpoint.

    During set-up nothing is written yet: the command line (`hard_exit`) ends the process there and
    then, so no library is left half-way through an import or a compile; called from Python (a
    notebook), set-up raises Interrupted instead. A context manager, so the previous handlers come
    back afterwards (Ctrl-C in a notebook kernel works again once train() returns).
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, hard_exit: bool = False):
        self.hard_exit = hard_exit
        self.signum: int | None = None
        self.training = False  # set once the loop may save: signals then wait for the next step
        self.previous = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def __enter__(self) -> "StopOnSignal":
        for sig in self.SIGNALS:
            self.previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        self.signum = signum
        if self.training:
            return
        message = f"{signal.Signals(signum).name} during set-up: stopped; nothing was written to the workdir"
        if self.hard_exit:
            print(message, file=sys.stderr, flush=True)
            os._exit(128 + signum)
        raise Interrupted(signum, message)

    def __exit__(self, *exc_info) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


def train(config: ConfigDict, workdir: str, progress: bool = True, hard_exit: bool = False,
          started: float | None = None) -> dict:
    """Runs (or resumes) training; returns the last evaluation's metrics.

    progress=False hides the progress bar (e.g. in a notebook); metrics still go to the workdir.
    Raises Interrupted after saving if SIGINT or SIGTERM stopped the run early (during set-up:
    without saving; with hard_exit, as the command line does, the process ends there).
    started: the time.perf_counter() that the metrics' elapsed_seconds count from (the command line:
    the process's start); None: this call's start.
    """
    started = time.perf_counter() if started is None else started
    config = resolve(config, DEFAULT_CACHE_DIR)
    t = config.train
    with StopOnSignal(hard_exit) as stop:
        run, state, ckpt = set_up_run(config, workdir)
        stop.training = True
        start = int(state.step)
        if start >= t.steps:
            print(f"the run in {workdir} is already complete at step {start} (train.steps={t.steps}); "
                  "raise train.steps to continue it (README: 'Continuing a run')")
            return {}
        ckpt = write_run_files(run, workdir, ckpt)
        writer = MetricWriter(workdir, enabled=run.host == 0)
        writer.write({"step": start, "compile_seconds": run.steps.compile_seconds,
                      "elapsed_seconds": time.perf_counter() - started})  # the set-up's end
        batches = training_batches(run, start)
        bar = tqdm(total=t.steps, initial=start, disable=run.host != 0 or not progress, dynamic_ncols=True,
                   file=sys.stdout)
        report = Report(writer, Throughput(start, tokens_per_step=t.batch_size * t.seq_len), bar, started)
        end = t.steps if t.run_steps <= 0 else min(t.steps, start + t.run_steps)  # run_steps: a part, then resume
        looping = time.perf_counter()
        try:
            state, last_eval = train_steps(run, state, ckpt, batches, report, stop, end)
        finally:
            bar.close()
            batches.close()
            ckpt.wait()  # saves are asynchronous: the last one must be on disk before we return
            writer.close()

    done = int(state.step)
    if run.host == 0:
        print_summary(run, done, done - start, last_eval, ckpt, time.perf_counter() - looping,
                      time.perf_counter() - started)
    if stop.requested:
        raise Interrupted(stop.signum, f"{signal.Signals(stop.signum).name}: stopped after saving the "
                                       f"checkpoint at step {done}; rerun the same command to resume")
    if done == t.steps and t.sample_tokens and run.hosts == 1:
        print_sample(run.cfg, state.params, run.tokenizer, t.sample_tokens, t.seed)
    elif done == t.steps and t.sample_tokens and run.host == 0:  # the params span the hosts' devices
        print(f"no sample in a multi-host run: python sample.py --workdir {workdir} draws one from the checkpoint")
    return last_eval


# --- set-up ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Steps:
    """The compiled steps of a run, and a batch's way onto the mesh."""

    train: Callable  # (state, inputs [B, T], targets [B, T]) -> (state, metrics); donates the state
    eval: Callable  # (params, inputs, targets) -> mean loss
    shares: Callable | None  # (params, inputs) -> sinks.AttentionShares; with train.eval_attention_shares
    put: Callable  # a host-local batch [B / hosts, T] -> a global array split over the mesh
    compile_seconds: float


@dataclass(frozen=True)
class Run:
    """What one training run is made of, built once by `set_up_run`. The train state and the
    checkpointer travel apart: the state changes every step, the checkpointer opens late."""

    config: ConfigDict
    cfg: ModelConfig
    tokenizer: Tokenizer
    steps: Steps
    batch_at: Callable  # (tokens, seed=, step=, batch_size=, seq_len=, host_index=, host_count=) -> (inputs, targets)
    train_tokens: np.ndarray  # [N] the training token stream, memory-mapped
    eval_set: list[tuple[jax.Array, jax.Array]]  # fixed validation batches, on the mesh
    bytes_per_token: float  # of the validation text: bits/byte = loss / ln 2 / this
    flops_per_token: float
    host: int
    hosts: int


def set_up_run(config: ConfigDict, workdir: str) -> tuple[Run, training.TrainState, Checkpointer | None]:
    """Checks, tokenizer, corpus, mesh, optimizer, state and compiled steps; writes nothing to the
    workdir. Returns the run, its state (the latest checkpoint's when the workdir has one) and
    the checkpointer (None for a new run: it is opened once the set-up has succeeded)."""
    config, execution = choose_execution(config)  # dtype and attention_impl 'auto': for this backend
    cfg = execution.cfg
    check_train_config(config, cfg)
    task_batch_at, task_eval_batches = batch_source(config)
    check_workdir(workdir)
    t = config.train
    host, hosts = jax.process_index(), jax.process_count()
    resuming = os.path.isdir(os.path.join(workdir, "checkpoints"))
    ckpt = Checkpointer(workdir, keep=t.keep_checkpoints) if resuming else None
    saved = check_resume(config, ckpt, workdir) if ckpt else None
    tokenizer = ckpt.tokenizer(saved["step"]) if saved else load_or_make_tokenizer(config, workdir)
    if tokenizer.vocab_size > cfg.vocab_size:
        raise ValueError(f"the tokenizer has {tokenizer.vocab_size} tokens but model.vocab_size={cfg.vocab_size}; "
                         f"set --config.model.vocab_size={tokenizer.vocab_size}")
    train_tokens, val_tokens, bytes_per_token = load_corpus(
        config.data.path or None, tokenizer, config.data.cache_dir, config.data.val_fraction
    )
    if host == 0 and (skipped := skipped_files(config.data.path or None)):
        print(f"data: left out {len(skipped)} files under {config.data.path} that are not UTF-8 text, "
              f"e.g. {skipped[0]}")

    mesh = make_mesh(config.mesh.data, config.mesh.fsdp, config.mesh.tensor)
    rules = make_rules(cfg, mesh, config.mesh.rules)  # logical axes -> mesh axes, sizes checked
    tx, _ = make_optimizer(config.optim, t.steps)
    state = create_or_restore_state(config, cfg, tx, mesh, rules, ckpt)
    put = lambda x: jax.make_array_from_process_local_data(batch_sharding(mesh, rules), x)  # noqa: E731
    eval_set = [
        (put(x), put(y))
        for x, y in (with_start_token(b, config.data.get("start_token", -1)) for b in task_eval_batches(
            val_tokens, num_batches=t.eval_batches, batch_size=t.batch_size, seq_len=t.seq_len,
            host_index=host, host_count=hosts))
    ]
    compiling = time.perf_counter()  # compiled here, so the first step's time is training only
    x, y = eval_set[0]
    steps = Steps(
        # logged: learning_rate (AdamW's), with Muon also muon_learning_rate
        train=training.make_train_step(cfg, tx, learning_rates(config.optim, t.steps), mesh, state, t.grad_accum,
                                       rules)
        .lower(state, x, y).compile(),
        eval=training.make_eval_step(cfg, mesh, state, rules).lower(state.params, x, y).compile(),
        shares=sinks.make_shares_step(cfg, mesh, state, rules).lower(state.params, x).compile()
        if t.get("eval_attention_shares", False) else None,
        put=put, compile_seconds=time.perf_counter() - compiling,
    )
    num_params = count_params(state.params)
    flops_per_token = training.flops_per_token(cfg, num_params, t.seq_len)
    if host == 0:
        print(f"model: {num_params:,} parameters, {flops_per_token / 1e6:.1f} MFLOP per token (6N + 12 L T d), "
              f"KV cache {kv_cache_bytes_per_token(cfg):,} bytes per token; {len(jax.devices())} device(s), "
              f"mesh {dict(mesh.shape)}; {execution.describe()}; compiled in {steps.compile_seconds:.1f} s")
    run = Run(config=config, cfg=cfg, tokenizer=tokenizer, steps=steps, batch_at=task_batch_at,
              train_tokens=train_tokens, eval_set=eval_set, bytes_per_token=bytes_per_token,
              flops_per_token=flops_per_token, host=host, hosts=hosts)
    return run, state, ckpt


def batch_source(config: ConfigDict) -> tuple[Callable, Callable]:
    """(batch_at, eval_batches) of the config's data.task: windows of the corpus ('text', batches.py)
    or needle-in-a-haystack documents with filler from the corpus ('needle', needle.py)."""
    if config.data.task == "text":
        return batch_at, eval_batches
    if config.data.task == "needle":
        task = needle.NeedleTask.from_config(config.data.needle)
        task.check(config.train.seq_len, config.data.tokenizer)
        return functools.partial(needle.batch_at, task=task), functools.partial(needle.eval_batches, task=task)
    raise ValueError(f"data.task={config.data.task!r} is not known; use 'text' or 'needle'")


def load_or_make_tokenizer(config: ConfigDict, workdir: str) -> Tokenizer:
    """A new run's tokenizer: one left in the workdir by a run that saved no checkpoint (if made
    for the same data), else the imported model's, else a new one."""
    tok_dir = os.path.join(workdir, "tokenizer")
    if os.path.isdir(tok_dir):
        check_tokenizer_left(config, workdir)
        return load_tokenizer(tok_dir)
    if config.init_from_hf and os.path.isfile(os.path.join(config.init_from_hf, "tokenizer.json")):
        return load_tokenizer(config.init_from_hf)  # imported weights need the ids they were trained on
    if config.data.tokenizer == "bytes":
        return make_tokenizer("bytes")
    print(f"training a {config.data.vocab_size}-token BPE tokenizer on {config.data.path or 'the bundled plays'} ...",
          flush=True)
    return make_tokenizer("bpe", load_texts(config.data.path or None), config.data.vocab_size)


def create_or_restore_state(config: ConfigDict, cfg: ModelConfig, tx, mesh, rules, ckpt: Checkpointer | None
                            ) -> training.TrainState:
    """The latest checkpoint's state if there is one (resume), else a new one at step 0.

    A new state starts from the weights in config.init_from_hf when set, else from a random init.
    """
    params = None
    if config.init_from_hf and ckpt is None:  # a resumed run has its own weights in the checkpoint
        from transformer.hf import check_same_architecture, from_hf

        hf_cfg, params = from_hf(config.init_from_hf, scan_layers=cfg.scan_layers)
        check_same_architecture(hf_cfg, cfg, seq_len=config.train.seq_len)
    state = training.create_state(cfg, tx, config.train.seed, mesh, params, rules)
    if ckpt is not None:  # the fresh state gives the shapes and shardings to restore into (orbax reads
        # each device's shard of each array: nothing is gathered on one host)
        state = ckpt.restore_state(state, config.model)
        print(f"resumed from the checkpoint at step {int(state.step)} in {ckpt.directory}")
    return state


def write_run_files(run: Run, workdir: str, ckpt: Checkpointer | None) -> Checkpointer:
    """After a successful set-up: the workdir, its tokenizer and config.json (written by the first
    host: the hosts share the workdir); the checkpointer (every host: each saves its shards)."""
    os.makedirs(workdir, exist_ok=True)
    tok_dir = os.path.join(workdir, "tokenizer")
    if run.host == 0 and not os.path.isdir(tok_dir):
        save_tokenizer(run.tokenizer, tok_dir)
    if run.host == 0:
        save_json(os.path.join(workdir, "config.json"), run.config.to_dict())
    return ckpt or Checkpointer(workdir, keep=run.config.train.keep_checkpoints)


def training_batches(run: Run, start: int) -> Prefetcher:
    """Batches for steps start, start + 1, ..., loaded in a background thread.

    Batch s depends only on (seed, s), so a resumed run sees the batches an unbroken run would.
    """
    t = run.config.train
    return Prefetcher(
        lambda s: with_start_token(run.batch_at(run.train_tokens, seed=t.seed, step=s, batch_size=t.batch_size,
                                                seq_len=t.seq_len, host_index=run.host, host_count=run.hosts),
                                   run.config.data.get("start_token", -1)),
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
    started: float  # time.perf_counter() at the run's start: the zero of the evaluations' elapsed_seconds


def train_steps(run: Run, state: training.TrainState, ckpt: Checkpointer, batches: Prefetcher, report: Report,
                stop: StopOnSignal, end: int) -> tuple[training.TrainState, dict]:
    """Trains until step `end` or a stop request, logging, evaluating and saving on the config's
    schedule; returns the state and the last evaluation.
    """
    t = run.config.train
    last_eval: dict = {}
    pending = None  # the previous step's metrics: read one step late so the host never stalls
    for step in range(int(state.step), end):
        state, metrics = take_step(run, state, batches)
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
            last_eval = timed(report, evaluate(run, state.params, done))
            log_evaluation(report, last_eval)
        if save_due:
            last_eval = save_checkpoint(run, state, ckpt, report, last_eval)
        report.bar.update(1)
        if stopping:
            break
    return state, last_eval


def take_step(run: Run, state: training.TrainState, batches: Prefetcher) -> tuple[training.TrainState, dict]:
    """One optimizer step on the next batch: the new state and the step's metrics.

    The metrics stay on the device: reading them waits for the step to finish.
    """
    inputs, targets = next(batches)
    return run.steps.train(state, run.steps.put(inputs), run.steps.put(targets))


def log_train_metrics(run: Run, report: Report, step: int, metrics: dict) -> None:
    """Writes the step's training metrics and the throughput since the last row; shows them on the bar."""
    tps = report.throughput.tokens_per_sec(step)
    row = {"step": step, **{k: float(v) for k, v in metrics.items()},
           "tokens_per_sec": tps, "mfu": tps * run.flops_per_token / run.config.train.peak_flops}
    report.writer.write(row)
    muon_lr = {"muon_lr": f"{row['muon_learning_rate']:.2e}"} if "muon_learning_rate" in row else {}
    report.bar.set_postfix(loss=f"{row['loss']:.3f}", lr=f"{row['learning_rate']:.2e}", **muon_lr,
                           tok_s=f"{tps:,.0f}", mfu=f"{row['mfu']:.2f}")
    report.throughput.restart(step)  # after writing, so the next window times training only


def evaluate(run: Run, params, step: int) -> dict:
    """The validation loss of `params` (and its perplexity and bits per byte); with
    train.eval_attention_shares also the attention shares on the first validation batch
    (sinks.share_metrics: first_token_share, per layer, register_share, sink_share)."""
    loss = float(np.mean([float(run.steps.eval(params, x, y)) for x, y in run.eval_set]))
    row = {"step": step, "val_loss": loss, "val_perplexity": math.exp(min(loss, 50.0)),
           "val_bits_per_byte": loss / math.log(2) / run.bytes_per_token}
    if run.steps.shares is not None:
        row.update(share_metrics(run.cfg, run.steps.shares(params, run.eval_set[0][0])))
    return row


def timed(report: Report, evaluation: dict) -> dict:
    """The evaluation row with elapsed_seconds: the wall time from the run's start to the end of this
    evaluation (set-up, compiling, earlier evaluations and checkpoints included), so the time taken
    to reach a validation loss reads off metrics.jsonl."""
    return {**evaluation, "elapsed_seconds": time.perf_counter() - report.started}


def log_evaluation(report: Report, evaluation: dict) -> None:
    """Writes an evaluation row and prints it above the progress bar."""
    report.writer.write(evaluation)
    report.bar.write(f"step {evaluation['step']}: val loss {evaluation['val_loss']:.4f} nats/token, "
                     f"{evaluation['val_bits_per_byte']:.3f} bits/byte")


def save_checkpoint(run: Run, state: training.TrainState, ckpt: Checkpointer, report: Report,
                    last_eval: dict) -> dict:
    """Saves the state as a checkpoint (asynchronously) with its validation loss; returns that
    evaluation.

    The checkpointer keeps the best checkpoint by validation loss, so each one needs an evaluation
    of its own step: `last_eval` if it is this step's, else a new one (written, not printed).
    """
    step = int(state.step)
    if last_eval.get("step") != step:
        last_eval = timed(report, evaluate(run, state.params, step))
        report.writer.write(last_eval)
    ckpt.save(step, state, run.config.to_dict(), run.tokenizer, last_eval["val_loss"])
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


def print_summary(run: Run, step: int, steps: int, last_eval: dict, ckpt: Checkpointer, training_seconds: float,
                  seconds: float) -> None:
    """One line: the step reached, wall time (set-up and compiling included), training throughput
    over this invocation's `steps`, the last validation loss, where the checkpoints are."""
    tokens_per_sec = steps * run.config.train.batch_size * run.config.train.seq_len / max(training_seconds, 1e-9)
    loss = (f"; val loss {last_eval['val_loss']:.4f} nats/token, {last_eval['val_bits_per_byte']:.3f} bits/byte"
            if last_eval else "")
    print(f"done: step {step} of {run.config.train.steps} in {seconds:.0f} s "
          f"({run.steps.compile_seconds:.1f} s compiling; {tokens_per_sec:,.0f} tokens/s training){loss}; "
          f"checkpoints in {ckpt.directory}")


def print_sample(cfg: ModelConfig, params, tokenizer: Tokenizer, num_tokens: int, seed: int) -> None:
    """A short sample from the trained model, to see what it learned."""
    from transformer.sampling.sampler import generate

    prompt = tokenizer.encode("\n")
    n = min(num_tokens, cfg.max_seq_len - len(prompt))
    out = generate(params, cfg, [list(prompt)], jax.random.key(seed), max_new_tokens=n, temperature=0.8)
    print("\n--- sample ---\n" + tokenizer.decode(list(out.tokens[0][: int(out.lengths[0])])))


def init_distributed() -> None:
    """A multi-host run (README, "Several hosts"): with JAX_COORDINATOR_ADDRESS=host:port,
    JAX_NUM_PROCESSES=N and JAX_PROCESS_ID=i set, join the other processes through JAX's distributed
    runtime, so the mesh spans every process's devices (on CPUs the collectives run over gloo)."""
    address = os.environ.get("JAX_COORDINATOR_ADDRESS")
    if not address:
        return
    try:
        count, index = int(os.environ["JAX_NUM_PROCESSES"]), int(os.environ["JAX_PROCESS_ID"])
    except (KeyError, ValueError):
        raise ValueError("JAX_COORDINATOR_ADDRESS is set, so this is a multi-host run: also set "
                         "JAX_NUM_PROCESSES (the number of processes) and JAX_PROCESS_ID (0 .. N-1)") from None
    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU devices: collectives across processes
    jax.distributed.initialize(coordinator_address=address, num_processes=count, process_id=index)


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}; overrides take the form --config.train.steps=10")
    if not FLAGS["verbosity"].present:  # the libraries' INFO lines (orbax logs ~45 per save)
        logging.set_verbosity(logging.WARNING)
    quiet_failed_reads()  # one-line errors for an unreadable checkpoint
    try:
        init_distributed()
        train(FLAGS.config, FLAGS.workdir, hard_exit=True, started=STARTED)
    except Interrupted as e:
        print(str(e), file=sys.stderr)
        sys.exit(e.exit_code)
    except (ValueError, FileNotFoundError, CheckpointError, Diverged) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    define_flags()
    app.run(main, flags_parser=config_flags_parser(DEFAULT_CONFIG))
