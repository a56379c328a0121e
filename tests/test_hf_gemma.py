"""Gemma 2 and Gemma 3 (transformer/hf/gemma.py) against `transformers`' Gemma2ForCausalLM and
Gemma3ForCausalLM, on tiny random models whose sequences (24 tokens) outrun their window (5): import
(logits; each Gemma field shown to matter), cached greedy decoding, export round trip, a Gemma-3-shaped
model's attention pattern captured, the Hugging Face fields and ModelConfig values refused by name.
Helpers and conventions: tests/test_hf.py."""

import functools

import jax
import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, Gemma2Config, Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig

from tests.test_hf import TOL, V, T, assert_greedy_decoding_equals_generate, assert_trees_equal, config_dir, max_diff, random_params, tokens
from transformer.analysis.capture import attention_maps, capture
from transformer.hf import from_hf, gemma, to_hf
from transformer.model.config import ModelConfig
from transformer.training.steps import init_params

COMMON = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=24, intermediate_size=96,
              vocab_size=V, max_position_embeddings=T, initializer_range=0.1, bos_token_id=0, eos_token_id=None,
              pad_token_id=0, sliding_window=5, attn_implementation="eager")
LOCAL, GLOBAL = "sliding_attention", "full_attention"
MODELS = {  # small caps and an odd query scale, so that each shows in the logits
    "gemma2": lambda: Gemma2ForCausalLM(Gemma2Config(**COMMON, num_hidden_layers=4, query_pre_attn_scalar=20,
                                                     attn_logit_softcapping=3.0, final_logit_softcapping=5.0)),
    # Gemma 3's shape: local layers with a global one every k-th (k = 3 here, 6 in the released models).
    "gemma3": lambda: Gemma3ForCausalLM(Gemma3TextConfig(
        **COMMON, num_hidden_layers=6, layer_types=[LOCAL, LOCAL, GLOBAL] * 2, rope_parameters={
            GLOBAL: {"rope_type": "default", "rope_theta": 1000.0},
            LOCAL: {"rope_type": "default", "rope_theta": 50.0}})),
}


@functools.cache
def hf_model(name):
    torch.manual_seed(list(MODELS).index(name))
    model = MODELS[name]().eval()
    with torch.no_grad():
        for param_name, p in model.named_parameters():
            if "norm" in param_name:  # w of the (1 + w) gains away from 0
                p.add_(0.2 * torch.randn_like(p))
    return model


@pytest.mark.parametrize("name, changes", [
    ("gemma2", [dict(attention_window=0, global_every=0), dict(attn_softcap=0.0), dict(logit_softcap=0.0),
                dict(attn_scale_dim=0.0), dict(norm_unit_offset=False)]),
    ("gemma3", [dict(rope_local_theta=0.0), dict(qk_norm=False), dict(global_every=0), dict(embed_scale=False)]),
], ids=["gemma2", "gemma3"])
def test_import_gives_the_same_logits_and_each_gemma_field_matters(name, changes, tmp_path):
    model = hf_model(name)
    cfg, params = from_hf(model)
    assert (cfg.activation, cfg.norm_unit_offset, cfg.sublayer_out_norm, cfg.embed_scale, cfg.attention_window) == (
        "geglu", True, True, True, 5)
    assert max_diff(cfg, params, model, tokens()) < TOL
    attn = params["layers"]["attn"]
    without_qk_norm = {**params, "layers": {**params["layers"], "attn": {k: attn[k] for k in ("q", "k", "v", "o")}}}
    for change in changes:  # without any one of them, another function
        kept = without_qk_norm if change.get("qk_norm") is False else params
        assert max_diff(cfg.replace(**change), kept, model, tokens()) > 1e-3, change
    model.save_pretrained(tmp_path, safe_serialization=True)
    cfg_dir, params_dir = from_hf(tmp_path)
    assert cfg_dir == cfg
    assert_trees_equal(params_dir, params)


def test_imported_fields():
    cfg2, _ = from_hf(hf_model("gemma2"))
    assert (cfg2.global_every, cfg2.attn_scale_dim, cfg2.attn_softcap, cfg2.logit_softcap, cfg2.qk_norm,
            cfg2.rope_local_theta, cfg2.tie_embeddings) == (2, 20.0, 3.0, 5.0, False, 0.0, True)
    cfg3, params3 = from_hf(hf_model("gemma3"))
    assert (cfg3.global_every, cfg3.attn_scale_dim, cfg3.attn_softcap, cfg3.logit_softcap, cfg3.qk_norm,
            cfg3.rope_theta, cfg3.rope_local_theta) == (3, 256.0, 0.0, 0.0, True, 1000.0, 50.0)
    assert set(params3["layers"]) >= {"attn_norm", "attn_out_norm", "mlp_norm", "mlp_out_norm"}
    assert cfg3.layer_windows() == (5, 5, None, 5, 5, None)


@pytest.mark.parametrize("name", ["gemma2", "gemma3"])
def test_cached_greedy_decoding_equals_transformers_generate(name):
    assert_greedy_decoding_equals_generate(hf_model(name))


def test_capture_of_a_gemma3_shaped_models_attention_pattern_equals_transformers():
    model = hf_model("gemma3")
    cfg, params = from_hf(model)
    toks = tokens()
    ours = np.asarray(attention_maps(params, cfg, toks))  # [L, B, H, T, T]
    with torch.no_grad():
        theirs = np.stack([a.numpy() for a in model(torch.tensor(toks), output_attentions=True).attentions])
    assert ours.shape == theirs.shape == (6, 2, 4, 24, 24)
    np.testing.assert_allclose(ours, theirs, atol=1e-5)
    t, s = np.arange(24)[:, None], np.arange(24)[None, :]
    outside = (s > t) | (t - s >= 5)  # a local layer sees its query and the 4 keys before it
    assert np.all(ours[0][..., outside] == 0) and np.all(ours[2][..., s > t] == 0)
    assert ours[2][..., t - s >= 5].max() > 1e-2  # the global layer looks past the window


EXPORTS = {
    "Gemma2ForCausalLM": dict(attn_scale_dim=20.0, attn_softcap=3.0, logit_softcap=5.0, global_every=2),
    "Gemma3ForCausalLM": dict(qk_norm=True, rope_local_theta=50.0, global_every=3, num_layers=6),
    "Gemma3ForCausalLM-no-window": dict(qk_norm=True, attention_window=0),  # transformers still needs a window
}
GEMMA = dict(vocab_size=V, max_seq_len=T, d_model=64, num_layers=4, num_heads=4, num_kv_heads=2, head_dim=24,
             mlp_dim=96, position="rope", rope_theta=1000.0, activation="geglu", norm="rmsnorm", norm_bias=False,
             use_bias=False, norm_unit_offset=True, sublayer_out_norm=True, embed_scale=True, attention_window=5)


@pytest.mark.parametrize("arch", EXPORTS)
def test_export_loads_in_transformers_and_round_trips_exactly(arch, tmp_path):
    cfg = ModelConfig(**{**GEMMA, **EXPORTS[arch]})
    params = random_params(cfg)
    to_hf(cfg, params, tmp_path)
    model = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    assert type(model).__name__ == arch.split("-")[0]
    assert max_diff(cfg, params, model, tokens()) < TOL
    cfg_back, params_back = from_hf(tmp_path)
    assert cfg_back == cfg
    assert_trees_equal(params_back, params)


@pytest.mark.parametrize("name, changes, message", [
    ("gemma3", dict(hidden_activation="gelu"), "Gemma 3 with hidden_activation='gelu'"),
    ("gemma3", dict(attention_bias=True), "Gemma 3 with attention_bias=True"),
    ("gemma2", dict(attention_dropout=0.1), "Gemma 2 with attention_dropout=0.1"),
    ("gemma3", dict(use_bidirectional_attention=True), "use_bidirectional_attention=True"),
    ("gemma3", dict(attn_logit_softcapping=50.0), "Gemma 3 with attn_logit_softcapping=50.0"),
    ("gemma3", dict(layer_types=[GLOBAL, LOCAL, LOCAL] * 2), "layer_types=.*is not supported"),
    ("gemma2", dict(sliding_window=None), "sliding_window=None is not supported"),
    ("gemma3", dict(rope_parameters={GLOBAL: {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                                     LOCAL: {"rope_type": "default", "rope_theta": 1e4}}),
     "full_attention layers with rope scaling of type 'linear'"),
])
def test_gemma_fields_we_lack_are_refused_by_name(name, changes, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        from_hf(config_dir(tmp_path, hf_model(name).config, **changes))


@pytest.mark.parametrize("changes, message", [
    (dict(norm_scale=False), "norm_unit_offset=True offsets the norms' gain, but norm_scale=False"),
    (dict(prenorm=False), "sublayer_out_norm=True .* set prenorm=True"),
    (dict(attention_window=0, global_every=0), "rope_local_theta=50.0 is the RoPE base of the windowed layers"),
    (dict(attention_impl="xla"), "attn_softcap > 0 needs attention_impl='reference'"),
    (dict(attn_scale_dim=-1.0), r"attn_scale_dim must be a finite number >= 0 \(the d of q.k / sqrt\(d\)"),
    (dict(attn_softcap=float("nan")), "attn_softcap must be a finite number >= 0"),
    (dict(embed_scale=1), "embed_scale must be True or False"),
    (dict(attention="mla", kv_latent_dim=16, attention_window=0, global_every=0, rope_local_theta=0.0,
          qk_norm=False, position="none"),
     "attn_scale_dim=20.0, attn_softcap=3.0 implemented for attention='mha' only"),
])
def test_gemma_config_fields_are_checked(changes, message):
    good = {**GEMMA, **EXPORTS["Gemma3ForCausalLM"], **EXPORTS["Gemma2ForCausalLM"], "global_every": 3}
    ModelConfig(**good)
    with pytest.raises(ValueError, match=message):
        ModelConfig(**{**good, **changes})


def test_a_gemma_model_from_scratch_starts_with_unit_gains_and_exports_only_as_gemma(tmp_path):
    cfg = ModelConfig(**GEMMA)
    params = init_params(cfg, jax.random.key(0))
    assert all(np.all(np.asarray(params["layers"][n]["scale"]) == 0)
               for n in ("attn_norm", "attn_out_norm", "mlp_norm", "mlp_out_norm"))  # gain 1 + 0
    with pytest.raises(ValueError, match="cannot export this config as Gemma2ForCausalLM: embed_scale=False"):
        to_hf(cfg.replace(embed_scale=False), params, tmp_path)
    with pytest.raises(ValueError, match="as Gemma3ForCausalLM: attn_softcap=3.0"):  # transformers' would ignore it
        to_hf(cfg.replace(qk_norm=True, attn_softcap=3.0), init_params(cfg.replace(qk_norm=True), jax.random.key(0)),
              tmp_path)
    learned = cfg.replace(position="learned", activation="gelu_tanh")
    with pytest.raises(ValueError, match="norm_unit_offset=True.*with learned positions"):
        to_hf(learned, init_params(learned, jax.random.key(0)), tmp_path)


def test_embed_scale_rounds_sqrt_d_to_the_compute_dtype_as_gemmas_normaliser():
    """sqrt(48) = 6.93 is 6.9375 in bfloat16: Hugging Face multiplies by the rounded value, and so do we."""
    cfg = ModelConfig(**{**GEMMA, "d_model": 48, "dtype": "bfloat16"})
    params = init_params(cfg, jax.random.key(0))
    toks = tokens(1, 6)
    embed = np.asarray(capture(params, cfg, toks, ["embed"])[2]["embed"], np.float32)  # [1, T, D]
    table = np.asarray(jax.numpy.asarray(params["embed"]["embedding"], jax.numpy.bfloat16), np.float32)
    rounded = float(jax.numpy.asarray(48 ** 0.5, jax.numpy.bfloat16))
    assert rounded == 6.9375
    np.testing.assert_array_equal(embed, np.asarray(jax.numpy.asarray(table[toks] * rounded, jax.numpy.bfloat16),
                                                    np.float32))


# The released models' config.json, as written by transformers 4.4x-4.50 (no layer_types; Gemma 3's two
# RoPE bases at the top level), weights left out: the fields map as transformers reads them.
GEMMA2_2B = dict(architectures=["Gemma2ForCausalLM"], attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
                 head_dim=256, hidden_act="gelu_pytorch_tanh", hidden_activation="gelu_pytorch_tanh",
                 hidden_size=2304, intermediate_size=9216, max_position_embeddings=8192, model_type="gemma2",
                 num_attention_heads=8, num_hidden_layers=26, num_key_value_heads=4, query_pre_attn_scalar=256,
                 rms_norm_eps=1e-06, rope_theta=10000.0, sliding_window=4096, vocab_size=256000)
GEMMA3_1B = dict(architectures=["Gemma3ForCausalLM"], attn_logit_softcapping=None, final_logit_softcapping=None,
                 head_dim=256, hidden_activation="gelu_pytorch_tanh", hidden_size=1152, intermediate_size=6912,
                 max_position_embeddings=32768, model_type="gemma3_text", num_attention_heads=4,
                 num_hidden_layers=26, num_key_value_heads=1, query_pre_attn_scalar=256, rms_norm_eps=1e-06,
                 rope_local_base_freq=10000, rope_scaling=None, rope_theta=1000000, sliding_window=512,
                 sliding_window_pattern=6, vocab_size=262144)


def test_released_configs_map_as_transformers_reads_them():
    cfg2, _ = gemma.GEMMA2.import_config({**gemma.GEMMA2.DEFAULTS, **GEMMA2_2B})
    assert (cfg2.attention_window, cfg2.global_every, cfg2.attn_softcap, cfg2.logit_softcap, cfg2.attn_scale_dim,
            cfg2.head_dim, cfg2.num_kv_heads, cfg2.qk_norm) == (4096, 2, 50.0, 30.0, 0.0, 256, 4, False)
    assert cfg2.layer_windows()[:2] == (4096, None)  # transformers 4.42: even layers slide
    cfg3, _ = gemma.GEMMA3.import_config({**gemma.GEMMA3.DEFAULTS, **GEMMA3_1B})
    assert (cfg3.attention_window, cfg3.global_every, cfg3.rope_theta, cfg3.rope_local_theta, cfg3.qk_norm,
            cfg3.logit_softcap, cfg3.tie_embeddings) == (512, 6, 1e6, 1e4, True, 0.0, True)
    assert [i for i, w in enumerate(cfg3.layer_windows()) if w is None] == [5, 11, 17, 23]
    assert cfg3 == gemma.GEMMA3.import_config(Gemma3TextConfig(**GEMMA3_1B).to_dict())[0]  # transformers 5's form
    with pytest.raises(ValueError, match="Gemma 3 with rope scaling of type 'linear'"):  # Gemma 3 4B's global layers
        gemma.GEMMA3.import_config({**gemma.GEMMA3.DEFAULTS, **GEMMA3_1B,
                                    "rope_scaling": {"rope_type": "linear", "factor": 8.0}})
