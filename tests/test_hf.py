"""Hugging Face import / export (transformer/hf/) against `transformers` itself, on tiny random models.

Every model is built from a config with random weights (nothing is downloaded), in float32 on the
CPU. Weights are drawn with initializer_range=0.1 and the norm gains are perturbed, so attention is
far from uniform and a wrong RoPE layout or a swapped tensor shows in the logits.
"""

import functools
import json
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tokenizers
import torch
from safetensors.numpy import load_file, save_file
from tests.helpers.marks import first_fast
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    BertConfig,
    DeepseekV3Config,
    DeepseekV3ForCausalLM,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    MistralConfig,
    MistralForCausalLM,
    LlamaForCausalLM,
    OPTConfig,
    OPTForCausalLM,
)

from transformer.model.config import ModelConfig
from transformer.hf import check_same_architecture, from_hf, to_hf
from transformer.hf import mistral as mistral_family
from transformer.model.decoder import Decoder
from transformer.model.param_tree import unstack_layers
from transformer.sampling.sampler import generate
from transformer.data.tokenizer import ByteTokenizer, load_tokenizer, make_tokenizer
from transformer.training.steps import init_params

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
V, T = 128, 64  # vocabulary, context
TOL = 1e-4


def gpt2(**kw):
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=V, n_positions=T,
                                      initializer_range=0.1, bos_token_id=0, eos_token_id=None, **kw))


def llama(**kw):
    fields = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=16, intermediate_size=96, vocab_size=V, max_position_embeddings=T,
                  initializer_range=0.1, bos_token_id=0, eos_token_id=None,
                  rope_parameters={"rope_type": "default", "rope_theta": 500.0})
    return LlamaForCausalLM(LlamaConfig(**{**fields, **kw}))


def mistral(**kw):
    """Llama with a sliding window of 5 tokens, shorter than every test sequence (24 tokens)."""
    fields = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=16, intermediate_size=96, vocab_size=V, max_position_embeddings=T,
                  initializer_range=0.1, bos_token_id=0, eos_token_id=None, sliding_window=5,
                  rope_parameters={"rope_type": "default", "rope_theta": 500.0})
    return MistralForCausalLM(MistralConfig(**{**fields, **kw}))


def deepseek(**kw):
    fields = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=4,
                  intermediate_size=96, vocab_size=V, max_position_embeddings=T, first_k_dense_replace=2,
                  kv_lora_rank=16, q_lora_rank=24, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=12,
                  initializer_range=0.1, bos_token_id=0, eos_token_id=None,
                  rope_parameters={"rope_type": "default", "rope_theta": 1000.0})
    return DeepseekV3ForCausalLM(DeepseekV3Config(**{**fields, **kw}))


MODELS = {
    "gpt2": gpt2,
    "llama_gqa_untied": llama,
    "llama_tied": functools.partial(llama, tie_word_embeddings=True, num_key_value_heads=4,
                                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
    "deepseek_q_latent": deepseek,
    "deepseek_plain_q": functools.partial(deepseek, q_lora_rank=None),
    "mistral_window": mistral,
}


@functools.cache
def hf_model(name):
    torch.manual_seed(list(MODELS).index(name))
    model = MODELS[name]().eval()
    with torch.no_grad():
        for param_name, p in model.named_parameters():
            if "norm" in param_name or "ln_" in param_name:  # gains (and GPT-2's biases) away from 1 / 0
                p.add_(0.2 * torch.randn_like(p))
    return model


@functools.cache
def forward(cfg):
    return jax.jit(lambda params, tokens: Decoder(cfg).apply({"params": params}, tokens)[0])


def tokens(batch=2, length=24, seed=0):
    return np.random.RandomState(seed).randint(0, V, (batch, length))


def hf_logits(model, toks):
    with torch.no_grad():
        return model(torch.tensor(toks)).logits.numpy()


def max_diff(cfg, params, model, toks):
    return float(np.abs(np.asarray(forward(cfg)(params, jnp.asarray(toks))) - hf_logits(model, toks)).max())


def assert_trees_equal(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


# ---------------------------------------------------------------------------------------------
# Import: same logits as transformers, from a folder and from a model object
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", MODELS)
def test_import_gives_the_same_logits(name, tmp_path):
    model = hf_model(name)
    cfg, params = from_hf(model)
    assert max_diff(cfg, params, model, tokens()) < TOL

    model.save_pretrained(tmp_path, safe_serialization=True)
    cfg_dir, params_dir = from_hf(tmp_path)
    assert cfg_dir == cfg
    assert_trees_equal(params_dir, params)  # both paths read the same numbers


def test_imported_configs_map_the_fields():
    cfg, _ = from_hf(hf_model("gpt2"))
    assert (cfg.position, cfg.norm, cfg.activation, cfg.tie_embeddings, cfg.use_bias) == (
        "learned", "layernorm", "gelu_tanh", True, True)
    cfg, params = from_hf(hf_model("llama_gqa_untied"))
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.rope_theta, cfg.tie_embeddings) == (4, 2, 16, 500.0, False)
    assert params["layers"]["attn"]["k"]["kernel"].shape == (2, 2, 16, 64)  # [L, G, K, D]
    cfg, _ = from_hf(hf_model("deepseek_q_latent"))
    assert (cfg.attention, cfg.q_latent_dim, cfg.kv_latent_dim, cfg.head_dim, cfg.rope_head_dim,
            cfg.v_head_dim, cfg.rope_theta) == ("mla", 24, 16, 16, 8, 12, 1000.0)
    assert from_hf(hf_model("deepseek_plain_q"))[0].q_latent_dim is None
    cfg, _ = from_hf(hf_model("mistral_window"))
    assert (cfg.attention_window, cfg.global_every, cfg.num_kv_heads, cfg.use_bias) == (5, 0, 2, False)
    # Mistral's window is the band of ours: the sequence is longer than it, and the window matters.
    model, toks = hf_model("mistral_window"), tokens()
    assert max_diff(cfg.replace(attention_window=0), from_hf(model)[1], model, toks) > 1e-2


def test_mistral_without_the_window_key_has_transformers_default_and_null_is_full_attention(tmp_path):
    hf_config = hf_model("mistral_window").config
    fields = {k: v for k, v in json.loads(hf_config.to_json_string()).items() if k != "sliding_window"}
    assert mistral_family.import_config({**mistral_family.DEFAULTS, **fields})[0].attention_window == 4096
    null = {**mistral_family.DEFAULTS, **fields, "sliding_window": None}
    assert mistral_family.import_config(null)[0].attention_window == 0  # full attention, as transformers
    with pytest.raises(ValueError, match="layer_types"):
        from_hf(config_dir(tmp_path / "types", hf_config, layer_types=["sliding_attention", "full_attention"]))


def test_deepseek_rope_layout_without_interleave():
    """rope_interleave=False needs no permutation; importing it as interleaved would be wrong."""
    torch.manual_seed(5)
    model = deepseek(rope_interleave=False).eval()
    cfg, params = from_hf(model)
    assert max_diff(cfg, params, model, tokens()) < TOL
    model.config.rope_interleave = True  # same weights, the other layout: clearly different logits
    cfg, wrong = from_hf(model)
    model.config.rope_interleave = False
    assert max_diff(cfg, wrong, model, tokens()) > 1e-2


def test_unscanned_layout_and_sharded_bfloat16_folder(tmp_path):
    model = hf_model("llama_gqa_untied")
    cfg, params = from_hf(model)
    cfg_u, params_u = from_hf(model, scan_layers=False)
    assert cfg_u == cfg.replace(scan_layers=False)
    assert_trees_equal(params_u, unstack_layers(params, cfg.num_layers))
    assert max_diff(cfg_u, params_u, model, tokens()) < TOL

    model.save_pretrained(tmp_path / "sharded", safe_serialization=True, max_shard_size="20KB")
    assert os.path.isfile(tmp_path / "sharded" / "model.safetensors.index.json")
    assert_trees_equal(from_hf(tmp_path / "sharded")[1], params)

    model_bf16 = LlamaForCausalLM(model.config).to(torch.bfloat16)
    model_bf16.load_state_dict(model.state_dict())
    model_bf16.save_pretrained(tmp_path / "bf16", safe_serialization=True)
    _, params_bf16 = from_hf(tmp_path / "bf16")  # NumPy has no bfloat16: read, then widened
    rounded = jax.tree.map(lambda a: np.asarray(jnp.asarray(a, jnp.bfloat16), np.float32), params)
    assert_trees_equal(jax.tree.map(np.asarray, params_bf16), rounded)


def assert_greedy_decoding_equals_generate(model) -> None:
    """Our cached greedy decoding of two ragged prompts equals transformers' `generate`, token for token."""
    cfg, params = from_hf(model)
    prompts = [tokens(1, 5, seed=1)[0].tolist(), tokens(1, 9, seed=2)[0].tolist()]  # ragged
    ours = generate(params, cfg, prompts, jax.random.key(0), max_new_tokens=12, temperature=0.0).tokens
    for row, prompt in zip(ours, prompts):
        with torch.no_grad():
            theirs = model.generate(torch.tensor([prompt]), max_new_tokens=12, min_new_tokens=12,
                                    do_sample=False, pad_token_id=0)
        assert row.tolist() == theirs[0, len(prompt):].tolist()


@pytest.mark.parametrize("name", first_fast(["llama_gqa_untied", "gpt2", "deepseek_q_latent", "mistral_window"]))
def test_cached_greedy_decoding_equals_transformers_generate(name):
    assert_greedy_decoding_equals_generate(hf_model(name))


# ---------------------------------------------------------------------------------------------
# Export: transformers loads it with the same logits; export then import is exact
# ---------------------------------------------------------------------------------------------

EXPORTS = {
    "gpt2_tied": dict(position="learned", activation="gelu_tanh", norm="layernorm", use_bias=True,
                      tie_embeddings=True),
    "gpt2_untied_gelu": dict(position="learned", activation="gelu", norm="layernorm", use_bias=True,
                             tie_embeddings=False),
    "llama_gqa_untied": dict(position="rope", rope_theta=300.0, activation="swiglu", norm="rmsnorm",
                             norm_bias=False, use_bias=False, tie_embeddings=False, num_kv_heads=2, head_dim=8),
    "llama_tied_biases": dict(position="rope", activation="swiglu", norm="rmsnorm", norm_bias=False,
                              use_bias=True, tie_embeddings=True),
    "gpt2_relu2": dict(position="learned", activation="relu2", norm="layernorm", use_bias=True,
                       tie_embeddings=True),  # transformers' ACT2FN['relu2'], squared ReLU
    "mistral_window": dict(position="rope", activation="swiglu", norm="rmsnorm", norm_bias=False, use_bias=False,
                           tie_embeddings=False, num_kv_heads=2, head_dim=8, attention_window=5),
}


def random_params(cfg, seed=0):
    """Params of Decoder(cfg)'s layout, all random: norm gains != 1, every bias non-zero.

    Drawn with NumPy from the abstract init (jitting the real init would compile for seconds).
    """
    rng = np.random.RandomState(seed)

    def draw(path, leaf):
        x = 0.1 * rng.standard_normal(leaf.shape).astype(np.float32)
        return jnp.asarray(x + 1.0 if jax.tree_util.keystr(path).endswith("['scale']") else x)

    return jax.tree_util.tree_map_with_path(draw, jax.eval_shape(lambda: init_params(cfg, jax.random.key(0))))


@pytest.mark.parametrize("name", EXPORTS)
def test_export_loads_in_transformers_and_round_trips_exactly(name, tmp_path):
    cfg = ModelConfig(vocab_size=V, max_seq_len=T, d_model=64, num_layers=2, num_heads=4, mlp_dim=96,
                      **EXPORTS[name])
    params = random_params(cfg)
    to_hf(cfg, params, tmp_path)
    model = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    expected = ("GPT2LMHeadModel" if cfg.position == "learned" else
                "MistralForCausalLM" if cfg.attention_window else "LlamaForCausalLM")
    assert type(model).__name__ == expected
    assert max_diff(cfg, params, model, tokens()) < TOL

    cfg_back, params_back = from_hf(tmp_path)
    assert cfg_back == cfg
    assert_trees_equal(params_back, params)  # bitwise

    to_hf(cfg.replace(scan_layers=False), unstack_layers(params, cfg.num_layers), tmp_path / "unscanned")
    assert_trees_equal(from_hf(tmp_path / "unscanned")[1], params)


def test_export_of_imported_gpt2_is_the_same_checkpoint(tmp_path):
    model = hf_model("gpt2")
    cfg, params = from_hf(model)
    to_hf(cfg, params, tmp_path)
    reloaded = load_file(str(tmp_path / "model.safetensors"))
    state = {k: v.numpy() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    assert sorted(reloaded) == sorted(state)
    for k in state:
        np.testing.assert_array_equal(reloaded[k], state[k], err_msg=k)


@pytest.mark.parametrize("change, message", [
    (dict(prenorm=False), "prenorm"),
    (dict(position="sinusoidal"), "sinusoidal"),
    (dict(position="none"), "'none'"),
    (dict(position="rope", attention="mla", kv_latent_dim=16, rope_head_dim=8, activation="swiglu",
          norm="rmsnorm"), "attention='mla'"),
    (dict(position="rope", norm="layernorm", activation="gelu"), "norm='layernorm'"),
    (dict(num_kv_heads=2), "num_kv_heads=2"),
    (dict(attention_sink=True), "attention_sink=True, num_registers=0: neither GPT-2 nor Llama"),
    (dict(num_registers=2), "attention_sink=False, num_registers=2: neither GPT-2 nor Llama"),
    (dict(position="rope", norm="rmsnorm", activation="swiglu", num_registers=1), "num_registers=1"),
    (dict(qk_norm=True), "qk_norm=True: neither GPT-2 nor Llama"),
    (dict(position="rope", norm="rmsnorm", activation="swiglu", logit_softcap=30.0), "logit_softcap=30.0"),
    (dict(position="rope", norm="rmsnorm", activation="relu2"), "activation='relu2'"),  # Llama's MLP is gated
    (dict(attention_window=4), "attention_window=4 with position='learned': GPT-2 has no sliding window"),
    (dict(position="rope", norm="rmsnorm", activation="swiglu", use_bias=False, attention_window=4, global_every=2),
     "global_every=2: MistralForCausalLM applies its sliding_window to every layer"),
])
def test_export_refuses_what_no_supported_architecture_represents(change, message, tmp_path):
    cfg = ModelConfig(vocab_size=V, max_seq_len=T, d_model=64, num_layers=2, num_heads=4, **change)
    params = random_params(cfg)
    with pytest.raises(ValueError, match=message):
        to_hf(cfg, params, tmp_path)
    assert not os.listdir(tmp_path)


SENTENCES = ["the cat sat on the mat.", "the dog sat on the log.", "a cat and a dog met at the gate."]
# Every byte value that occurs in UTF-8 (ASCII, all 2-byte characters, 3- and 4-byte ones).
ALL_UTF8 = "".join(map(chr, range(0x800))) + "€ ±≠ 漢字 🎭 \U0010ffff"


def export_with_tokenizer(kind, directory):
    """A tiny random model exported with a byte tokenizer (as GPT-2) or a small BPE (as Llama)."""
    tok = make_tokenizer("bytes") if kind == "bytes" else make_tokenizer("bpe", SENTENCES * 4, vocab_size=270)  # they give 282
    shape = EXPORTS["gpt2_tied"] if kind == "bytes" else EXPORTS["llama_gqa_untied"]
    cfg = ModelConfig(vocab_size=tok.vocab_size, max_seq_len=T, d_model=32, num_layers=1, num_heads=4,
                      mlp_dim=48, **{**shape, "head_dim": 8})
    to_hf(cfg, random_params(cfg), directory, tokenizer=tok)
    return tok


@pytest.mark.parametrize("kind", ["bytes", "bpe"])
def test_export_writes_the_tokenizer_for_load_tokenizer_and_transformers(kind, tmp_path):
    tok = export_with_tokenizer(kind, tmp_path)
    back = load_tokenizer(tmp_path)
    assert type(back) is type(tok) and back.fingerprint == tok.fingerprint
    text = "the cat met a dog at the gate: ¿é? 🎭\n\r\t\x00" + ALL_UTF8
    np.testing.assert_array_equal(back.encode(text), tok.encode(text))

    theirs = AutoTokenizer.from_pretrained(tmp_path)
    assert theirs(text)["input_ids"] == tok.encode(text)
    assert theirs.decode(tok.encode(text)) == text
    cut = list(range(tok.vocab_size))  # every id, with bytes that are no valid UTF-8 on their own
    assert theirs.decode(cut) == tok.decode(cut)


def test_export_refuses_a_tokenizer_larger_than_the_vocabulary(tmp_path):
    cfg = ModelConfig(vocab_size=V, max_seq_len=T, d_model=64, num_layers=2, num_heads=4, **EXPORTS["gpt2_tied"])
    with pytest.raises(ValueError, match=f"tokenizer has 256 ids but the model's vocab_size is {V}"):
        to_hf(cfg, random_params(cfg), tmp_path, tokenizer=ByteTokenizer())
    assert not os.listdir(tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["bytes", "bpe"])
def test_sample_cli_reads_an_export_with_its_tokenizer(kind, tmp_path):
    """sample.py --hf_dir on to_hf's folder prints transformers' greedy continuation."""
    tok = export_with_tokenizer(kind, tmp_path)
    prompt = "the cat"
    model = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        new = model.generate(torch.tensor([tok.encode(prompt)]), max_new_tokens=5, do_sample=False,
                             pad_token_id=0)[0, len(tok.encode(prompt)):]
    cmd = [sys.executable, os.path.join(ROOT, "sample.py"), f"--hf_dir={tmp_path}", f"--prompt={prompt}",
           "--max_new_tokens=5", "--temperature=0"]
    # Bytes, not text: a random byte model may print a \r, which text mode would turn into \n.
    out = subprocess.run(cmd, capture_output=True, cwd=ROOT, timeout=300,
                         env={**os.environ, "PYTHONIOENCODING": "utf-8"})
    assert out.returncode == 0, out.stderr.decode()[-3000:]
    assert len(new) == 5 and prompt + tok.decode(new.numpy()) in out.stdout.decode("utf-8")


# ---------------------------------------------------------------------------------------------
# Unsupported inputs: clear errors, never a silently different model
# ---------------------------------------------------------------------------------------------


def config_dir(tmp_path, hf_config, **changes):
    """A folder with only config.json (the importer refuses before it reads any weights)."""
    hf_config.save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    data = {**json.loads(path.read_text()), **changes}
    path.write_text(json.dumps(data))
    return tmp_path


def test_mixture_of_experts_deepseek_is_refused(tmp_path):
    config = hf_model("deepseek_q_latent").config
    with pytest.raises(ValueError, match="mixture-of-experts.*first_k_dense_replace=1"):
        from_hf(config_dir(tmp_path, config, first_k_dense_replace=1))


@pytest.mark.parametrize("rope", [
    {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0, "original_max_position_embeddings": 16,
     "mscale": 1.0, "mscale_all_dim": 1.0},
    {"rope_type": "llama3", "factor": 8.0, "rope_theta": 10000.0, "low_freq_factor": 1.0,
     "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
    {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},
    {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0},
])
@pytest.mark.parametrize("name", ["llama_gqa_untied", "deepseek_q_latent"])
def test_rope_scaling_is_refused(rope, name, tmp_path):
    with pytest.raises(ValueError, match=f"rope scaling of type '{rope['rope_type']}'"):
        from_hf(config_dir(tmp_path, hf_model(name).config, rope_parameters=rope))


def test_old_style_rope_scaling_key_is_refused(tmp_path):
    path = config_dir(tmp_path, hf_model("llama_gqa_untied").config, rope_parameters=None, rope_theta=1e4,
                      rope_scaling={"type": "yarn", "factor": 2.0})
    with pytest.raises(ValueError, match="'yarn'"):
        from_hf(path)


@pytest.mark.parametrize("changes, message", [
    (dict(attention_bias=True), "attention_bias=True"),
    (dict(rms_norm_eps=1e-5), "rms_norm_eps=1e-05"),
    (dict(hidden_act="gelu"), "hidden_act='gelu'"),
    (dict(quantization_config={"quant_method": "fp8"}), "quantised"),
])
def test_deepseek_features_we_lack_are_refused(changes, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        from_hf(config_dir(tmp_path, hf_model("deepseek_q_latent").config, **changes))


@pytest.mark.parametrize("changes, message", [
    (dict(attention_bias=True, mlp_bias=False), "attention_bias=True and mlp_bias=False"),
    (dict(sliding_window=16), "sliding-window"),
    (dict(rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}),
     "partial_rotary_factor"),
])
def test_llama_features_we_lack_are_refused(changes, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        from_hf(config_dir(tmp_path, hf_model("llama_gqa_untied").config, **changes))


@pytest.mark.parametrize("changes, message", [
    (dict(scale_attn_by_inverse_layer_idx=True), "scale_attn_by_inverse_layer_idx"),
    (dict(activation_function="silu"), "activation_function='silu'"),
])
def test_gpt2_features_we_lack_are_refused(changes, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        from_hf(config_dir(tmp_path, hf_model("gpt2").config, **changes))


def test_unknown_architectures_are_refused(tmp_path):
    torch.manual_seed(0)
    opt = OPTForCausalLM(OPTConfig(num_hidden_layers=1, hidden_size=16, num_attention_heads=2, ffn_dim=32,
                                   vocab_size=V, max_position_embeddings=T, word_embed_proj_dim=16))
    with pytest.raises(ValueError, match="'OPTForCausalLM'.*GPT2LMHeadModel, LlamaForCausalLM, MistralForCausalLM, DeepseekV3ForCausalLM"):
        from_hf(opt)
    with pytest.raises(ValueError, match="'bert'.*supported are"):
        from_hf(config_dir(tmp_path, BertConfig(num_hidden_layers=1, hidden_size=16, num_attention_heads=2)))
    with pytest.raises(FileNotFoundError, match="no config.json"):
        from_hf(tmp_path / "nowhere")


def test_bad_tensors_are_named(tmp_path):
    hf_model("gpt2").save_pretrained(tmp_path, safe_serialization=True)
    file = str(tmp_path / "model.safetensors")
    good = load_file(file)

    save_file({**good, "transformer.h.1.mlp.c_fc.weight": np.zeros((64, 255), np.float32)}, file,
              metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"transformer\.h\.1\.mlp\.c_fc\.weight.*\(64, 255\).*\(64, 256\)"):
        from_hf(tmp_path)

    save_file({k: v for k, v in good.items() if k != "transformer.ln_f.bias"}, file, metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"transformer\.ln_f\.bias is missing"):
        from_hf(tmp_path)

    save_file({**good, "transformer.h.0.attn.q_norm.weight": np.ones(16, np.float32)}, file,
              metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"does not use \(transformer\.h\.0\.attn\.q_norm\.weight\)"):
        from_hf(tmp_path)


@pytest.mark.parametrize("damage", ["truncated", "garbled", "empty"])
def test_a_damaged_safetensors_file_is_a_value_error_naming_it(damage, tmp_path):
    """#31: a cut-off download gave safetensors' SafetensorError (a traceback in sample.py --hf_dir,
    train.py --config.init_from_hf and python -m transformer.explore --hf_dir, which report ValueError)."""
    hf_model("gpt2").save_pretrained(tmp_path, safe_serialization=True)
    file = tmp_path / "model.safetensors"
    data = file.read_bytes()
    file.write_bytes({"truncated": data[: len(data) // 2], "garbled": b"not a safetensors file" * 40,
                      "empty": b""}[damage])
    with pytest.raises(ValueError, match=rf"{re.escape(str(file))} is damaged or truncated \(.*\): download"):
        from_hf(tmp_path)


def test_checkpoint_without_name_prefix_imports(tmp_path):
    """The original `gpt2` checkpoint stores h.0.attn... (no 'transformer.') and the attn.bias buffers."""
    model = hf_model("gpt2")
    state = {k.removeprefix("transformer."): v.numpy() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    state["h.0.attn.bias"] = np.tril(np.ones((1, 1, T, T), np.float32))
    save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    model.config.save_pretrained(tmp_path)
    assert_trees_equal(from_hf(tmp_path)[1], from_hf(model)[1])


# ---------------------------------------------------------------------------------------------
# The command lines: sample.py --hf_dir, train.py --config.init_from_hf
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_sample_cli_greedy_text_equals_transformers(tmp_path):
    """sample.py --hf_dir on a folder with config.json, model.safetensors and tokenizer.json."""
    model = hf_model("gpt2")
    model.save_pretrained(tmp_path, safe_serialization=True)
    vocab = {"[UNK]": 0, **{f"w{i}": i for i in range(1, V)}}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    prompt = "w5 w17 w99 w3"
    ids = tok.encode(prompt).ids
    with torch.no_grad():
        new = model.generate(torch.tensor([ids]), max_new_tokens=10, do_sample=False, pad_token_id=0)[0, len(ids):]
    cmd = [sys.executable, os.path.join(ROOT, "sample.py"), f"--hf_dir={tmp_path}", f"--prompt={prompt}",
           "--max_new_tokens=10", "--temperature=0", "--top_k=0"]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert prompt + tok.decode(new.tolist()) in out.stdout


def test_check_same_architecture_names_the_differing_fields():
    cfg, _ = from_hf(hf_model("llama_gqa_untied"))
    check_same_architecture(cfg, cfg.replace(scan_layers=False, remat=True, dtype="bfloat16", dropout=0.1,
                                             attention_impl="xla"), seq_len=cfg.max_seq_len)
    with pytest.raises(ValueError, match=r"d_model: imported 64, config 128.*num_kv_heads.*"
                                         r"--config\.model\.d_model=64") as e:
        check_same_architecture(cfg, cfg.replace(d_model=128, num_kv_heads=4))
    assert "seq_len" not in str(e.value)


def test_check_same_architecture_lists_every_override_seq_len_included():
    """The case of issue 21: a config with a longer context and train.seq_len than the import."""
    cfg, _ = from_hf(hf_model("llama_gqa_untied"))  # max_seq_len = T = 64
    run = cfg.replace(max_seq_len=1024, d_model=128)
    with pytest.raises(ValueError) as e:
        check_same_architecture(cfg, run, seq_len=1024)
    flags = str(e.value).split("overrides to match it: ")[1].split()
    assert flags == [f"--config.model.max_seq_len={T}", "--config.model.d_model=64", f"--config.train.seq_len={T}"]
    assert f"train.seq_len=1024 exceeds the imported max_seq_len={T}" in str(e.value)

    # The model matches, only the run's windows are too long for the imported context.
    with pytest.raises(ValueError, match=rf"overrides to match it: --config\.train\.seq_len={T}$"):
        check_same_architecture(cfg, cfg, seq_len=T + 1)
    check_same_architecture(cfg, cfg, seq_len=T // 2)  # shorter windows are fine


@pytest.mark.slow
def test_train_starts_from_the_imported_weights_and_tokenizer(tmp_path):
    """The README's recipe: --config.init_from_hf=DIR takes DIR's weights and its tokenizer.json.
    configs/tiny.py is GPT-2-shaped; with learning rate 0 the saved params are the imported ones."""
    from transformer.run.checkpoint import Checkpointer
    from transformer.data.tokenizer import BPETokenizer, load_tokenizer

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, n_inner=128, vocab_size=256,
                                       n_positions=64, activation_function="gelu"))
    model.save_pretrained(tmp_path / "hf", safe_serialization=True)
    BPETokenizer.train(["a b c"], vocab_size=256).hf.save(str(tmp_path / "hf" / "tokenizer.json"))

    words = np.random.RandomState(0).choice(["to", "be", "or", "not", "that", "is", "the", "question"], 8000)
    (tmp_path / "corpus.txt").write_text(" ".join(words))  # small: tokenizing it takes no time

    cmd = [sys.executable, os.path.join(ROOT, "train.py"), "--config", os.path.join(ROOT, "configs/tiny.py"),
           "--workdir", str(tmp_path / "run"), f"--config.data.cache_dir={tmp_path / 'tokens'}",
           f"--config.data.path={tmp_path / 'corpus.txt'}",
           f"--config.init_from_hf={tmp_path / 'hf'}", "--config.train.steps=1", "--config.train.sample_tokens=0",
           "--config.train.eval_batches=1", "--config.optim.learning_rate=0.0"]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    saved = Checkpointer(str(tmp_path / "run"), read_only=True).restore_params()
    assert_trees_equal(jax.tree.map(np.asarray, saved), jax.tree.map(np.asarray, from_hf(tmp_path / "hf")[1]))
    tok = load_tokenizer(tmp_path / "run" / "tokenizer")
    assert isinstance(tok, BPETokenizer) and tok.hf.to_str() == load_tokenizer(tmp_path / "hf").hf.to_str()


def test_an_import_cannot_start_a_run_with_a_sink_or_registers():
    """Imported weights have no sink logit nor registers: a run that asks for them is told how to match."""
    cfg = ModelConfig(vocab_size=V, max_seq_len=T, d_model=64, num_layers=2, num_heads=4)
    with pytest.raises(ValueError, match=r"attention_sink: imported False, config True.*"
                                         r"num_registers: imported 0, config 4.*--config.model.attention_sink=False "
                                         r"--config.model.num_registers=0"):
        check_same_architecture(cfg, cfg.replace(attention_sink=True, num_registers=4))


def test_an_import_starts_a_run_whatever_its_init_fields_but_not_with_recipe_options():
    """zero_init_out / zero_init_head say how a random init starts: imported weights skip it. qk_norm
    and a logit soft-cap change the function: the run is told to match the import."""
    cfg = ModelConfig(vocab_size=V, max_seq_len=T, d_model=64, num_layers=2, num_heads=4, tie_embeddings=False)
    check_same_architecture(cfg, cfg.replace(zero_init_out=True, zero_init_head=True))
    with pytest.raises(ValueError, match=r"qk_norm: imported False, config True.*logit_softcap: imported 0.0, "
                                         r"config 30.0.*--config.model.qk_norm=False --config.model.logit_softcap=0.0"):
        check_same_architecture(cfg, cfg.replace(qk_norm=True, logit_softcap=30.0))
