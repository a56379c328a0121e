"""Qwen3 (transformer/hf/qwen3.py) against `transformers`' Qwen3ForCausalLM, on tiny random models:
import (logits), cached greedy decoding, export round trip, a head ablated as one would by hand in
transformers, and the config fields it refuses by name. Helpers and conventions: tests/test_hf.py."""

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM

import jax
from tests.test_hf import TOL, V, T, assert_greedy_decoding_equals_generate, assert_trees_equal, config_dir, hf_logits, max_diff, random_params, tokens
from transformer.hf import from_hf, qwen3, to_hf
from transformer.model import edits
from transformer.model.config import ModelConfig

# head_dim 24 with hidden_size 64: Qwen3's head width is its own field, not hidden_size / heads.
FIELDS = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=24,
              intermediate_size=96, vocab_size=V, max_position_embeddings=T, initializer_range=0.1,
              bos_token_id=0, eos_token_id=None, rope_parameters={"rope_type": "default", "rope_theta": 500.0})


def qwen3_model(seed=0, **changes):
    """A random Qwen3 with its norm gains (q_norm and k_norm too) away from 1."""
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(Qwen3Config(**{**FIELDS, **changes})).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.2 * torch.randn_like(p))
    return model


MODEL = qwen3_model()


def test_import_gives_the_same_logits_and_reads_qk_norm(tmp_path):
    cfg, params = from_hf(MODEL)
    assert (cfg.qk_norm, cfg.head_dim, cfg.num_kv_heads, cfg.activation, cfg.tie_embeddings) == (
        True, 24, 2, "swiglu", False)
    assert params["layers"]["attn"]["q_norm"]["scale"].shape == (2, 24)  # [L, K], shared by the heads
    assert max_diff(cfg, params, MODEL, tokens()) < TOL
    # Without its q_norm / k_norm gains the model is another function: the test sees them.
    plain = jax.tree.map(lambda x: x, params)
    plain["layers"]["attn"]["q_norm"]["scale"] = np.ones((2, 24), np.float32)
    assert max_diff(cfg, plain, MODEL, tokens()) > 1e-2
    MODEL.save_pretrained(tmp_path, safe_serialization=True)
    cfg_dir, params_dir = from_hf(tmp_path)
    assert cfg_dir == cfg
    assert_trees_equal(params_dir, params)


def test_cached_greedy_decoding_equals_transformers_generate():
    assert_greedy_decoding_equals_generate(MODEL)


def test_export_loads_as_qwen3_and_round_trips_exactly(tmp_path):
    cfg = ModelConfig(vocab_size=V, max_seq_len=T, d_model=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=24,
                      mlp_dim=96, position="rope", rope_theta=300.0, activation="swiglu", norm="rmsnorm",
                      norm_bias=False, use_bias=False, tie_embeddings=False, qk_norm=True)
    params = random_params(cfg)
    to_hf(cfg, params, tmp_path)
    model = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert max_diff(cfg, params, model, tokens()) < TOL
    cfg_back, params_back = from_hf(tmp_path)
    assert cfg_back == cfg
    assert_trees_equal(params_back, params)
    with pytest.raises(ValueError, match=r"Qwen3ForCausalLM \(qk_norm\): use_bias=True"):
        to_hf(cfg.replace(use_bias=True), random_params(cfg.replace(use_bias=True)), tmp_path / "biases")


def test_ablating_a_head_equals_zeroing_its_columns_of_o_proj_in_transformers():
    """Head 2 of layer 1 switched off at attn.z is W_o's columns of that head set to zero in transformers."""
    cfg, params = from_hf(MODEL)
    layer, head, k = 1, 2, cfg.head_dim
    mask = np.ones((cfg.num_layers, cfg.num_heads), np.float32)
    mask[layer, head] = 0.0
    toks = tokens()
    ours = np.asarray(edits.run(params, cfg, jax.numpy.asarray(toks), [edits.ablate_heads(cfg, mask)])[0])
    ablated = qwen3_model()
    with torch.no_grad():
        ablated.model.layers[layer].self_attn.o_proj.weight[:, head * k:(head + 1) * k] = 0.0
    theirs, plain = hf_logits(ablated, toks), hf_logits(MODEL, toks)
    assert np.abs(ours - theirs).max() < TOL
    assert np.abs(theirs - plain).max() > 1e-2  # the head matters: a wrong head or layer would show
    mask[layer, head], mask[layer, head - 1] = 1.0, 0.0  # the neighbouring head instead: not the same
    other = np.asarray(edits.run(params, cfg, jax.numpy.asarray(toks), [edits.ablate_heads(cfg, mask)])[0])
    assert np.abs(other - theirs).max() > 1e-2


@pytest.mark.parametrize("changes, message", [
    (dict(attention_bias=True), "Qwen3 with attention_bias=True"),
    (dict(attention_dropout=0.1), "Qwen3 with attention_dropout=0.1"),
    (dict(use_sliding_window=True, sliding_window=8, max_window_layers=1), "Qwen3 with use_sliding_window=True"),
    (dict(layer_types=["full_attention", "sliding_attention"]), "layer_types"),
    (dict(hidden_act="gelu"), "hidden_act='gelu'"),
    (dict(rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4,
                           "original_max_position_embeddings": 16}), "rope scaling of type 'yarn'"),
])
def test_qwen3_fields_we_lack_are_refused_by_name(changes, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        from_hf(config_dir(tmp_path, MODEL.config, **changes))


def test_a_released_config_maps_as_transformers_reads_it():
    """Qwen3-0.6B's config.json (transformers 4.51), weights left out: sliding_window null, tied head."""
    released = dict(architectures=["Qwen3ForCausalLM"], attention_bias=False, attention_dropout=0.0, head_dim=128,
                    hidden_act="silu", hidden_size=1024, intermediate_size=3072, max_position_embeddings=40960,
                    max_window_layers=28, model_type="qwen3", num_attention_heads=16, num_hidden_layers=28,
                    num_key_value_heads=8, rms_norm_eps=1e-06, rope_scaling=None, rope_theta=1000000,
                    sliding_window=None, tie_word_embeddings=True, use_sliding_window=False, vocab_size=151936)
    cfg, _ = qwen3.import_config({**qwen3.DEFAULTS, **released})
    assert (cfg.head_dim, cfg.d_model, cfg.num_heads, cfg.num_kv_heads, cfg.qk_norm, cfg.rope_theta, cfg.norm_eps,
            cfg.tie_embeddings, cfg.attention_window) == (128, 1024, 16, 8, True, 1e6, 1e-6, True, 0)
    assert cfg == qwen3.import_config(Qwen3Config(**released).to_dict())[0]  # as transformers 5 saves it
