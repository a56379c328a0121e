"""LlamaForCausalLM <-> ModelConfig: RoPE (no scaling), RMSNorm (gain only), SwiGLU, grouped-query
attention, tied or untied head; attention_bias and mlp_bias equal (our use_bias covers both)."""

from __future__ import annotations

from collections.abc import Mapping

from transformer.model.config import ModelConfig
from transformer.hf.mapping import Layout, Tensor, check_export, linear, norm, top

ARCH, MODEL_TYPE = "LlamaForCausalLM", "llama"
DEFAULTS = dict(
    vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
    num_attention_heads=32, num_key_value_heads=None, hidden_act="silu",
    max_position_embeddings=2048, rms_norm_eps=1e-6, tie_word_embeddings=False,
    attention_bias=False, mlp_bias=False, head_dim=None,
)


def import_config(hf: dict) -> tuple[ModelConfig, Layout]:
    check_silu(hf, "Llama")
    if bool(hf["attention_bias"]) != bool(hf["mlp_bias"]):
        raise ValueError(f"Llama with attention_bias={hf['attention_bias']} and mlp_bias={hf['mlp_bias']} is not "
                         "supported: ModelConfig.use_bias puts biases in both the attention and the MLP or in "
                         "neither")
    d, h = hf["hidden_size"], hf["num_attention_heads"]
    cfg = ModelConfig(
        vocab_size=hf["vocab_size"], max_seq_len=hf["max_position_embeddings"], d_model=d,
        num_layers=hf["num_hidden_layers"], num_heads=h, num_kv_heads=hf["num_key_value_heads"] or h,
        head_dim=hf["head_dim"] or d // h, mlp_dim=hf["intermediate_size"], activation="swiglu",
        position="rope", rope_theta=rope_theta(hf, "Llama"), norm="rmsnorm", norm_bias=False,
        norm_eps=float(hf["rms_norm_eps"]), use_bias=bool(hf["attention_bias"]),
        tie_embeddings=bool(hf["tie_word_embeddings"]),
    )
    return cfg, layout(cfg)


def layout(cfg: ModelConfig) -> Layout:
    """Llama's tensors: torch Linear weights [out, in], as our kernels (reshaped, never transposed)."""
    d, h, g, k, bias = cfg.d_model, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.use_bias

    def layer(i: int) -> list[Tensor]:
        p = f"model.layers.{i}."
        attn = [x for n, heads in (("q", h), ("k", g), ("v", g))
                for x in linear(f"{p}self_attn.{n}_proj", f"attn/{n}", (heads, k), (d,), bias)]
        return [*norm(p + "input_layernorm", "attn_norm", d, bias=False), *attn,
                *linear(p + "self_attn.o_proj", "attn/o", (d,), (h, k), bias),
                *norm(p + "post_attention_layernorm", "mlp_norm", d, bias=False), *swiglu(cfg, p, bias)]

    return Layout(*top_and_ignored(cfg), layer)


def swiglu(cfg: ModelConfig, p: str, bias: bool) -> list[Tensor]:
    """The MLP of layer prefix `p`: gate_proj, up_proj [F, D] and down_proj [D, F] as gate, up, fc_out."""
    d, f = cfg.d_model, cfg.mlp_dim
    return [*linear(p + "mlp.gate_proj", "mlp/gate", (f,), (d,), bias),
            *linear(p + "mlp.up_proj", "mlp/up", (f,), (d,), bias),
            *linear(p + "mlp.down_proj", "mlp/fc_out", (d,), (f,), bias)]


def top_and_ignored(cfg: ModelConfig) -> tuple[list[Tensor], list]:
    """The embedding, final norm and head; ignored: old RoPE frequency buffers and a tied head."""
    ignored = [r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq", r"model\.rotary_emb\.inv_freq"]
    return top(cfg, "model.embed_tokens.weight", "model.norm"), ignored + (
        ["lm_head.weight"] if cfg.tie_embeddings else [])


def check_silu(hf: dict, name: str) -> None:
    if hf["hidden_act"] not in ("silu", "swish"):
        raise ValueError(f"{name} with hidden_act={hf['hidden_act']!r} is not supported; only 'silu' (SwiGLU)")


def rope_theta(hf: dict, name: str) -> float:
    """rope_theta from `rope_parameters` (transformers 5) or the top level (4); rope scaling raises."""
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    if not isinstance(rope, Mapping) or (rope and all(isinstance(v, Mapping) for v in rope.values())):
        raise ValueError(f"{name} with per-layer-type rope parameters {rope!r} is not supported")
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind not in ("default", None):
        raise ValueError(f"{name} with rope scaling of type {kind!r} ({dict(rope)}) is not supported: the model "
                         "code implements plain RoPE only (rope_type 'default', no 'yarn', 'llama3', 'linear', "
                         "'dynamic', ...)")
    partial = rope.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
    if partial not in (None, 1, 1.0):
        raise ValueError(f"{name} with partial_rotary_factor={partial} is not supported (only 1.0)")
    return float(rope.get("rope_theta", hf.get("rope_theta", 10000.0)))


def export(cfg: ModelConfig) -> dict:
    """Llama's config.json fields for `cfg`; ValueError naming what it cannot hold."""
    check_export(cfg, "LlamaForCausalLM (RoPE)", {
        "attention": ("mha",), "norm": ("rmsnorm",), "prenorm": (True,), "activation": ("swiglu",),
    })
    if cfg.d_model % cfg.num_heads:
        raise ValueError("cannot export as LlamaForCausalLM: transformers requires hidden_size "
                         f"(d_model={cfg.d_model}) divisible by num_attention_heads ({cfg.num_heads})")
    return {
        "max_position_embeddings": cfg.max_seq_len, "hidden_size": cfg.d_model, "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim,
        "intermediate_size": cfg.mlp_dim, "hidden_act": "silu", "rms_norm_eps": cfg.norm_eps,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "rope_theta": cfg.rope_theta,  # where transformers 4 reads it
        "attention_bias": cfg.use_bias, "mlp_bias": cfg.use_bias, "attention_dropout": 0.0,
    }
