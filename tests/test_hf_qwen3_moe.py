"""Qwen3-MoE (transformer/hf/qwen3_moe.py) against `transformers`' Qwen3MoeForCausalLM, on tiny random
models, with both settings of norm_topk_prob: import (logits, model object and folder), cached greedy
decoding, export round trip, and the fields refused by name. Helpers and conventions: tests/test_hf.py."""

import functools

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

from tests.test_hf import TOL, V, T, assert_greedy_decoding_equals_generate, assert_trees_equal, config_dir, max_diff, random_params, tokens
from transformer.hf import from_hf, to_hf
from transformer.model.config import ModelConfig

FIELDS = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=24,
              intermediate_size=96, moe_intermediate_size=40, num_experts=4, num_experts_per_tok=2, vocab_size=V,
              max_position_embeddings=T, initializer_range=0.1, bos_token_id=0, eos_token_id=None,
              rope_parameters={"rope_type": "default", "rope_theta": 500.0})


@functools.cache
def qwen3_moe_model(norm_topk_prob, seed=0):
    """A random Qwen3-MoE with its norm gains (q_norm and k_norm too) away from 1 and routers far from uniform."""
    torch.manual_seed(seed)
    model = Qwen3MoeForCausalLM(Qwen3MoeConfig(**FIELDS, norm_topk_prob=norm_topk_prob)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.2 * torch.randn_like(p))
            if name.endswith("gate.weight"):
                p.mul_(10.0)
    return model


@pytest.mark.parametrize("norm_topk_prob", [True, False])
def test_import_gives_the_same_logits_from_the_model_and_its_folder(norm_topk_prob, tmp_path):
    model = qwen3_moe_model(norm_topk_prob)
    cfg, params = from_hf(model)
    assert (cfg.num_experts, cfg.experts_per_token, cfg.mlp_dim, cfg.qk_norm) == (4, 2, 40, True)
    assert cfg.renormalize_top_k == norm_topk_prob
    assert max_diff(cfg, params, model, tokens()) < TOL
    # The other setting of norm_topk_prob is another function: the test sees it.
    assert max_diff(cfg.replace(renormalize_top_k=not norm_topk_prob), params, model, tokens()) > 1e-2
    model.save_pretrained(tmp_path, safe_serialization=True)
    cfg_dir, params_dir = from_hf(tmp_path)
    assert cfg_dir == cfg
    assert_trees_equal(params_dir, params)


@pytest.mark.parametrize("norm_topk_prob", [True, False])
def test_cached_greedy_decoding_equals_transformers_generate(norm_topk_prob):
    assert_greedy_decoding_equals_generate(qwen3_moe_model(norm_topk_prob))


@pytest.mark.parametrize("renormalize", [True, False])
def test_export_loads_as_qwen3_moe_and_round_trips_exactly(renormalize, tmp_path):
    cfg = ModelConfig(vocab_size=V, max_seq_len=T, d_model=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=24,
                      mlp_dim=40, position="rope", rope_theta=300.0, activation="swiglu", norm="rmsnorm",
                      norm_bias=False, use_bias=False, tie_embeddings=False, qk_norm=True, num_experts=4,
                      experts_per_token=2, renormalize_top_k=renormalize)
    params = random_params(cfg)
    to_hf(cfg, params, tmp_path)
    model = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(model).__name__ == "Qwen3MoeForCausalLM" and model.config.norm_topk_prob == renormalize
    assert max_diff(cfg, params, model, tokens()) < TOL
    cfg_back, params_back = from_hf(tmp_path)
    assert cfg_back == cfg
    assert_trees_equal(params_back, params)


@pytest.mark.parametrize("changes, message", [
    (dict(decoder_sparse_step=2), "Qwen3-MoE with decoder_sparse_step=2"),
    (dict(mlp_only_layers=[0]), r"mlp_only_layers=\[0\]"),
    (dict(use_sliding_window=True, sliding_window=8, max_window_layers=1), "use_sliding_window=True"),
    (dict(attention_bias=True), "attention_bias=True"),
    (dict(hidden_act="gelu"), "hidden_act='gelu'"),
])
def test_qwen3_moe_fields_we_lack_are_refused_by_name(changes, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        from_hf(config_dir(tmp_path, qwen3_moe_model(True).config, **changes))
