"""A training run's set-up, top to bottom: the whole config is checked first (`check_run`: one
ModelConfig, its 'auto' fields chosen for this backend), then each part of the run is built once
from the checked config (`set_up_run`): tokenizer, corpus, mesh, optimizer, state and compiled steps. Nothing is written to the workdir here: the loop (loop.py) writes once the set-up
has succeeded, so a failed or interrupted set-up leaves the workdir as it was.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import jax
import numpy as np
from ml_collections import ConfigDict

from transformer.data.batches import with_start_token
from transformer.data.corpus import corpus_files, load_texts, skipped_files
from transformer.data.tasks import DataTask
from transformer.data.token_stream import file_digests, load_corpus
from transformer.data.tokenizer import Tokenizer, is_saved, load_tokenizer, make_tokenizer
from transformer.model.config import ModelConfig
from transformer.model.decoder import count_params
from transformer.model.execution import Resolved, resolve_auto
from transformer.model.kv_cache import describe_cache_size
from transformer.training import steps as train_steps
from transformer.run.checkpoint import CHECKPOINT_DIR, Checkpointer, latest_step
from transformer.training.eval_metrics import EvalMetric, MetricFn, compile_metric
from transformer.training.optimizer import learning_rates, make_optimizer
from transformer.run.workdir import check_corpus_kept, check_resume, check_tokenizer_left, check_workdir
from transformer.training.run_config import (check_optimizer_kept, check_schedule_kept, check_train_config, resolve,
                                             saved_config)
from transformer.training.sharding import batch_sharding, make_mesh, make_rules

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
DEFAULT_CACHE_DIR = os.path.join(REPO, ".cache", "tokens")  # where data.cache_dir = "" keeps token streams


@dataclass(frozen=True)
class CheckedConfig:
    """A run's config, checked whole against itself and the workdir's checkpoints."""

    config: ConfigDict  # paths absolute; the model's 'auto' fields left as the user wrote them
    execution: Resolved  # execution.cfg: the one ModelConfig the run builds, 'auto' chosen for this backend
    record: dict  # the config as config.json and every checkpoint hold it ('auto' choices and their record)
    ckpt: Checkpointer | None  # the workdir's checkpoints when the run resumes, else None
    saved: dict | None  # the latest checkpoint's config (with its "step") when the run resumes

    @property
    def cfg(self) -> ModelConfig:
        return self.execution.cfg


def check_run(config: ConfigDict, workdir: str) -> CheckedConfig:
    """Every check of a run's config that needs no tokenizer, corpus or compile; raises ValueError
    or CheckpointError naming the field and the fix. Writes nothing."""
    config = resolve(config, DEFAULT_CACHE_DIR)
    execution = resolve_auto(ModelConfig.from_dict(config.model), seq_len=config.train.seq_len)
    check_train_config(config, execution.cfg)
    check_workdir(workdir)
    ckpt = None
    if latest_step(workdir) is not None:  # a complete checkpoint: resume from the latest
        ckpt = Checkpointer(workdir, keep=config.train.keep_checkpoints)
    elif os.path.isdir(os.path.join(workdir, CHECKPOINT_DIR)):  # killed during its first save
        print(f"no complete checkpoint in {os.path.join(workdir, CHECKPOINT_DIR)} (the first save was cut "
              "short): starting the run afresh, its metrics too")
    record = saved_config(config, execution)
    try:
        saved = check_resume(config, record, ckpt, workdir) if ckpt else None
        if saved and "optim" in saved:
            check_optimizer_kept(saved, config, workdir)
            check_schedule_kept(saved, config, saved["step"])
    except Exception:
        ckpt.close()  # no orbax thread left running at exit
        raise
    return CheckedConfig(config, execution, record, ckpt, saved)


@dataclass(frozen=True)
class Steps:
    """The compiled steps of a run, and a batch's way onto the mesh."""

    train: Callable  # (state, inputs [B, T], targets [B, T]) -> (state, metrics); donates the state
    eval: Callable  # (params, inputs, targets) -> mean loss
    metrics: dict[str, MetricFn]  # the run's evaluation metrics (eval_metrics.py), by name
    put: Callable  # a host-local batch [B / hosts, T] -> a global array split over the mesh
    compile_seconds: float


@dataclass(frozen=True)
class Run:
    """What one training run is made of, built once by `set_up_run`. The train state and the
    checkpointer travel apart: the state changes every step, the checkpointer opens late."""

    config: ConfigDict
    record: dict  # the config as the run saves it (CheckedConfig.record)
    cfg: ModelConfig
    tokenizer: Tokenizer | None  # None: the task reads no text (DataTask.text)
    steps: Steps
    task: DataTask
    corpus: list[list[str]]  # [[path, SHA-256], ...] of the corpus files: the workdir's corpus.json ([]: no text)
    train_tokens: np.ndarray | None  # [N] the training token stream, memory-mapped (None: no text)
    eval_set: list[tuple[jax.Array, jax.Array]]  # fixed validation batches, on the mesh
    bytes_per_token: float | None  # of the validation text: bits/byte = loss / ln 2 / this (None: no text)
    flops_per_token: float
    host: int
    hosts: int


def set_up_run(config: ConfigDict, workdir: str, task: DataTask, metrics: list[EvalMetric]
               ) -> tuple[Run, train_steps.TrainState, Checkpointer | None]:
    """The run of `config` on the data `task`, measured by `metrics`: its state (the latest
    checkpoint's when the workdir has one) and the checkpointer (None for a new run: it is opened
    once the set-up has succeeded). The config is checked first, whole; then each part is built once."""
    checked = check_run(config, workdir)
    config, cfg, t = checked.config, checked.cfg, checked.config.train
    host, hosts = jax.process_index(), jax.process_count()
    tokenizer, corpus, (train_tokens, val_tokens, bytes_per_token) = None, [], (None, None, None)
    if task.text:  # a task that makes its own batches (tables) reads no corpus
        tokenizer = run_tokenizer(checked, workdir)
        train_tokens, val_tokens, bytes_per_token = load_corpus(
            config.data.path or None, tokenizer, config.data.cache_dir, config.data.val_fraction
        )
        corpus = file_digests(corpus_files(config.data.path or None), Path(config.data.cache_dir))
    if checked.saved:
        check_corpus_kept(workdir, corpus)
    if host == 0 and task.text and (skipped := skipped_files(config.data.path or None)):
        print(f"data: left out {len(skipped)} files under {config.data.path} that are not UTF-8 text, "
              f"e.g. {skipped[0]}")
    mesh = make_mesh(config.mesh.data, config.mesh.fsdp, config.mesh.tensor)
    rules = make_rules(cfg, mesh, config.mesh.rules)  # logical axes -> mesh axes, sizes checked
    rates = learning_rates(config.optim, t.steps)  # logged: learning_rate (AdamW's), with Muon also muon_learning_rate
    tx, _ = make_optimizer(config.optim, t.steps, rates)
    state = create_or_restore_state(checked, tx, mesh, rules)
    put = lambda x: jax.make_array_from_process_local_data(batch_sharding(mesh, rules), x)  # noqa: E731
    eval_set = [(put(x), put(y)) for x, y in (with_start_token(b, config.data.get("start_token", -1)) for b in
                                              task.eval_batches(
        val_tokens, num_batches=t.eval_batches, batch_size=t.batch_size, seq_len=t.seq_len, host_index=host,
        host_count=hosts))]
    steps = compile_steps(cfg, t.grad_accum, tx, rates, metrics, mesh, rules, state, eval_set[0], put)
    num_params = count_params(state.params)
    flops_per_token = train_steps.flops_per_token(cfg, num_params, t.seq_len)
    if host == 0:
        cache = f"KV cache {describe_cache_size(cfg)}" if cfg.inputs == "tokens" else "a table read in one pass, no KV cache"
        print(f"model: {num_params:,} parameters, {flops_per_token / 1e6:.1f} MFLOP per token (6N + 12 L T d), "
              f"{cache}; {len(jax.devices())} device(s), "
              f"mesh {dict(mesh.shape)}; {checked.execution.describe()}; compiled in {steps.compile_seconds:.1f} s")
    run = Run(config=config, record=checked.record, cfg=cfg, tokenizer=tokenizer, steps=steps, task=task,
              corpus=corpus, train_tokens=train_tokens, eval_set=eval_set, bytes_per_token=bytes_per_token,
              flops_per_token=flops_per_token, host=host, hosts=hosts)
    return run, state, checked.ckpt


def run_tokenizer(checked: CheckedConfig, workdir: str) -> Tokenizer:
    """The run's tokenizer, its size checked against model.vocab_size: a resumed run's from its
    checkpoint; a new run's the one left in the workdir by a run that saved no checkpoint (if made
    for the same data), else the imported model's, else a new one."""
    config = checked.config
    tokenizer = checked.ckpt.tokenizer(checked.saved["step"]) if checked.saved else new_tokenizer(config, workdir)
    if tokenizer.vocab_size > checked.cfg.vocab_size:
        raise ValueError(f"the tokenizer has {tokenizer.vocab_size} tokens but model.vocab_size={checked.cfg.vocab_size}; "
                         f"set --config.model.vocab_size={tokenizer.vocab_size}")
    return tokenizer


def new_tokenizer(config: ConfigDict, workdir: str) -> Tokenizer:
    """A new run's tokenizer (see run_tokenizer)."""
    tok_dir = os.path.join(workdir, "tokenizer")
    if is_saved(tok_dir):  # a folder without its kind file is a write a kill cut short: made again
        check_tokenizer_left(config, workdir)
        try:
            return load_tokenizer(tok_dir)
        except (ValueError, OSError) as e:  # damaged files: garbled JSON, a truncated tokenizer.json
            raise ValueError(
                f"{tok_dir} is damaged ({e}); the run saved no checkpoint, so nothing was trained with it: "
                "delete that folder and rerun the same command to make it again") from None
    if config.init_from_hf and os.path.isfile(os.path.join(config.init_from_hf, "tokenizer.json")):
        return load_tokenizer(config.init_from_hf)  # imported weights need the ids they were trained on
    if config.data.tokenizer == "bytes":
        return make_tokenizer("bytes")
    print(f"training a {config.data.vocab_size}-token BPE tokenizer on {config.data.path or 'the bundled plays'} ...",
          flush=True)
    return make_tokenizer("bpe", load_texts(config.data.path or None), config.data.vocab_size)


def create_or_restore_state(checked: CheckedConfig, tx, mesh, rules) -> train_steps.TrainState:
    """The latest checkpoint's state if there is one (resume), else a new one at step 0.

    A new state starts from the weights in config.init_from_hf when set, else from a random init.
    """
    config, cfg, ckpt = checked.config, checked.cfg, checked.ckpt
    params = None
    if config.init_from_hf and ckpt is None:  # a resumed run has its own weights in the checkpoint
        from transformer.hf import check_same_architecture, from_hf  # only init_from_hf runs need the conversions

        hf_cfg, params = from_hf(config.init_from_hf, scan_layers=cfg.scan_layers)
        check_same_architecture(hf_cfg, cfg, seq_len=config.train.seq_len)
    state = train_steps.create_state(cfg, tx, config.train.seed, mesh, params, rules)
    if ckpt is not None:  # the fresh state gives the shapes and shardings to restore into (orbax reads
        # each device's shard of each array: nothing is gathered on one host)
        state = ckpt.restore_state(state, checked.record["model"])
        print(f"resumed from the checkpoint at step {int(state.step)} in {ckpt.directory}")
    return state


def compile_steps(cfg: ModelConfig, grad_accum: int, tx, rates: dict, metrics: list[EvalMetric], mesh, rules,
                  state: train_steps.TrainState, first_batch: tuple[jax.Array, jax.Array], put: Callable) -> Steps:
    """The train step, the eval step and the evaluation metrics, compiled here so that the first
    step's time is training only."""
    compiling = time.perf_counter()
    x, y = first_batch
    train = train_steps.make_train_step(cfg, tx, rates, mesh, state, grad_accum, rules).lower(state, x, y).compile()
    evaluate = train_steps.make_eval_step(cfg, mesh, state, rules).lower(state.params, x, y).compile()
    measures = {m.name: compile_metric(m, cfg, mesh, state, rules, x) for m in metrics}
    return Steps(train=train, eval=evaluate, metrics=measures, put=put, compile_seconds=time.perf_counter() - compiling)


def init_distributed() -> None:
    """A multi-host run (docs/usage.md, "Several hosts"): with JAX_COORDINATOR_ADDRESS=host:port,
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
