"""A training run's set-up in one pass: `check_run` checks the whole config against itself and the
workdir (ValueError or CheckpointError naming the field and the fix), then `set_up` builds each part
once from that checked value. Nothing is written: the loop writes the workdir once this succeeded.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import jax
import numpy as np
import optax
from ml_collections import ConfigDict

from transformer.training.eval_metrics import EvalMetric, MetricFn, compile_metric
from transformer.training.optimizer import (check_optimizer_kept, learning_rates, make_optimizer, optimizer_name,
                                            schedule_name)
from transformer.training.sharding import batch_sharding, make_mesh, make_rules, sharded_jit, state_sharding
from transformer.training.steps import TrainState, create_state, eval_step, flops_per_token, train_step
from transformer.run.checkpoint import CHECKPOINT_DIR, CheckpointError, Checkpointer, saved_form, saved_run
from transformer.run.workdir import check_corpus_kept, check_resume, check_tokenizer_left, check_workdir
from transformer.data.batches import with_start_token
from transformer.data.corpus import load_corpus, load_texts
from transformer.data.tasks import DataTask
from transformer.data.tokenizer import Tokenizer, is_saved, load_tokenizer, make_tokenizer
from transformer.model.config import ModelConfig
from transformer.model.decoder import count_params
from transformer.model.execution import Resolved
from transformer.model.kv_cache import describe_cache_size

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_CACHE_DIR = os.path.join(REPO, ".cache", "tokens")  # where data.cache_dir = "" keeps token streams

# Fields that must be positive integers, and what each one counts.
POSITIVE = {
    "train.steps": "optimizer steps", "train.batch_size": "sequences per step",
    "train.seq_len": "tokens per sequence", "train.grad_accum": "micro-batches per step",
    "train.log_every": "steps between logs", "train.eval_every": "steps between evaluations",
    "train.checkpoint_every": "steps between checkpoints", "train.eval_batches": "validation batches",
    "train.keep_checkpoints": "checkpoints kept",
}
# Fields that must be numbers in a range: (low, high, high included).
IN_RANGE = {
    "optim.min_lr_ratio": (0.0, 1.0, True), "optim.b1": (0.0, 1.0, False), "optim.b2": (0.0, 1.0, False),
    "optim.decay_fraction": (0.0, 1.0, True), "optim.muon_momentum": (0.0, 1.0, False),
    "data.val_fraction": (0.0, 1.0, False),
}
NOT_NEGATIVE = ("train.run_steps", "train.sample_tokens", "optim.warmup_steps", "optim.decay_steps",
                "optim.weight_decay", "optim.grad_clip", "optim.muon_learning_rate", "optim.muon_weight_decay")


# ----------------------------------------------------------------------------- check


@dataclass(frozen=True)
class CheckedConfig:
    """A run's config, checked whole against itself and the workdir's checkpoints."""

    config: ConfigDict  # paths absolute; the model's 'auto' fields as the user wrote them
    execution: Resolved  # execution.cfg: the one ModelConfig the run builds, 'auto' chosen for this backend
    record: dict  # the config as config.json and every checkpoint hold it (saved_form)
    rates: dict[str, optax.Schedule]  # {metric name: learning-rate schedule}, built once
    saved: dict | None  # the latest checkpoint's config (with its "step") when the run resumes

    @property
    def cfg(self) -> ModelConfig:
        return self.execution.cfg


def check_run(config: ConfigDict, workdir: str) -> CheckedConfig:
    """Every check that needs no tokenizer, corpus or compile: the training fields, the workdir, and
    a resume against its checkpoint (optimizer, schedule, data, model)."""
    config = resolve(config, DEFAULT_CACHE_DIR)
    check_train_config(config)
    rates = learning_rates(config.optim, config.train.steps)
    check_workdir(workdir)
    saved = saved_run(workdir)  # the latest checkpoint's config: a resume
    if saved and "optim" in saved and (moved := check_optimizer_kept(saved, config.optim, rates, workdir)):
        warn(moved)  # a checkpoint from before the field is not checked
    record, execution = saved_form(config)
    if saved:
        check_resume(config, record, saved, workdir)
    elif os.path.isdir(os.path.join(workdir, CHECKPOINT_DIR)):  # killed during its first save
        print(f"no complete checkpoint in {os.path.join(workdir, CHECKPOINT_DIR)} (the first save was cut "
              "short): starting the run afresh, its metrics too")
    return CheckedConfig(config, execution, record, rates, saved)


def resolve(config: ConfigDict, default_cache_dir: str) -> ConfigDict:
    """A copy with its paths absolute (an empty data.cache_dir: `default_cache_dir`), so the saved
    config finds its data from any folder."""
    config = config.copy_and_resolve_references()
    if config.data.path:
        config.data.path = os.path.abspath(os.path.expanduser(config.data.path))
    config.data.cache_dir = os.path.abspath(os.path.expanduser(config.data.cache_dir or default_cache_dir))
    return config


def check_train_config(config: ConfigDict) -> None:
    """Errors for training fields that cannot work, each naming the field and the fix."""
    model = config.model
    field = lambda name: config[name.split(".")[0]][name.split(".")[1]]  # noqa: E731
    for name, what in POSITIVE.items():
        if not isinstance(field(name), int) or field(name) <= 0:
            raise ValueError(f"{name}={field(name)!r} must be a positive integer ({what})")
    for name in NOT_NEGATIVE:
        if not math.isfinite(field(name)) or field(name) < 0:
            raise ValueError(f"{name}={field(name)!r} must be a number >= 0")
    for name, (low, high, closed) in IN_RANGE.items():
        if not (low <= field(name) <= high if closed else low <= field(name) < high):
            raise ValueError(f"{name}={field(name)!r} must be in [{low}, {high}{']' if closed else ')'}")
    optimizer_name(config.optim), schedule_name(config.optim)  # clear errors for unknown names
    lr, eps = config.optim.learning_rate, config.optim.eps
    if not (math.isfinite(lr) and lr >= 0):
        raise ValueError(f"optim.learning_rate={lr!r} must be a number >= 0 (the peak rate, e.g. 1e-3)")
    if not (math.isfinite(eps) and eps > 0):
        raise ValueError(f"optim.eps={eps!r} must be a small positive number, e.g. 1e-8")
    if not config.train.peak_flops > 0:
        raise ValueError(f"train.peak_flops={config.train.peak_flops!r} must be positive (the hardware's FLOP/s)")
    if config.data.tokenizer not in ("bytes", "bpe"):
        raise ValueError(f"data.tokenizer={config.data.tokenizer!r} is not known; use 'bytes' or 'bpe'")
    start = config.data.get("start_token", -1)
    if not (isinstance(start, int) and (start == -1 or 0 <= start < model.vocab_size)):
        raise ValueError(f"data.start_token={start!r} must be a token id in [0, {model.vocab_size}) or -1 (none)")
    t = config.train
    if t.seq_len > model.max_seq_len:
        raise ValueError(f"train.seq_len={t.seq_len} exceeds model.max_seq_len={model.max_seq_len}")
    if t.batch_size % t.grad_accum:
        raise ValueError(f"train.batch_size={t.batch_size} is not divisible by train.grad_accum={t.grad_accum}")
    n = jax.device_count() // config.mesh.tensor if jax.device_count() % config.mesh.tensor == 0 else 1
    if (t.batch_size // t.grad_accum) % n:  # rows split over every device but the tensor axis
        raise ValueError(
            f"each micro-batch of {t.batch_size // t.grad_accum} rows must split evenly over {n} devices "
            f"({jax.device_count()} / mesh.tensor={config.mesh.tensor}); change train.batch_size or train.grad_accum"
        )
    decay_steps = config.optim.decay_steps or t.steps
    if decay_steps == config.optim.warmup_steps:  # longer: a run cut short inside its warm-up (check_warmup)
        warn(f"the learning rate warms up for optim.warmup_steps={config.optim.warmup_steps} steps but decays "
             f"over {decay_steps}: it never decays; lower optim.warmup_steps or raise train.steps")


def warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


# ----------------------------------------------------------------------------- build


@dataclass(frozen=True)
class Steps:
    """The compiled steps of a run, and a batch's way onto the mesh."""

    train: Callable  # (state, inputs [B, T], targets [B, T]) -> (state, metrics); donates the state
    eval: Callable  # (params, inputs, targets) -> mean loss
    metrics: dict[str, MetricFn]  # the run's evaluation metrics, by name
    put: Callable  # a host-local batch [B / hosts, T] -> a global array split over the mesh
    compile_seconds: float


@dataclass(frozen=True)
class Run:
    """Everything the loop needs, built once by `set_up`; `state` is the first step's."""

    workdir: str
    config: ConfigDict
    record: dict  # the config as the run saves it (CheckedConfig.record)
    cfg: ModelConfig
    tokenizer: Tokenizer | None  # None: the task reads no text (DataTask.text)
    task: DataTask
    corpus: list[list[str]]  # [[path, SHA-256], ...] of the corpus files: the workdir's corpus.json ([]: no text)
    train_tokens: np.ndarray | None  # [N] the training token stream, memory-mapped (None: no text)
    eval_set: list[tuple[jax.Array, jax.Array]]  # fixed validation batches, on the mesh
    bytes_per_token: float | None  # of the validation text: bits/byte = loss / ln 2 / this (None: no text)
    state: TrainState
    ckpt: Checkpointer | None  # the checkpoints it resumes from; None: a new run (opened by the loop)
    steps: Steps
    flops_per_token: float
    host: int
    hosts: int


def set_up(config: ConfigDict, workdir: str, task: DataTask, metrics: list[EvalMetric]) -> Run:
    """The run of `config` in `workdir` on the data `task`, measured by `metrics`: checked whole,
    then each part built once."""
    checked = check_run(config, workdir)
    config, cfg, t = checked.config, checked.cfg, checked.config.train
    host, hosts = jax.process_index(), jax.process_count()
    mesh = make_mesh(config.mesh.data, config.mesh.fsdp, config.mesh.tensor, expert=config.mesh.get("expert", 1))
    rules = make_rules(cfg, mesh, config.mesh.rules)  # logical axes -> mesh axes, sizes checked
    data_sharding = batch_sharding(mesh, rules)
    tx, _ = make_optimizer(config.optim, t.steps, checked.rates)
    params = None  # a random init, or the weights of config.init_from_hf (a resumed run has its own)
    if config.init_from_hf and checked.saved is None:
        from transformer.hf import check_same_architecture, from_hf  # only init_from_hf runs need the conversions

        hf_cfg, params = from_hf(config.init_from_hf, scan_layers=cfg.scan_layers)
        check_same_architecture(hf_cfg, cfg, seq_len=t.seq_len)
    state = create_state(cfg, tx, t.seed, mesh, params, rules)
    ckpt = Checkpointer(workdir, keep=t.keep_checkpoints) if checked.saved else None  # a new run's opens late
    tokenizer, corpus, train_tokens, val_tokens, bytes_per_token = None, [], None, None, None
    if task.text:  # a task that makes its own batches (tables) reads no corpus
        tokenizer, corpus, train_tokens, val_tokens, bytes_per_token = load_text(checked, workdir, ckpt, host)
    put = lambda x: jax.tree.map(lambda a: jax.make_array_from_process_local_data(data_sharding, a), x)  # noqa: E731
    batches = task.eval_batches(val_tokens, num_batches=t.eval_batches, batch_size=t.batch_size, seq_len=t.seq_len,
                                host_index=host, host_count=hosts)
    eval_set = [(put(x), put(y)) for x, y in (with_start_token(b, config.data.get("start_token", -1)) for b in batches)]
    # Compiled for the fresh state: a checkpoint restores into its shapes and shardings.
    steps = compile_steps(cfg, t.grad_accum, tx, checked.rates, metrics, mesh, rules, state, eval_set[0], put)
    analysis, have = steps.train.memory_analysis(), device_bytes()  # either None where the backend does not say
    need = analysis.argument_size_in_bytes + analysis.temp_size_in_bytes if analysis else 0
    if have and need > have:  # refused before the first step allocates it, and before the loop writes anything
        raise out_of_memory(f"the train step needs {need / 2**30:.1f} GiB, the device holds {have / 2**30:.1f} GiB", config)
    if ckpt is not None:  # each device reads its own shard of each array
        state = ckpt.restore_state(state, checked.record["model"])
        print(f"resumed from the checkpoint at step {int(state.step)} in {ckpt.directory}")
    num_params = count_params(state.params)
    flops = flops_per_token(cfg, num_params, t.seq_len)
    if host == 0:
        cached = cfg.inputs in ("tokens", "image_text")
        cache = f"KV cache {describe_cache_size(cfg)}" if cached else f"{cfg.inputs} read in one pass, no KV cache"
        print(f"model: {num_params:,} parameters, {flops / 1e6:.1f} MFLOP per token (6N + 12 L T d), "
              f"{cache}; {len(jax.devices())} device(s), "
              f"mesh {dict(mesh.shape)}; {checked.execution.describe()}; compiled in {steps.compile_seconds:.1f} s")
    return Run(workdir=workdir, config=config, record=checked.record, cfg=cfg, tokenizer=tokenizer, task=task,
               corpus=corpus, train_tokens=train_tokens, eval_set=eval_set, bytes_per_token=bytes_per_token,
               state=state, ckpt=ckpt, steps=steps, flops_per_token=flops, host=host, hosts=hosts)


def device_bytes() -> int | None:
    """The memory of this process's first device: the allocator's limit (GPU, TPU), or the machine's (CPU)."""
    stats = jax.local_devices()[0].memory_stats()
    return stats.get("bytes_limit") if stats else os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def out_of_memory(what: str, config: ConfigDict) -> ValueError:
    """The one line for a train step that does not fit (`what`: by how much), naming the fields that shrink it."""
    t, m = config.train, config.model
    return ValueError(
        f"out of memory on {jax.default_backend()} ({what}): a step of train.batch_size={t.batch_size} sequences of "
        f"train.seq_len={t.seq_len} tokens (train.grad_accum={t.grad_accum}, model.remat={m.get('remat')!r}) does not "
        "fit; lower --config.train.batch_size, or raise --config.train.grad_accum (the same batch in micro-batches), "
        "or set --config.model.remat=True")


def load_text(checked: CheckedConfig, workdir: str, ckpt: Checkpointer | None, host: int) -> tuple:
    """(tokenizer, corpus digests, train tokens [N], validation tokens [M], bytes per token) of a
    text task, the corpus checked against a resumed run's (`ckpt`: its checkpoints)."""
    data = checked.config.data
    tokenizer = run_tokenizer(checked, workdir, ckpt)
    corpus = load_corpus(data.path or None, tokenizer, data.cache_dir, data.val_fraction)
    if checked.saved:
        check_corpus_kept(workdir, corpus.digests)
    if host == 0 and corpus.skipped:
        print(f"data: left out {len(corpus.skipped)} files under {data.path} that are not UTF-8 text, "
              f"e.g. {corpus.skipped[0]}")
    return tokenizer, corpus.digests, corpus.train, corpus.val, corpus.bytes_per_token


def run_tokenizer(checked: CheckedConfig, workdir: str, ckpt: Checkpointer | None = None) -> Tokenizer:
    """The run's tokenizer, its size checked against model.vocab_size: a resumed run's from its
    checkpoints `ckpt`; a new run's the one left in the workdir by a run that saved no checkpoint
    (if made for the same data), else the imported model's, else a new one."""
    config, tok_dir = checked.config, os.path.join(workdir, "tokenizer")
    left = ckpt is None and is_saved(tok_dir)  # a folder without its kind file is a cut-short write: made again
    if left:
        check_tokenizer_left(config, workdir)
    if ckpt:
        tokenizer = ckpt.tokenizer(checked.saved["step"])
    elif left:
        try:
            tokenizer = load_tokenizer(tok_dir)
        except (ValueError, OSError) as e:  # damaged files: garbled JSON, a truncated tokenizer.json
            raise ValueError(
                f"{tok_dir} is damaged ({e}); the run saved no checkpoint, so nothing was trained with it: "
                "delete that folder and rerun the same command to make it again") from None
    elif config.init_from_hf and os.path.isfile(os.path.join(config.init_from_hf, "tokenizer.json")):
        tokenizer = load_tokenizer(config.init_from_hf)  # imported weights need the ids they were trained on
    elif config.data.tokenizer == "bytes":
        tokenizer = make_tokenizer("bytes")
    else:
        print(f"training a {config.data.vocab_size}-token BPE tokenizer on {config.data.path or 'the bundled plays'} ...",
              flush=True)
        tokenizer = make_tokenizer("bpe", load_texts(config.data.path or None), config.data.vocab_size)
    if tokenizer.vocab_size > checked.cfg.vocab_size:
        raise ValueError(f"the tokenizer has {tokenizer.vocab_size} tokens but model.vocab_size={checked.cfg.vocab_size}; "
                         f"set --config.model.vocab_size={tokenizer.vocab_size}")
    return tokenizer


def compile_steps(cfg: ModelConfig, grad_accum: int, tx, rates: dict, metrics: list[EvalMetric], mesh, rules,
                  state: TrainState, first_batch: tuple[jax.Array, jax.Array], put: Callable) -> Steps:
    """The train step (the state donated), the eval step and the metrics, jitted on the mesh and
    compiled now: the first step's time is training's."""
    compiling = time.perf_counter()
    x, y = first_batch
    step, evaluate = train_step(cfg, tx, rates, grad_accum), eval_step(cfg)
    on_mesh, data = state_sharding(state, mesh, rules), batch_sharding(mesh, rules)
    step = sharded_jit(step, mesh, rules, (on_mesh, data, data), (on_mesh, None), donate_argnums=(0,))
    evaluate = sharded_jit(evaluate, mesh, rules, (state_sharding(state.params, mesh, rules), data, data))
    train, evaluate = step.lower(state, x, y).compile(), evaluate.lower(state.params, x, y).compile()
    measures = {m.name: compile_metric(m, cfg, mesh, state, rules, x, y) for m in metrics}
    return Steps(train=train, eval=evaluate, metrics=measures, put=put, compile_seconds=time.perf_counter() - compiling)
