"""Training an SAE on a trained run's named point, its activations captured on the fly (no dump).

    python train.py --config configs/sae.py --workdir runs/sae   # catalog.train hands config.sae here

Each chunk of `model_batches` training windows of the run's corpus (`batch_at`, so a function of
(seed, chunk)) goes through the model under jit, its point is captured (analysis/capture.py), the
activations [M, D] are shuffled and read `batch_size` at a time: step s reads chunk s // (M / batch_size),
so a resumed run sees what an unbroken one would. Loss: the fraction of variance unexplained, plus
l0_coefficient x L0 for JumpReLU (Rajamanoharan et al. 2024); W_dec's rows are kept at unit norm.
Checkpoints, metrics.jsonl, the lock and the signals are the runs' own (transformer/run/), so it
resumes like any run; the SAE itself is written in our layout (layouts.py) under workdir/sae.
"""

from __future__ import annotations

import os
import time
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
from ml_collections import ConfigDict

from transformer.analysis.capture import capture, loss
from transformer.analysis.sae.autoencoder import SAE, init, step
from transformer.analysis.sae.layouts import point_width, save
from transformer.analysis.sae.splice import Splice
from transformer.data.batches import batch_at, eval_batches
from transformer.data.corpus import load_corpus
from transformer.model.edits import zero
from transformer.model.param_tree import unrolled
from transformer.run.checkpoint import Checkpointer, latest_step, restore_for_inference
from transformer.run.metrics import MetricWriter
from transformer.run.signals import StopOnSignal
from transformer.run.workdir import WorkdirLock, check_workdir

Array = jax.Array
KEPT = ("run", "point", "architecture", "features", "k", "seed", "batch_size", "model_batches")  # a resume keeps these
DENSE = 0.1  # a feature firing on more than this share of tokens is dense


@flax.struct.dataclass
class SAEState:
    """What a checkpoint holds: the step, the SAE and Adam's state."""

    step: Array
    sae: SAE
    opt_state: Any


def train_sae(config: ConfigDict, workdir: str, hard_exit: bool = False, **unused: Any) -> dict:
    """Trains the SAE of `config.sae` to sae.steps in `workdir` (resuming from its latest checkpoint);
    returns the last evaluation. Metrics go to workdir/metrics.jsonl, the SAE to workdir/sae."""
    s, started = config.sae, time.perf_counter()
    with StopOnSignal(hard_exit):  # a signal during the set-up stops it at once
        check_workdir(workdir)
        cfg, params, _ = restore_for_inference(s.run)
        params, cfg = unrolled(params, cfg)  # a splice goes into one layer of an unrolled stack
        sae = init(jax.random.key(s.seed), point=s.point, width=point_width(cfg, s.point), features=s.features,
                   architecture=s.architecture, k=s.k, threshold=s.threshold, bandwidth=s.bandwidth)
        stream = ActivationStream(params, cfg, sae, s, run_tokens(s.run, s.data_path or None))
    optimizer = optax.adam(s.learning_rate)
    state = SAEState(jnp.asarray(0), sae, optimizer.init(sae))
    update = jax.jit(lambda state, x: train_step(state, x, optimizer, stream.variance, s.l0_coefficient))
    with WorkdirLock(workdir):
        ckpt = Checkpointer(workdir, keep=1)
        state = resume(ckpt, state, config, workdir)
        with StopOnSignal(training=True) as stop:
            state, last = train_loop(state, update, stream, ckpt, config, workdir, stop, started)
        ckpt.close()
        save(state.sae, os.path.join(workdir, "sae"))
    if stop.requested:
        raise stop.stopped_after_saving(int(state.step))
    return last


def train_loop(state: SAEState, update: Any, stream: ActivationStream, ckpt: Checkpointer, config: ConfigDict,
               workdir: str, stop: StopOnSignal, started: float) -> tuple[SAEState, dict]:
    """Steps from state.step to sae.steps, logging, evaluating and saving; stops early on a signal.
    An evaluation's row holds the seconds since `started` (this process's set-up began)."""
    s, start = config.sae, int(state.step)
    writer, fired, seen, last = MetricWriter(workdir, start_step=start), 0, 0, {}
    for i in range(start, s.steps):
        state, metrics = update(state, stream.batch(i))
        fired, seen = fired + metrics.pop("fired"), seen + s.batch_size  # [N] firings since the last evaluation
        if (i + 1) % s.log_every == 0 or i + 1 == s.steps:
            writer.write({"step": i + 1, **{k: float(v) for k, v in metrics.items()}})
        if (i + 1) % s.eval_every == 0 or i + 1 == s.steps or stop.requested:
            share = np.asarray(fired) / seen  # each feature's firing rate over the steps since the last evaluation
            last = {"step": i + 1, **evaluate(stream.params, stream.cfg, state.sae, stream.val_windows),
                    "dead": float(np.mean(share == 0)), "dense": float(np.mean(share > DENSE)),
                    "seconds": round(time.perf_counter() - started, 1)}
            writer.write(last)
            ckpt.save(i + 1, state, config.to_dict(), None, last["fvu"])
            fired, seen = 0, 0
        if stop.requested:
            break
    writer.close()
    return state, last


def train_step(state: SAEState, x: Array, optimizer: Any, variance: Array, l0_coefficient: float
               ) -> tuple[SAEState, dict[str, Array]]:
    """One Adam step on activations x [M, D]; W_dec's rows renormalised to 1 after it."""
    def objective(sae: SAE) -> tuple[Array, dict[str, Array]]:
        f = sae.encode(x)
        fvu = jnp.mean(jnp.sum((sae.decode(f) - x) ** 2, -1)) / variance
        l0 = jnp.mean(jnp.sum(step(sae.pre_activations(x), sae.threshold, sae.bandwidth), -1))
        penalty = l0_coefficient * l0 if sae.architecture == "jumprelu" else 0.0
        return fvu + penalty, {"fvu": fvu, "l0": jnp.mean(jnp.sum(f > 0, -1)), "fired": jnp.sum(f > 0, 0)}

    (value, metrics), grads = jax.value_and_grad(objective, has_aux=True)(state.sae)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.sae)
    sae = optax.apply_updates(state.sae, updates)
    sae = sae.replace(W_dec=sae.W_dec / jnp.linalg.norm(sae.W_dec, axis=-1, keepdims=True))
    return SAEState(state.step + 1, sae, opt_state), {"loss": value, **metrics}


def resume(ckpt: Checkpointer, fresh: SAEState, config: ConfigDict, workdir: str) -> SAEState:
    """The latest checkpoint's state (fresh without one); ValueError if it was another SAE's."""
    step = latest_step(workdir)
    if step is None:
        return fresh
    saved = ckpt.config(step).get("sae", {})
    changed = [k for k in KEPT if saved.get(k) != config.sae[k]]
    if changed:
        raise ValueError(f"{workdir} holds an SAE trained with other sae.{', sae.'.join(changed)} "
                         f"({', '.join(repr(saved.get(k)) for k in changed)}); resume with those or use another --workdir")
    return ckpt.restore_like(fresh, step)


def run_tokens(workdir: str, path: str | None = None) -> Any:
    """The run's corpus as its evaluations read it (train and validation splits), from its saved fields;
    `path`: where its text is now, if not at its saved data.path."""
    ckpt = Checkpointer(workdir, read_only=True)
    data = ckpt.config()["data"]
    return load_corpus(path or data["path"] or None, ckpt.tokenizer(), data["cache_dir"], data["val_fraction"])


class ActivationStream:
    """The point's activations on the run's training windows, chunk by chunk, shuffled within a chunk."""

    def __init__(self, params: Any, cfg: Any, sae: SAE, s: ConfigDict, corpus: Any):
        self.params, self.cfg, self.s, self.tokens = params, cfg, s, corpus.train
        self.read = jax.jit(lambda p, t: capture(p, cfg, t, [s.point])[2][s.point].reshape(-1, sae.width))
        self.val_windows = np.concatenate([x for x, _ in eval_batches(
            corpus.val, num_batches=s.eval_batches, batch_size=s.model_batch_size, seq_len=s.seq_len)])
        self.chunk_index, self.chunk = -1, None
        first = self.read(params, self.val_windows)
        self.variance = jnp.mean(jnp.sum((first - first.mean(0)) ** 2, -1))  # E||x - E x||^2: FVU's denominator

    def batch(self, i: int) -> Array:
        """Step i's activations [batch_size, D]."""
        per_chunk = self.s.model_batches * self.s.model_batch_size * self.s.seq_len // self.s.batch_size
        index, row = divmod(i, per_chunk)
        if index != self.chunk_index:
            windows = [batch_at(self.tokens, seed=self.s.seed, step=index * self.s.model_batches + j,
                                batch_size=self.s.model_batch_size, seq_len=self.s.seq_len)[0]
                       for j in range(self.s.model_batches)]
            acts = self.read(self.params, np.concatenate(windows))
            self.chunk_index, self.chunk = index, jax.random.permutation(jax.random.key(index), acts)
        return self.chunk[row * self.s.batch_size:(row + 1) * self.s.batch_size]


def evaluate(params: Any, cfg: Any, sae: SAE, windows: np.ndarray) -> dict[str, float]:
    """On token windows [B, T]: fraction of variance explained, L0, and the model's next-token loss
    clean, with the reconstruction in place of the point, and with the point zeroed (capture.loss)."""
    _, _, got = capture(params, cfg, windows, [sae.point])
    x = got[sae.point].reshape(-1, sae.width)
    f = sae.encode(x)
    fvu = jnp.sum((sae.decode(f) - x) ** 2) / jnp.sum((x - x.mean(0)) ** 2)
    clean, spliced = loss(params, cfg, windows), loss(params, cfg, windows, [Splice(sae, error=False)])
    zeroed = loss(params, cfg, windows, [zero(cfg, sae.point)])
    return {"fvu": float(fvu), "fve": float(1 - fvu), "l0": float(jnp.mean(jnp.sum(f > 0, -1))),
            "loss_clean": float(clean), "loss_spliced": float(spliced), "loss_increase": float(spliced - clean),
            "loss_recovered": float((zeroed - spliced) / (zeroed - clean))}
