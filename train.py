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

from absl import app, flags
from ml_collections import config_flags

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


def train(config, workdir: str, progress: bool = True) -> dict:
    """Runs (or resumes) training; returns the last evaluation's metrics.

    progress=False hides the progress bar (e.g. in a notebook); metrics still go to the workdir.
    """
    import jax
    import numpy as np
    from tqdm import tqdm

    from transformer import data, training
    from transformer.checkpoint import Checkpointer, save_json
    from transformer.config import ModelConfig
    from transformer.metrics import MetricWriter
    from transformer.model import count_params
    from transformer.tokenizer import load_tokenizer, make_tokenizer, save_tokenizer

    cfg = ModelConfig.from_dict(config.model)
    t = config.train
    check_train_config(config, cfg)
    os.makedirs(workdir, exist_ok=True)
    host, hosts = jax.process_index(), jax.process_count()

    # The tokenizer is saved with the run, so a resumed run and sample.py encode the same way.
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
    train_tokens, val_tokens, bytes_per_token = data.load_corpus(
        config.data.path or None, tokenizer, config.data.cache_dir, config.data.val_fraction
    )

    mesh = training.make_mesh(config.mesh.data, config.mesh.fsdp)
    tx, schedule = training.make_optimizer(config.optim, t.steps)
    ckpt = Checkpointer(workdir, keep=t.keep_checkpoints)
    resuming = ckpt.latest_step() is not None
    params = None
    if config.init_from_hf and not resuming:
        from transformer.hf import check_same_architecture, from_hf

        hf_cfg, params = from_hf(config.init_from_hf, scan_layers=cfg.scan_layers)
        check_same_architecture(hf_cfg, cfg)
    state = training.create_state(cfg, tx, t.seed, mesh, params)
    if resuming:
        state = ckpt.restore_state(state, config.model)
        print(f"resumed from the checkpoint at step {int(state.step)} in {ckpt.directory}")
    start = int(state.step)

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

    def evaluate(step: int) -> dict:
        loss = float(np.mean([float(eval_step(state.params, x, y)) for x, y in eval_set]))
        return {"step": step, "val_loss": loss, "val_perplexity": math.exp(min(loss, 50.0)),
                "val_bits_per_byte": loss / math.log(2) / bytes_per_token}

    def save(step: int, val: dict) -> None:
        ckpt.save(step, state, config.to_dict(), tokenizer, val["val_loss"])

    writer = MetricWriter(workdir, enabled=host == 0)
    save_json(os.path.join(workdir, "config.json"), config.to_dict())
    batches = data.Prefetcher(
        lambda s: data.batch_at(train_tokens, seed=t.seed, step=s, batch_size=t.batch_size,
                                seq_len=t.seq_len, host_index=host, host_count=hosts),
        start,
    )
    last_eval: dict = {}
    pending = None  # the previous step's metrics: read one step late so the host never stalls
    tokens_per_step = t.batch_size * t.seq_len
    clock, clock_step = time.perf_counter(), start
    bar = tqdm(total=t.steps, initial=start, disable=host != 0 or not progress, dynamic_ncols=True,
               file=sys.stdout)
    end = t.steps if t.run_steps <= 0 else min(t.steps, start + t.run_steps)
    done = start
    with StopOnSignal() as stop:
        try:
            for step in range(start, end):
                inputs, targets = next(batches)
                state, metrics = train_step(state, put(inputs), put(targets))
                done = step + 1
                if pending is not None:
                    check_finite(*pending)
                pending = (done, metrics)
                stopping = stop.requested  # read once: a signal arriving mid-iteration waits a step
                last = done == end or stopping
                if last or done % t.log_every == 0 or done % t.eval_every == 0 or done % t.checkpoint_every == 0:
                    check_finite(*pending)  # never log, evaluate or save a diverged state
                if done % t.log_every == 0 or last:
                    elapsed = time.perf_counter() - clock
                    tps = (done - clock_step) * tokens_per_step / max(elapsed, 1e-9)
                    row = {"step": done, **{k: float(v) for k, v in metrics.items()},
                           "tokens_per_sec": tps, "mfu": tps * flops_per_token / t.peak_flops}
                    writer.write(row)
                    bar.set_postfix(loss=f"{row['loss']:.3f}", lr=f"{row['learning_rate']:.2e}",
                                    tok_s=f"{tps:,.0f}", mfu=f"{row['mfu']:.2f}")
                    clock, clock_step = time.perf_counter(), done
                if done % t.eval_every == 0 or done == t.steps:
                    last_eval = evaluate(done)
                    writer.write(last_eval)
                    bar.write(f"step {done}: val loss {last_eval['val_loss']:.4f} nats/token, "
                              f"{last_eval['val_bits_per_byte']:.3f} bits/byte")
                if done % t.checkpoint_every == 0 or last:
                    if last_eval.get("step") != done:
                        last_eval = evaluate(done)
                        writer.write(last_eval)
                    save(done, last_eval)
                bar.update(1)
                if stopping:
                    bar.write(f"stop requested: saved the checkpoint at step {done}; rerun to resume")
                    break
        finally:
            bar.close()
            batches.close()
            ckpt.wait()
            writer.close()

    if done == t.steps and t.sample_tokens and host == 0:
        print_sample(cfg, state.params, tokenizer, t.sample_tokens, t.seed)
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
