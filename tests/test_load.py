"""A model in one call (transformer/load.py): from a config file, a run folder, or one checkpoint."""

from __future__ import annotations

import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import transformer
from transformer import Decoder, config_from_file, count_params, load_run, model_config

RUN = "tests/data/previous_layout_run"  # configs/tiny.py, 40 steps (tests/test_previous_layout.py)


def test_gpt2_from_its_config_file_has_gpt2_small_parameter_count():
    cfg = config_from_file("configs/gpt2.py")  # dtype / attention_impl 'auto' there: resolved here
    assert "auto" not in (cfg.dtype, cfg.attention_impl)
    shapes = jax.eval_shape(lambda: Decoder(cfg).init(jax.random.key(0), jnp.zeros((1, 8), jnp.int32)))
    assert count_params(shapes["params"]) == 124_439_808


def test_config_from_file_overrides_and_errors():
    cfg = config_from_file("configs/tiny.py", num_layers=1)
    assert cfg.num_layers == 1 and cfg.d_model == 64
    with pytest.raises(FileNotFoundError, match="configs/gpt2.py"):
        config_from_file("configs/no_such.py")
    with pytest.raises(Exception):
        model_config({"d_model": 64}, no_such_field=1)


@pytest.fixture
def run(tmp_path):
    return shutil.copytree(RUN, tmp_path / "run")


def test_load_run_takes_a_run_folder_or_one_checkpoint(run):
    cfg, params, tokenizer = load_run(str(run))
    cfg40, params40, _ = load_run(str(run / "checkpoints" / "40"))
    assert cfg == cfg40 and cfg.dtype != "auto"
    jax.tree.map(np.testing.assert_array_equal, params, params40)
    logits = Decoder(cfg).apply({"params": params}, jnp.asarray([list(tokenizer.encode("RO"))]))
    assert np.isfinite(np.asarray(logits[0] if isinstance(logits, tuple) else logits)).all()
    with pytest.raises(ValueError, match="not step 20"):
        load_run(str(run / "checkpoints" / "40"), step=20)


def test_the_public_api_names_what_the_readme_shows():
    for name in ["ModelConfig", "Decoder", "init_cache", "config_from_file", "load_run", "count_params"]:
        assert name in transformer.__all__ and hasattr(transformer, name)
