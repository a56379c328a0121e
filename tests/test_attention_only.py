"""mlp_dim=0: attention-only blocks (no MLP, no MLP norm), the lecture's "attention alone" variant.

The model builds without `mlp` / `mlp_norm` parameters, decodes through the KV cache exactly as its
cache-free forward (pre- and post-norm, scanned and unscanned layers), trains through train.py's
command line, and is refused by the Hugging Face export and import.
"""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers.cli import losses, run
from tests.helpers.marks import first_fast
from transformer import ModelConfig, count_params, init_cache
from transformer.run.checkpoint import restore_for_inference
from transformer.hf import from_hf, to_hf
from transformer.model.decoder import Decoder

BASE = dict(vocab_size=64, max_seq_len=16, d_model=32, num_layers=2, num_heads=4)
LAYOUTS = [(prenorm, scan) for prenorm in (True, False) for scan in (True, False)]
LAYOUT_IDS = [f"{'pre' if p else 'post'}-{'scanned' if s else 'unscanned'}" for p, s in LAYOUTS]


def layer_names(params) -> set[str]:
    """The module names inside the layers (attn, attn_norm, ...), either layout."""
    layers = [v for k, v in params.items() if k.startswith("layers")]
    return set().union(*(layer.keys() for layer in layers))


def shapes(cfg: ModelConfig):
    """The parameters' shapes (jax.eval_shape: nothing is computed)."""
    return jax.eval_shape(Decoder(cfg).init, jax.random.key(0), jnp.zeros((1, 4), jnp.int32))["params"]


def random_params(cfg: ModelConfig, scale: float = 0.25):
    """Larger than the initialiser's 0.02, so attention is far from uniform and a wrong cache slot shows."""
    leaves, tree = jax.tree.flatten(shapes(cfg))
    keys = jax.random.split(jax.random.key(1), len(leaves))
    return jax.tree.unflatten(tree, [scale * jax.random.normal(k, x.shape) for k, x in zip(keys, leaves)])


def test_config_accepts_zero_and_none_still_means_four_d():
    assert ModelConfig(**BASE, mlp_dim=0).mlp_dim == 0
    assert ModelConfig(**BASE).mlp_dim == 4 * 32
    assert ModelConfig(**BASE, mlp_dim=0).replace(d_model=64).mlp_dim == 0  # set explicitly: kept
    with pytest.raises(ValueError, match="mlp_dim"):
        ModelConfig(**BASE, mlp_dim=-1)


@pytest.mark.parametrize("prenorm, scan", LAYOUTS, ids=LAYOUT_IDS)
def test_blocks_have_no_mlp_or_mlp_norm(prenorm, scan):
    full = ModelConfig(**BASE, prenorm=prenorm, scan_layers=scan, mlp_dim=64)
    params = shapes(full.replace(mlp_dim=0))
    assert layer_names(params) == {"attn", "attn_norm"}
    assert layer_names(shapes(full)) == {"attn", "attn_norm", "mlp", "mlp_norm"}
    d, f, layers = 32, 64, 2
    mlp_and_norm = (d * f + f) + (f * d + d) + 2 * d  # fc_in, fc_out (with biases), mlp_norm's gain and bias
    assert count_params(params) == count_params(shapes(full)) - layers * mlp_and_norm


@pytest.mark.parametrize("prenorm, scan", first_fast(LAYOUTS, LAYOUT_IDS))
def test_prefill_and_decoding_equal_the_forward(prenorm, scan):
    cfg = ModelConfig(**BASE, prenorm=prenorm, scan_layers=scan, mlp_dim=0, position="rope")
    apply = jax.jit(Decoder(cfg).apply)
    params = {"params": random_params(cfg)}
    tokens = jax.random.randint(jax.random.key(2), (2, 12), 0, cfg.vocab_size)
    full, _ = apply(params, tokens)  # [2, 12, V]
    prefill = 7
    cache = init_cache(cfg, 2, 16)
    logits, cache = apply(params, tokens[:, :prefill], jnp.broadcast_to(jnp.arange(prefill), (2, prefill)), cache)
    steps = [logits]
    for t in range(prefill, 12):
        logits, cache = apply(params, tokens[:, t:t + 1], jnp.full((2, 1), t), cache)
        steps.append(logits)
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, rtol=1e-5, atol=1e-5)
    changed, _ = apply(params, (tokens.at[:, 0].add(1)) % cfg.vocab_size)  # the last logits see token 0
    assert float(jnp.abs(changed[:, -1] - full[:, -1]).max()) > 1e-2


def test_hugging_face_export_refuses_it_and_import_cannot_make_it(tmp_path):
    cfg = ModelConfig(**BASE, mlp_dim=0)
    with pytest.raises(ValueError, match="mlp_dim=0"):
        to_hf(cfg, random_params(cfg), tmp_path / "out")
    assert not (tmp_path / "out").exists()  # refused before anything was written
    folder = tmp_path / "llama"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 64, "hidden_size": 32,
        "intermediate_size": 0, "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 16,
    }))
    with pytest.raises(ValueError, match="MLP width of 0"):
        from_hf(folder)


@pytest.mark.slow
def test_train_py_trains_it_from_the_command_line(tmp_path):
    """`--config.model.mlp_dim=0` through train.py: the loss goes down over 20 tiny steps, and the
    checkpoint holds attention-only layers."""
    workdir = tmp_path / "run"
    out = run(workdir, "--config.model.mlp_dim=0", "--config.train.steps=20", "--config.train.log_every=1",
              "--config.train.eval_every=20", "--config.train.checkpoint_every=20",
              "--config.train.sample_tokens=0")
    assert out.returncode == 0, out.stderr[-3000:]
    loss = losses(workdir)
    assert sum(loss[s] for s in range(16, 21)) < 0.8 * sum(loss[s] for s in range(1, 6))
    cfg, params, _ = restore_for_inference(str(workdir))
    assert cfg.mlp_dim == 0 and layer_names(params) == {"attn", "attn_norm"}
    assert json.load(open(os.path.join(workdir, "config.json")))["model"]["mlp_dim"] == 0
