"""A run's training config: its paths resolved, its values checked, the form it is saved in, and a
resume's optimizer checked against the checkpoint it continues (the run folder's own checks are
run/workdir.py's). Every check raises ValueError (or CheckpointError) naming the field and the fix,
before anything is compiled or written.
"""

from __future__ import annotations

import math
import os
import sys

import jax
import numpy as np
from ml_collections import ConfigDict

from transformer.model.config import ModelConfig
from transformer.model.execution import Resolved, resolve_auto
from transformer.run.checkpoint import CheckpointError
from transformer.training.optimizer import learning_rates, optimizer_name, schedule_name


def resolve(config: ConfigDict, default_cache_dir: str) -> ConfigDict:
    """A copy of the config with its paths absolute, so the saved config finds its data from any
    folder: data.path against the current folder, an empty data.cache_dir as `default_cache_dir`."""
    config = config.copy_and_resolve_references()
    if config.data.path:
        config.data.path = os.path.abspath(os.path.expanduser(config.data.path))
    config.data.cache_dir = os.path.abspath(os.path.expanduser(config.data.cache_dir or default_cache_dir))
    return config


def saved_config(config: ConfigDict, resolved: Resolved) -> dict:
    """The config as the run saves it (config.json, every checkpoint): the model's 'auto' fields as
    `resolved` chose them, and which fields were 'auto' on which backend, as
    auto = {"backend": ..., "fields": [...]}, so that a reader on another backend (sample.py, the
    notebooks) chooses them again; a resumed run chooses them again from its own config, and another
    backend's choices show as changed execution settings (see check_resume)."""
    record = config.to_dict()
    record["model"].update({name: getattr(resolved.cfg, name) for name in resolved.auto})
    record["auto"] = {"backend": resolved.backend, "fields": list(resolved.auto)}
    return record


def choose_execution(config: ConfigDict, backend: str | None = None) -> tuple[ConfigDict, Resolved]:
    """The saved form of `config` (saved_config) with its 'auto' fields chosen for `backend`, and
    that choice."""
    resolved = resolve_auto(ModelConfig.from_dict(config.model), backend, seq_len=config.train.seq_len)
    return ConfigDict(saved_config(config, resolved)), resolved


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


def check_train_config(config: ConfigDict, cfg: ModelConfig) -> None:
    """Errors for training fields that cannot work, each naming the field and the fix; run
    before anything is compiled or written."""
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
    if not (isinstance(start, int) and (start == -1 or 0 <= start < cfg.vocab_size)):
        raise ValueError(f"data.start_token={start!r} must be a token id in [0, {cfg.vocab_size}) or -1 (none)")
    t = config.train
    if t.seq_len > cfg.max_seq_len:
        raise ValueError(f"train.seq_len={t.seq_len} exceeds model.max_seq_len={cfg.max_seq_len}")
    if t.batch_size % t.grad_accum:
        raise ValueError(f"train.batch_size={t.batch_size} is not divisible by train.grad_accum={t.grad_accum}")
    n = jax.device_count() // config.mesh.tensor if jax.device_count() % config.mesh.tensor == 0 else 1
    if (t.batch_size // t.grad_accum) % n:  # rows split over every device but the tensor axis
        raise ValueError(
            f"each micro-batch of {t.batch_size // t.grad_accum} rows must split evenly over {n} devices "
            f"({jax.device_count()} / mesh.tensor={config.mesh.tensor}); change train.batch_size or train.grad_accum"
        )
    decay_steps = config.optim.decay_steps or t.steps
    if decay_steps == config.optim.warmup_steps:  # longer: make_optimizer refuses it (check_warmup)
        warn(f"the learning rate warms up for optim.warmup_steps={config.optim.warmup_steps} steps but decays "
             f"over {decay_steps}: it never decays; lower optim.warmup_steps or raise train.steps")


def warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


def check_optimizer_kept(saved: dict, config: ConfigDict, workdir: str) -> None:
    """Raises if the config names another optimizer than the checkpoint's: its state (AdamW's
    moments, or Muon's momentum and AdamW's) cannot continue another's."""
    before, now = optimizer_name(saved["optim"]), optimizer_name(config.optim)
    if before != now:
        raise CheckpointError(
            f"the checkpoints in {workdir} were trained with optim.name={before!r}, whose optimizer state "
            f"optim.name={now!r} cannot continue; resume with --config.optim.name={before}, or start a new --workdir"
        )


def check_schedule_kept(saved: dict, config: ConfigDict, step: int) -> None:
    """Warns if the learning rate of steps already taken differs under the new config (either rate,
    with Muon): the run then continues on another schedule than the one it followed (e.g. a cosine
    re-spanned)."""
    before = learning_rates(saved["optim"], saved["train"]["steps"])
    now = learning_rates(config.optim, config.train.steps)
    steps = np.arange(step)
    for name in before.keys() & now.keys():
        moved = np.flatnonzero(~np.isclose(np.asarray(before[name](steps)), np.asarray(now[name](steps)),
                                           rtol=1e-5, atol=0))
        if moved.size:
            s = int(moved[-1])
            old_decay = saved["optim"].get("decay_steps", 0) or saved["train"]["steps"]
            rate = name.replace("muon_", "Muon ").replace("_", " ")  # learning rate, Muon learning rate
            warn(f"this resume changes the {rate} schedule of the steps already taken (step {s}: "
                 f"{float(before[name](s)):.2e} then, {float(now[name](s)):.2e} now), so training continues on "
                 f"another curve. To extend the finished schedule at its final rate, add "
                 f"--config.optim.decay_steps={old_decay}")
            return


