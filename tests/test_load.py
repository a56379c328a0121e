"""A model in one call (transformer/load.py): from a config file, a run folder, or one checkpoint."""

from __future__ import annotations

import re
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import transformer
from transformer import Decoder, config_from_file, count_params, load_run, model_config
from transformer.load import load_model
from transformer.run.config_files import load_config_file

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


def test_a_training_run_given_as_a_hugging_face_folder_says_use_workdir(run, tmp_path):
    """#31: sample.py --hf_dir RUN said "cannot import the Hugging Face architecture 'None'"."""
    with pytest.raises(ValueError, match=r"\(it holds checkpoints/\): this is a training run: use --workdir"):
        load_model(None, str(run), None)
    config_only = tmp_path / "config_only"  # a run's config.json without its checkpoints
    config_only.mkdir()
    shutil.copy(run / "config.json", config_only)
    with pytest.raises(ValueError, match="'model' and 'train' sections\\): this is a training run: use --workdir"):
        load_model(None, str(config_only), None)


def test_a_config_file_must_build_a_config_dict(tmp_path):
    """#31: a get_config() returning a dict failed later with an AttributeError."""
    path = tmp_path / "dict_config.py"
    path.write_text("def get_config():\n    return {'model': {'d_model': 64}}\n")
    message = (f"config file {path}: get_config() returned dict, not an ml_collections ConfigDict; "
               "build it with configs/common.base_config")
    with pytest.raises(ValueError, match=re.escape(message)):
        config_from_file(str(path))
    assert load_config_file(str(path)) == {"model": {"d_model": 64}}  # as sweep files return them


def test_the_public_api_names_what_the_readme_shows():
    for name in ["ModelConfig", "Decoder", "init_cache", "config_from_file", "load_run", "count_params"]:
        assert name in transformer.__all__ and hasattr(transformer, name)
