"""A run's training config: its paths resolved, its values checked, a resume checked against the
checkpoint it continues. Every check raises ValueError (or CheckpointError) naming the field and
the fix, before anything is compiled or written; `train.py` calls them during its set-up.
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile

import jax
import numpy as np
from ml_collections import ConfigDict

from transformer.model.execution import Resolved, resolve_auto
from transformer.run.checkpoint import CheckpointError, Checkpointer, check_same_model
from transformer.model.config import ModelConfig
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


def check_workdir(workdir: str) -> None:
    """A clear error for a workdir that is empty, a file, or cannot be created or written."""
    if not workdir or not workdir.strip():
        raise ValueError("--workdir is empty; name a folder for the run, e.g. --workdir runs/my_run")
    if os.path.exists(workdir) and not os.path.isdir(workdir):
        raise ValueError(f"--workdir {workdir!r} is a file, not a folder; choose another --workdir")
    existing = os.path.abspath(workdir)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise ValueError(f"--workdir {workdir!r} cannot be created: {existing} is a file")
    check_writable(existing, f"--workdir {workdir!r} cannot be written", "choose a folder you can write to")
    checkpoints = os.path.join(workdir, "checkpoints")
    if os.path.isdir(checkpoints):  # a resume: its saves go there
        check_writable(checkpoints, f"the checkpoints of {workdir!r} cannot be written",
                       "make that folder writable (chmod u+w), then rerun")


def check_writable(folder: str, what: str, fix: str) -> None:
    """Raises ValueError('<what> (<reason> in <folder>); <fix>') unless a file can be made in `folder`."""
    try:  # the only sure test of writing is to write (and remove) something
        os.rmdir(tempfile.mkdtemp(dir=folder, prefix=".write-test-"))
    except OSError as e:
        raise ValueError(f"{what} ({e.strerror} in {folder}); {fix}") from None


def warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


# What a resumed run must share with the run that saved the checkpoint, beyond the model.
SAME_DATA = ("tokenizer", "vocab_size", "path")


def check_resume(config: ConfigDict, record: dict, ckpt: Checkpointer, workdir: str) -> dict:
    """Checks the config (`record`: as the run saves it) against the latest checkpoint's; returns
    that config (with its "step").

    Errors for another model or data, or fewer train.steps than done; warnings for a learning
    rate schedule that changes on steps already taken; a note listing changed execution fields.
    """
    step = ckpt.latest_step()
    if step is None:
        raise CheckpointError(f"{ckpt.directory} holds no complete checkpoint; delete that folder to start "
                              "the run afresh, or choose another --workdir")
    saved = ckpt.config(step)
    changed = check_same_model(saved["model"], record["model"], ckpt.directory)
    # data.task too: text windows and needle documents are different data on the same corpus
    # (a checkpoint from before the field existed was trained on text).
    saved_data = {**saved_data_fields(saved), "task": saved.get("data", {}).get("task", "text")}
    differ = [f"data.{k}: checkpoint {v!r}, config {config.data[k]!r}"
              for k, v in saved_data.items() if v != config.data[k]]
    if saved_data["task"] == config.data.task == "needle":  # the documents' fields; a checkpoint from before
        # `facts`, `question` and `questions` existed asked about one fact, in words, once
        before = {"facts": 1, "question": "question", "questions": 1, **saved["data"].get("needle", {})}
        differ += [f"data.needle.{k}: checkpoint {v!r}, config {config.data.needle[k]!r}"
                   for k, v in sorted(before.items()) if k in config.data.needle and v != config.data.needle[k]]
    if saved_data["task"] == config.data.task == "tables":  # the prior the tables are drawn from
        before = saved["data"].get("tables", {})
        differ += [f"data.tables.{k}: checkpoint {v!r}, config {config.data.tables[k]!r}"
                   for k, v in sorted(before.items()) if k in config.data.tables and v != config.data.tables[k]]
    if differ:
        raise CheckpointError(f"the checkpoints in {workdir} were trained on other data ({'; '.join(differ)}); "
                              "resume with the same data fields, or start a new --workdir")
    if config.train.steps < step:
        raise ValueError(f"train.steps={config.train.steps} is below the checkpoint's step {step} in {workdir}; "
                         f"set train.steps >= {step}, or start a new --workdir")
    if changed:
        print(f"resuming with other execution settings: {', '.join(changed)}")
    if "optim" in saved:
        check_optimizer_kept(saved, config, workdir)
        check_schedule_kept(saved, config, step)
    return {**saved, "step": step}


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


def check_tokenizer_left(config: ConfigDict, workdir: str) -> None:
    """Raises if the tokenizer in `workdir` (left by a run that saved no checkpoint) was made for
    other data than the config's, as that run's config.json records."""
    config_json = os.path.join(workdir, "config.json")
    left = {}
    if os.path.isfile(config_json):
        with open(config_json) as f:
            left = saved_data_fields(json.load(f))
    differ = [f"data.{k}: {left.get(k)!r} there, {config.data[k]!r} now" for k in SAME_DATA
              if left.get(k) != config.data[k]]
    if differ:
        raise ValueError(f"{os.path.join(workdir, 'tokenizer')} was made for other data ({'; '.join(differ)}); "
                         "delete that folder (the run saved no checkpoint) or choose another --workdir")


def saved_data_fields(saved: dict) -> dict:
    """The SAME_DATA fields of a saved config, a relative data.path made absolute as `resolve` does."""
    fields = {k: saved.get("data", {}).get(k) for k in SAME_DATA}
    if fields["path"]:
        fields["path"] = os.path.abspath(os.path.expanduser(fields["path"]))
    return fields


CORPUS_RECORD = "corpus.json"  # in the workdir: [[path, SHA-256], ...] of the files the run trains on


def check_corpus_kept(workdir: str, digests: list[list[str]]) -> None:
    """Raises if the corpus files differ from the ones the run in `workdir` was trained on (its
    corpus.json, `token_stream.file_digests`), naming what was removed, added or changed. A run saved
    before the record existed is not checked."""
    record = os.path.join(workdir, CORPUS_RECORD)
    if not os.path.isfile(record):
        return
    with open(record) as f:
        before = dict(json.load(f))
    now = dict(digests)
    what = ([f"removed {p}" for p in before if p not in now] + [f"added {p}" for p in now if p not in before]
            + [f"changed {p}" for p in now if p in before and now[p] != before[p]])
    if what:
        more = f"; {len(what) - 3} more" if len(what) > 3 else ""
        raise CheckpointError(f"the corpus changed since the checkpoints in {workdir} were written ({'; '.join(what[:3])}"
                              f"{more}): the validation loss would mix two validation sets. Restore the corpus, or "
                              "train on the new one in a new --workdir")
