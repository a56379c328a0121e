"""'auto' execution settings (transformer/model/execution.py): dtype and attention_impl chosen per backend.

The GPU and TPU choices are tested by naming the backend (no accelerator is needed); the CPU's by
training through train.py, whose model line, config.json and resumes carry them.
"""

from __future__ import annotations

import importlib
import json
import math

import jax
import jax.numpy as jnp
import pytest

from ml_collections import ConfigDict

from configs import tiny
from tests.helpers.cli import losses, run
from tests.test_config import CONFIG_FILES
from transformer.model.execution import resolve_auto
from transformer.model.kv_cache import kv_cache_bytes_per_token
from transformer.run.checkpoint import restore_for_inference, saved_model_config
from transformer.model.config import ModelConfig
from transformer.model.decoder import Decoder
from transformer.run.checkpoint import saved_form

AUTO = dict(dtype="auto", attention_impl="auto")
SMALL = dict(vocab_size=64, max_seq_len=16, d_model=32, num_layers=1, num_heads=4)  # head_dim 8


@pytest.mark.parametrize("backend, dtype, attention_impl", [
    ("gpu", "bfloat16", "cudnn"),
    ("tpu", "bfloat16", "xla"),
    ("cpu", "float32", "reference"),
])
def test_auto_follows_the_backend(backend, dtype, attention_impl):
    resolved = resolve_auto(ModelConfig(**SMALL, **AUTO), backend)
    assert (resolved.cfg.dtype, resolved.cfg.attention_impl) == (dtype, attention_impl)
    assert resolved.auto == ("dtype", "attention_impl") and resolved.note == ""
    assert resolved.describe() == f"dtype {dtype}, attention {attention_impl} (dtype and attention_impl auto on {backend})"
    assert resolved.cfg.architecture() == ModelConfig(**SMALL).architecture()  # the same parameters


def test_the_default_backend_is_the_one_jax_runs_on():
    assert resolve_auto(ModelConfig(**SMALL, **AUTO)).backend == jax.default_backend()


def test_explicit_values_are_kept_on_every_backend():
    cfg = ModelConfig(**SMALL, dtype="float16", attention_impl="xla")
    for backend in ("gpu", "tpu", "cpu"):
        resolved = resolve_auto(cfg, backend)
        assert resolved.cfg == cfg and resolved.auto == ()
        assert resolved.describe() == "dtype float16, attention xla"


@pytest.mark.parametrize("fields, seq_len, why", [
    (dict(dtype="float32"), None, "it runs in bfloat16 or float16, not float32"),
    (dict(d_model=80), None, "multiple of 8 and at most 128, not 20"),  # head_dim 80 / 4
    (dict(d_model=1024), None, "multiple of 8 and at most 128, not 256"),
    (dict(attention="mla", position="rope", head_dim=124, rope_head_dim=8, kv_latent_dim=16), None, "not 132"),
    ({}, 63, "an even sequence length with a mask, not 63"),
])
def test_on_a_gpu_auto_attention_falls_back_to_xla_where_cudnn_cannot_run(fields, seq_len, why):
    cfg = ModelConfig(**{**SMALL, "attention_impl": "auto", "dtype": "auto", **fields})
    resolved = resolve_auto(cfg, "gpu", seq_len)
    assert resolved.cfg.attention_impl == "xla"
    assert why in resolved.note and "xla, not cudnn" in resolved.describe()


def test_on_a_gpu_cudnn_is_kept_where_it_runs():
    mla = dict(attention="mla", position="rope", head_dim=32, rope_head_dim=16, kv_latent_dim=16)  # width 48
    for fields in ({}, dict(d_model=512), mla):  # head widths 8, 128, 48
        cfg = ModelConfig(**{**SMALL, **AUTO, **fields})
        assert resolve_auto(cfg, "gpu", seq_len=16).cfg.attention_impl == "cudnn"


def test_an_unknown_backend_gets_the_cpu_choices_and_says_so():
    resolved = resolve_auto(ModelConfig(**SMALL, **AUTO), "metal")
    assert (resolved.cfg.dtype, resolved.cfg.attention_impl) == ("float32", "reference")
    assert "'metal' is not gpu, tpu or cpu" in resolved.describe()


def test_a_model_refuses_unresolved_auto_with_a_one_line_fix():
    cfg = ModelConfig(**SMALL, **AUTO)
    with pytest.raises(ValueError, match=r"dtype='auto' and attention_impl='auto' is chosen per backend.*"
                                         r"resolve_auto\(cfg\)\.cfg"):
        Decoder(cfg).init(jax.random.key(0), jnp.zeros((1, 4), jnp.int32))
    with pytest.raises(ValueError, match="resolve_auto"):
        kv_cache_bytes_per_token(cfg)
    assert kv_cache_bytes_per_token(cfg, dtype="bfloat16") == 2 * 4 * 8 * 2  # an explicit dtype needs none


@pytest.mark.parametrize("name", CONFIG_FILES)
def test_named_configs_leave_execution_to_the_backend_and_keep_the_cpu_values(name):
    """On a CPU 'auto' gives ModelConfig's defaults, float32 and the reference path: the values every
    named config computed with before it said 'auto' (baby_gpt stated float32)."""
    cfg = ModelConfig.from_dict(importlib.import_module(f"configs.{name}").get_config().model)
    assert (cfg.dtype, cfg.attention_impl) == ("auto", "auto")
    resolved = resolve_auto(cfg, "cpu").cfg
    defaults = ModelConfig(**SMALL)
    assert (resolved.dtype, resolved.attention_impl) == (defaults.dtype, defaults.attention_impl) == (
        "float32", "reference")


def test_the_run_config_saves_the_choice_and_a_reader_elsewhere_chooses_again():
    """A run started on a GPU saves bfloat16 and cuDNN with the record that they were 'auto'; read
    back on this machine (a CPU) they are chosen again. Explicit values are read back as saved."""
    config = tiny.get_config()
    chosen, resolved = saved_form(config, "gpu")
    chosen = ConfigDict(chosen)
    assert (chosen.model.dtype, chosen.model.attention_impl) == ("bfloat16", "cudnn")
    assert chosen.auto.to_dict() == {"backend": "gpu", "fields": ["dtype", "attention_impl"]}
    assert config.model.dtype == "auto" and "auto" not in config  # the caller's config is left as it was
    saved = json.loads(json.dumps(chosen.to_dict()))  # as config.json and a checkpoint hold it
    assert ModelConfig.from_dict(saved["model"]) == resolved.cfg
    here = resolve_auto(ModelConfig(**SMALL, **AUTO)).cfg
    assert (saved_model_config(saved).dtype, saved_model_config(saved).attention_impl) == (
        here.dtype, here.attention_impl)

    config.model.dtype, config.model.attention_impl = "bfloat16", "xla"
    chosen = ConfigDict(saved_form(config, "gpu")[0])
    assert chosen.auto.fields == []
    kept = saved_model_config(json.loads(json.dumps(chosen.to_dict())))
    assert (kept.dtype, kept.attention_impl) == ("bfloat16", "xla")


@pytest.mark.slow
def test_train_py_with_auto_prints_and_saves_the_choice_and_resumes_a_run_of_another_backend(tmp_path):
    """A run trained as on a TPU (bfloat16, xla), resumed with the config's 'auto' on this CPU: the
    resume says which execution fields changed, trains on in float32, and saves the new choice."""
    workdir = tmp_path / "w"
    common = ("--config.train.steps=4", "--config.train.eval_every=2", "--config.train.checkpoint_every=2",
              "--config.train.log_every=1", "--config.train.sample_tokens=0")
    first = run(workdir, *common, "--config.train.run_steps=2", "--config.model.dtype=bfloat16",
                "--config.model.attention_impl=xla")
    assert first.returncode == 0, first.stderr[-3000:]
    assert "; dtype bfloat16, attention xla; compiled in" in first.stdout
    saved = json.loads((workdir / "config.json").read_text())
    assert (saved["model"]["dtype"], saved["model"]["attention_impl"]) == ("bfloat16", "xla")
    assert saved["auto"]["fields"] == []

    resumed = run(workdir, *common)  # configs/tiny.py: dtype and attention_impl 'auto'
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert ("resuming with other execution settings: dtype: 'bfloat16' -> 'float32', "
            "attention_impl: 'xla' -> 'reference'") in resumed.stdout
    backend = jax.default_backend()
    assert f"dtype float32, attention reference (dtype and attention_impl auto on {backend})" in resumed.stdout
    saved = json.loads((workdir / "config.json").read_text())
    assert (saved["model"]["dtype"], saved["model"]["attention_impl"]) == ("float32", "reference")
    assert saved["auto"] == {"backend": backend, "fields": ["dtype", "attention_impl"]}
    assert sorted(losses(workdir)) == [1, 2, 3, 4] and all(math.isfinite(v) for v in losses(workdir).values())
    cfg, _, _ = restore_for_inference(str(workdir))
    assert (cfg.dtype, cfg.attention_impl) == ("float32", "reference")
