"""LlamaForCausalLM <-> ModelConfig and params; the Llama conventions DeepSeek-V3 shares.

RoPE (any rope_theta, no rope scaling), RMSNorm (gain only), SwiGLU MLP, grouped-query attention,
head_dim from the config, tied or untied head; attention_bias and mlp_bias must be equal (our
use_bias covers both). Torch Linear weights are [out, in], as ours: reshaped, never transposed.

Shared with deepseek.py: `read_top` and `ignored` (model.embed_tokens, model.norm, lm_head),
`swiglu_mlp` (gate_proj, up_proj, down_proj), `check_silu` and `rope_theta`.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from transformer.model.config import ModelConfig
from transformer.hf.model_files import Tensors
from transformer.hf.mapping import Converter, check_export

ARCH, MODEL_TYPE = "LlamaForCausalLM", "llama"
DEFAULTS = dict(
    vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
    num_attention_heads=32, num_key_value_heads=None, hidden_act="silu",
    max_position_embeddings=2048, rms_norm_eps=1e-6, tie_word_embeddings=False,
    attention_bias=False, mlp_bias=False, head_dim=None,
)


def import_config(hf: dict) -> tuple[ModelConfig, Converter]:
    check_silu(hf, "Llama")
    if bool(hf["attention_bias"]) != bool(hf["mlp_bias"]):
        raise ValueError(
            f"Llama with attention_bias={hf['attention_bias']} and mlp_bias={hf['mlp_bias']} is not "
            "supported: ModelConfig.use_bias puts biases in both the attention and the MLP or in neither"
        )
    d, h = hf["hidden_size"], hf["num_attention_heads"]
    cfg = ModelConfig(
        vocab_size=hf["vocab_size"], max_seq_len=hf["max_position_embeddings"], d_model=d,
        num_layers=hf["num_hidden_layers"], num_heads=h, num_kv_heads=hf["num_key_value_heads"] or h,
        head_dim=hf["head_dim"] or d // h, mlp_dim=hf["intermediate_size"], activation="swiglu",
        position="rope", rope_theta=rope_theta(hf, "Llama"), norm="rmsnorm", norm_bias=False,
        norm_eps=float(hf["rms_norm_eps"]), use_bias=bool(hf["attention_bias"]),
        tie_embeddings=bool(hf["tie_word_embeddings"]),
    )
    g, k, f, bias = cfg.num_kv_heads, cfg.head_dim, cfg.mlp_dim, cfg.use_bias

    def linear(t, name, n_in, shape_out):
        """A torch Linear [out, in] -> a kernel [*shape_out, in] (and its bias, reshaped)."""
        n_out = int(np.prod(shape_out))
        p = {"kernel": t.get(name + ".weight", (n_out, n_in)).reshape(*shape_out, n_in)}
        if bias:
            p["bias"] = t.get(name + ".bias", (n_out,)).reshape(shape_out)
        return p

    def layer(t, cfg, i):
        p = f"model.layers.{i}."
        o = {"kernel": t.get(p + "self_attn.o_proj.weight", (d, h * k)).reshape(d, h, k)}
        if bias:
            o["bias"] = t.get(p + "self_attn.o_proj.bias", (d,))
        return {
            "attn_norm": {"scale": t.get(p + "input_layernorm.weight", (d,))},
            "attn": {
                "q": linear(t, p + "self_attn.q_proj", d, (h, k)),
                "k": linear(t, p + "self_attn.k_proj", d, (g, k)),
                "v": linear(t, p + "self_attn.v_proj", d, (g, k)),
                "o": o,
            },
            "mlp_norm": {"scale": t.get(p + "post_attention_layernorm.weight", (d,))},
            "mlp": swiglu_mlp(t, p, d, f, bias),
        }

    return cfg, Converter(read_top, layer, ignored)


def swiglu_mlp(t: Tensors, p: str, d: int, f: int, bias: bool) -> dict:
    """The MLP of layer prefix `p` (gate_proj, up_proj [F, D]; down_proj [D, F]) as gate, up, fc_out."""
    mlp = {}
    for ours, theirs, shape in (("gate", "gate_proj", (f, d)), ("up", "up_proj", (f, d)),
                                ("fc_out", "down_proj", (d, f))):
        mlp[ours] = {"kernel": t.get(f"{p}mlp.{theirs}.weight", shape)}
        if bias:
            mlp[ours]["bias"] = t.get(f"{p}mlp.{theirs}.bias", (shape[0],))
    return mlp


def read_top(t: Tensors, cfg: ModelConfig) -> dict:
    """embed, final_norm and (untied) head."""
    params = {
        "embed": {"embedding": t.get("model.embed_tokens.weight", (cfg.vocab_size, cfg.d_model))},
        "final_norm": {"scale": t.get("model.norm.weight", (cfg.d_model,))},
    }
    if not cfg.tie_embeddings:
        params["head"] = {"kernel": t.get("lm_head.weight", (cfg.vocab_size, cfg.d_model))}
    return params


def ignored(cfg: ModelConfig) -> list[str]:
    """The RoPE frequency buffers of old checkpoints; the head when it is tied to the embedding."""
    return [r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq", r"model\.rotary_emb\.inv_freq"] + (
        ["lm_head.weight"] if cfg.tie_embeddings else []
    )


def check_silu(hf: dict, name: str) -> None:
    if hf["hidden_act"] not in ("silu", "swish"):
        raise ValueError(
            f"{name} with hidden_act={hf['hidden_act']!r} is not supported; only 'silu' (SwiGLU)"
        )


def rope_theta(hf: dict, name: str) -> float:
    """rope_theta from `rope_parameters` (transformers 5) or the top level (transformers 4).

    Only plain RoPE is implemented: any rope scaling type raises a ValueError naming it.
    """
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    if not isinstance(rope, Mapping) or (rope and all(isinstance(v, Mapping) for v in rope.values())):
        raise ValueError(f"{name} with per-layer-type rope parameters {rope!r} is not supported")
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind not in ("default", None):
        raise ValueError(
            f"{name} with rope scaling of type {kind!r} ({dict(rope)}) is not supported: the model "
            "code implements plain RoPE only (rope_type 'default', no 'yarn', 'llama3', 'linear', "
            "'dynamic', ...)"
        )
    partial = rope.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
    if partial not in (None, 1, 1.0):
        raise ValueError(f"{name} with partial_rotary_factor={partial} is not supported (only 1.0)")
    theta = rope.get("rope_theta", hf.get("rope_theta", 10000.0))
    return float(theta)


def export(cfg: ModelConfig, top: dict, layers: list[dict]) -> tuple[dict, dict]:
    check_export(cfg, "LlamaForCausalLM (RoPE)", {
        "attention": ("mha",), "norm": ("rmsnorm",), "prenorm": (True,), "activation": ("swiglu",),
    })
    if cfg.d_model % cfg.num_heads:
        raise ValueError(
            f"cannot export as LlamaForCausalLM: transformers requires hidden_size (d_model={cfg.d_model}) "
            f"divisible by num_attention_heads ({cfg.num_heads})"
        )
    d, h, g, k = cfg.d_model, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    ones = np.ones(d, np.float32)
    t = {"model.embed_tokens.weight": top["embed"]["embedding"]}
    for i, layer in enumerate(layers):
        p, a, m = f"model.layers.{i}.", layer["attn"], layer["mlp"]
        t[p + "input_layernorm.weight"] = layer.get("attn_norm", {}).get("scale", ones)
        t[p + "post_attention_layernorm.weight"] = layer.get("mlp_norm", {}).get("scale", ones)
        for name, heads in (("q", h), ("k", g), ("v", g)):
            t[p + f"self_attn.{name}_proj.weight"] = a[name]["kernel"].reshape(heads * k, d)
            if cfg.use_bias:
                t[p + f"self_attn.{name}_proj.bias"] = a[name]["bias"].reshape(-1)
        t[p + "self_attn.o_proj.weight"] = a["o"]["kernel"].reshape(d, h * k)
        for ours, theirs in (("gate", "gate_proj"), ("up", "up_proj"), ("fc_out", "down_proj")):
            t[p + f"mlp.{theirs}.weight"] = m[ours]["kernel"]
            if cfg.use_bias:
                t[p + f"mlp.{theirs}.bias"] = m[ours]["bias"]
        if cfg.use_bias:
            t[p + "self_attn.o_proj.bias"] = a["o"]["bias"]
    t["model.norm.weight"] = top.get("final_norm", {}).get("scale", ones)
    if not cfg.tie_embeddings:
        t["lm_head.weight"] = top["head"]["kernel"]
    hf = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": cfg.vocab_size,
        "max_position_embeddings": cfg.max_seq_len, "hidden_size": d, "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": h, "num_key_value_heads": g, "head_dim": k,
        "intermediate_size": cfg.mlp_dim, "hidden_act": "silu", "rms_norm_eps": cfg.norm_eps,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "rope_theta": cfg.rope_theta,  # where transformers 4 reads it
        "attention_bias": cfg.use_bias, "mlp_bias": cfg.use_bias, "attention_dropout": 0.0,
        "tie_word_embeddings": cfg.tie_embeddings, "bos_token_id": None, "eos_token_id": None,
        "dtype": "float32",
    }
    return hf, t
