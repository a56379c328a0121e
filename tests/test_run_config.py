"""Tests of transformer/training/setup.py's checks, called directly: resolve, check_train_config, check_workdir,
and optimizer.check_optimizer_kept. (tests/test_train_inputs.py runs the same checks through train.py.)"""

from __future__ import annotations

import os
import re

import pytest

from configs import tiny
from transformer.training import setup
from transformer.model.config import ModelConfig
from transformer.run.checkpoint import CheckpointError
from transformer.run.workdir import check_workdir
from transformer.training.optimizer import check_optimizer_kept, learning_rates
from transformer.training.setup import check_train_config, resolve


def config_and_model(**overrides):
    """configs/tiny.py with `overrides` ({"train.steps": 3, ...}) and its ModelConfig."""
    config = tiny.get_config()
    for name, value in overrides.items():
        section, field = name.split(".")
        config[section][field] = value
    return config, ModelConfig.from_dict(config.model)


# ----------------------------------------------------------------------------- resolve


def test_resolve_makes_paths_absolute_in_a_copy(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config, _ = config_and_model(**{"data.path": "texts/*.txt"})
    resolved = resolve(config, "tokens")
    assert resolved.data.path == str(tmp_path / "texts" / "*.txt")
    assert resolved.data.cache_dir == str(tmp_path / "tokens")  # empty: the default, made absolute
    assert (config.data.path, config.data.cache_dir) == ("texts/*.txt", "")  # the original is untouched


def test_resolve_expands_home_keeps_given_cache_dir_and_empty_path(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    config, _ = config_and_model(**{"data.cache_dir": "~/cache"})
    resolved = resolve(config, "/unused")
    assert resolved.data.cache_dir == str(tmp_path / "cache")
    assert resolved.data.path == ""  # "" is the bundled corpus, not a path


def test_resolve_freezes_references():
    """data.vocab_size refers to model.vocab_size in the config file; the resolved copy holds the
    value, so the saved config reads the same without ml_collections."""
    config, _ = config_and_model()
    resolved = resolve(config, "/tmp/tokens")
    config.model.vocab_size = 512
    assert config.data.vocab_size == 512 and resolved.data.vocab_size == 256


# ----------------------------------------------------------------------------- check_train_config


def test_the_tiny_config_passes(capsys):
    check_train_config(config_and_model()[0])
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("override, message", [
    ({"train.steps": 0}, r"train.steps=0 must be a positive integer \(optimizer steps\)"),
    ({"train.batch_size": -8}, r"train.batch_size=-8 must be a positive integer \(sequences per step\)"),
    ({"train.keep_checkpoints": -1}, r"train.keep_checkpoints=-1 must be a positive integer"),
    ({"train.run_steps": -1}, r"train.run_steps=-1 must be a number >= 0"),
    ({"optim.grad_clip": float("nan")}, r"optim.grad_clip=nan must be a number >= 0"),
    ({"optim.min_lr_ratio": 1.5}, r"optim.min_lr_ratio=1.5 must be in \[0.0, 1.0\]"),
    ({"optim.b2": 1.0}, r"optim.b2=1.0 must be in \[0.0, 1.0\)"),
    ({"data.val_fraction": -0.1}, r"data.val_fraction=-0.1 must be in \[0.0, 1.0\)"),
    ({"optim.learning_rate": -1e-3}, r"optim.learning_rate=-0.001 must be a number >= 0"),
    ({"optim.learning_rate": float("inf")}, r"optim.learning_rate=inf"),
    ({"optim.eps": 0.0}, r"optim.eps=0.0 must be a small positive number"),
    ({"train.peak_flops": 0.0}, r"train.peak_flops=0.0 must be positive"),
    ({"data.tokenizer": "bytepair"}, r"data.tokenizer='bytepair' is not known; use 'bytes' or 'bpe'"),
    ({"train.seq_len": 65}, r"train.seq_len=65 exceeds model.max_seq_len=64"),
    ({"train.grad_accum": 3}, r"train.batch_size=8 is not divisible by train.grad_accum=3"),
    ({"optim.name": "adam"}, r"optim.name='adam' is not known; use one of \['adamw', 'muon'\]"),
    ({"optim.schedule": "linear"}, r"optim.schedule='linear' is not known; use one of \['cosine', 'wsd'\]"),
    ({"optim.decay_fraction": 1.5}, r"optim.decay_fraction=1.5 must be in \[0.0, 1.0\]"),
    ({"optim.muon_momentum": 1.0}, r"optim.muon_momentum=1.0 must be in \[0.0, 1.0\)"),
    ({"optim.muon_learning_rate": -0.02}, r"optim.muon_learning_rate=-0.02 must be a number >= 0"),
])
def test_a_bad_field_raises_naming_it(override, message):
    with pytest.raises(ValueError, match=message):
        check_train_config(config_and_model(**override)[0])


def test_micro_batches_must_split_over_the_devices(monkeypatch):
    monkeypatch.setattr(setup.jax, "device_count", lambda: 3)
    with pytest.raises(ValueError, match="micro-batch of 4 rows must split evenly over 3 devices"):
        check_train_config(config_and_model(**{"train.grad_accum": 2})[0])
    monkeypatch.setattr(setup.jax, "device_count", lambda: 4)
    check_train_config(config_and_model(**{"train.grad_accum": 2})[0])


def test_a_warm_up_as_long_as_the_decay_warns(capsys):
    check_train_config(config_and_model(**{"train.steps": 5, "optim.warmup_steps": 5})[0])
    err = capsys.readouterr().err
    assert err.startswith("warning: ") and "optim.warmup_steps=5" in err and "never decays" in err
    check_train_config(config_and_model(**{"train.steps": 5, "optim.warmup_steps": 5, "optim.decay_steps": 6})[0])
    assert capsys.readouterr().err == ""


# ----------------------------------------------------------------------------- check_workdir


def test_check_workdir_accepts_new_and_existing_folders_and_leaves_nothing(tmp_path):
    check_workdir(str(tmp_path))
    check_workdir(str(tmp_path / "a" / "b"))  # created later, by the run
    assert os.listdir(tmp_path) == []  # the write test removed its folder; nothing was created


def test_check_workdir_errors(tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(ValueError, match="--workdir is empty"):
        check_workdir("")
    with pytest.raises(ValueError, match="--workdir is empty"):
        check_workdir("  ")
    with pytest.raises(ValueError, match="is a file, not a folder"):
        check_workdir(str(a_file))
    with pytest.raises(ValueError, match=re.escape(f"cannot be created: {a_file} is a file")):
        check_workdir(str(a_file / "run" / "deeper"))


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs a folder nobody can write: /proc")
def test_check_workdir_in_a_folder_nobody_can_write():
    with pytest.raises(ValueError, match="'/proc/no-such-run' cannot be written .* in /proc"):
        check_workdir("/proc/no-such-run")


# ----------------------------------------------------------------------------- check_optimizer_kept


def check_schedule_kept(saved: dict, config, step: int) -> None:
    """check_optimizer_kept with the config's schedules, as check_run builds them, its warning printed
    as check_run prints it."""
    warning = check_optimizer_kept({**saved, "step": step}, config.optim,
                                   learning_rates(config.optim, config.train.steps), "runs/x")
    if warning:
        setup.warn(warning)


def saved_run(config) -> dict:
    """The saved config of a finished run, as checkpoint.json holds it (plain dicts)."""
    return config.to_dict()


def test_resuming_on_the_same_schedule_is_silent(capsys):
    config, _ = config_and_model()
    check_schedule_kept(saved_run(config), config, step=40)
    assert capsys.readouterr().err == ""


def test_extending_train_steps_re_spans_the_cosine_and_warns_with_the_fix(capsys):
    """More train.steps with decay_steps 0 stretches the cosine over steps already taken; keeping
    decay_steps at the old train.steps keeps them, and the run goes on at the final rate."""
    saved = saved_run(config_and_model()[0])  # 40 steps, decay over all of them
    longer, _ = config_and_model(**{"train.steps": 80})
    check_schedule_kept(saved, longer, step=40)
    err = capsys.readouterr().err
    assert err.startswith("warning: this resume changes the learning rate schedule of the steps already taken")
    assert "step 39:" in err and err.rstrip().endswith("add --config.optim.decay_steps=40")
    kept, _ = config_and_model(**{"train.steps": 80, "optim.decay_steps": 40})
    check_schedule_kept(saved, kept, step=40)
    assert capsys.readouterr().err == ""


def test_a_change_after_the_resumed_step_is_silent_and_one_before_warns(capsys):
    saved = saved_run(config_and_model()[0])
    warmup_longer, _ = config_and_model(**{"optim.warmup_steps": 10})
    check_schedule_kept(saved, warmup_longer, step=1)  # step 0 is 0 in both warm-ups
    assert capsys.readouterr().err == ""
    check_schedule_kept(saved, warmup_longer, step=20)
    assert "warning: this resume changes the learning rate schedule" in capsys.readouterr().err


def test_resuming_with_another_optimizer_is_refused_naming_the_field():
    saved = {**saved_run(config_and_model()[0]), "step": 40}
    del saved["optim"]["name"]  # a checkpoint from before the field: AdamW
    kept = config_and_model(**{"optim.name": "adamw"})[0]
    assert check_optimizer_kept(saved, kept.optim, learning_rates(kept.optim, 40), "runs/x") is None
    with pytest.raises(CheckpointError, match=r"trained with optim.name='adamw', whose optimizer state "
                       r"optim.name='muon' cannot continue; resume with --config.optim.name=adamw"):
        other = config_and_model(**{"optim.name": "muon"})[0]
        check_optimizer_kept(saved, other.optim, learning_rates(other.optim, 40), "runs/x")


def test_a_changed_muon_rate_warns_naming_it(capsys):
    saved = saved_run(config_and_model(**{"optim.name": "muon"})[0])
    check_schedule_kept(saved, config_and_model(**{"optim.name": "muon", "optim.muon_learning_rate": 0.01})[0], step=20)
    assert "warning: this resume changes the Muon learning rate schedule" in capsys.readouterr().err
