"""Mixtral (transformer/hf/mixtral.py) against `transformers`' MixtralForCausalLM, on tiny random models:
import (logits, from the model object and from a saved folder), cached greedy decoding, export round
trip, an expert switched off as one would in transformers, and the fields refused by name. Helpers and
conventions: tests/test_hf.py."""

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, MixtralConfig, MixtralForCausalLM

import jax
from tests.test_hf import TOL, V, T, assert_greedy_decoding_equals_generate, assert_trees_equal, config_dir, hf_logits, max_diff, random_params, tokens
from transformer.hf import from_hf, to_hf
from transformer.model import edits
from transformer.model.config import ModelConfig

FIELDS = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              intermediate_size=48, num_local_experts=4, num_experts_per_tok=2, vocab_size=V,
              max_position_embeddings=T, initializer_range=0.1, bos_token_id=0, eos_token_id=None,
              rope_parameters={"rope_type": "default", "rope_theta": 500.0})


def mixtral_model(seed=0, **changes):
    """A random Mixtral with its norm gains away from 1 and routers far from uniform."""
    torch.manual_seed(seed)
    model = MixtralForCausalLM(MixtralConfig(**{**FIELDS, **changes})).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.2 * torch.randn_like(p))
            if name.endswith("gate.weight"):
                p.mul_(10.0)
    return model


MODEL = mixtral_model()


def test_import_gives_the_same_logits_from_the_model_and_its_folder(tmp_path):
    cfg, params = from_hf(MODEL)
    assert (cfg.num_experts, cfg.experts_per_token, cfg.mlp_dim, cfg.renormalize_top_k) == (4, 2, 48, True)
    assert params["layers"]["mlp"]["expert_out"]["kernel"].shape == (2, 64, 4, 48)  # [L, D, E, F]
    assert max_diff(cfg, params, MODEL, tokens()) < TOL
    MODEL.save_pretrained(tmp_path, safe_serialization=True)  # one tensor per expert, as on the Hub
    cfg_dir, params_dir = from_hf(tmp_path)
    assert cfg_dir == cfg
    assert_trees_equal(params_dir, params)


def test_cached_greedy_decoding_equals_transformers_generate():
    assert_greedy_decoding_equals_generate(MODEL)


def test_export_loads_as_mixtral_and_round_trips_exactly(tmp_path):
    cfg = ModelConfig(vocab_size=V, max_seq_len=T, d_model=64, num_layers=2, num_heads=4, num_kv_heads=2,
                      mlp_dim=48, position="rope", rope_theta=300.0, activation="swiglu", norm="rmsnorm",
                      norm_bias=False, use_bias=False, tie_embeddings=False, num_experts=4, experts_per_token=2,
                      attention_window=5)
    params = random_params(cfg)
    to_hf(cfg, params, tmp_path)
    model = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(model).__name__ == "MixtralForCausalLM" and model.config.sliding_window == 5
    assert max_diff(cfg, params, model, tokens()) < TOL
    cfg_back, params_back = from_hf(tmp_path)
    assert cfg_back == cfg
    assert_trees_equal(params_back, params)
    with pytest.raises(ValueError, match="MixtralForCausalLM: renormalize_top_k=False"):
        to_hf(cfg.replace(renormalize_top_k=False), params, tmp_path / "full_softmax")
    with pytest.raises(ValueError, match="num_experts=4 with position='learned'"):
        to_hf(cfg.replace(position="learned"), params, tmp_path / "learned")


def switched_off_in_torch(layer, expert):
    """MODEL with the router of `layer` never choosing `expert`: its logit pushed to -1e9 before the softmax."""
    model = mixtral_model()
    gate = model.model.layers[layer].mlp.gate

    def forward(hidden_states):
        logits = torch.nn.functional.linear(hidden_states.reshape(-1, gate.hidden_dim), gate.weight)
        logits[:, expert] = -1e9
        top, chosen = torch.topk(torch.softmax(logits.float(), dim=-1), gate.top_k, dim=-1)
        return logits, top / top.sum(dim=-1, keepdim=True), chosen

    gate.forward = forward
    return model


def test_switching_an_expert_off_equals_masking_its_router_logit_in_transformers():
    cfg, params = from_hf(MODEL)
    layer, expert, toks = 1, 2, tokens()
    mask = np.ones((cfg.num_layers, cfg.num_experts), np.float32)
    mask[layer, expert] = 0.0
    ours = np.asarray(edits.run(params, cfg, jax.numpy.asarray(toks), [edits.switch_off_experts(cfg, mask)])[0])
    theirs, plain = hf_logits(switched_off_in_torch(layer, expert), toks), hf_logits(MODEL, toks)
    assert np.abs(ours - theirs).max() < TOL
    assert np.abs(theirs - plain).max() > 1e-2  # the expert matters: a wrong expert or layer would show
    mask[layer, expert], mask[layer, expert - 1] = 1.0, 0.0  # the neighbouring expert instead: not the same
    other = np.asarray(edits.run(params, cfg, jax.numpy.asarray(toks), [edits.switch_off_experts(cfg, mask)])[0])
    assert np.abs(other - theirs).max() > 1e-2


@pytest.mark.parametrize("changes, message", [
    (dict(router_jitter_noise=0.1), "Mixtral with router_jitter_noise=0.1"),
    (dict(hidden_act="gelu"), "hidden_act='gelu'"),
    (dict(layer_types=["full_attention", "sliding_attention"], sliding_window=4), "layer_types"),
    (dict(rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4,
                           "original_max_position_embeddings": 16}), "rope scaling of type 'yarn'"),
])
def test_mixtral_fields_we_lack_are_refused_by_name(changes, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        from_hf(config_dir(tmp_path, MODEL.config, **changes))
