"""Qwen3ForCausalLM <-> ModelConfig: Llama's tensors (no biases) plus qk_norm, an RMSNorm over each head's
K features of q and k (gains q_norm, k_norm [K]) before RoPE; head_dim is its own field. Sliding
windows (use_sliding_window, layer_types) and attention biases are refused by name."""

from __future__ import annotations

from transformer.hf import llama
from transformer.hf.mapping import Layout, Tensor, check_export, norm
from transformer.model.config import ModelConfig

ARCH, MODEL_TYPE = "Qwen3ForCausalLM", "qwen3"
DEFAULTS = {
    **llama.DEFAULTS, "vocab_size": 151936, "intermediate_size": 22016, "num_key_value_heads": 32, "head_dim": 128,
    "max_position_embeddings": 32768, "use_sliding_window": False, "attention_dropout": 0.0,
}


def import_config(hf: dict) -> tuple[ModelConfig, Layout]:
    check_dense_attention(hf, "Qwen3")
    if hf["use_sliding_window"] or "sliding_attention" in (hf.get("layer_types") or ()):
        raise ValueError(f"Qwen3 with use_sliding_window={hf['use_sliding_window']} (layer_types "
                         f"{hf.get('layer_types')}) is not supported: only full attention in every layer")
    cfg, _ = llama.import_config({**hf, "mlp_bias": False})
    cfg = cfg.replace(qk_norm=True)
    return cfg, layout(cfg)


def check_dense_attention(hf: dict, name: str) -> None:
    """Refuses attention dropout and attention biases (ModelConfig.use_bias would put them in the MLP too)."""
    if hf.get("attention_dropout"):
        raise ValueError(f"{name} with attention_dropout={hf['attention_dropout']} is not supported: set it to 0.0 "
                         "(ModelConfig.dropout is applied to the residual stream, not to the attention weights)")
    if hf.get("attention_bias"):
        raise ValueError(f"{name} with attention_bias=True is not supported: its MLP has no biases, and "
                         "ModelConfig.use_bias puts biases in both the attention and the MLP or in neither")


def attention(cfg: ModelConfig, i: int) -> list[Tensor]:
    """Layer i's tensors but its MLP: input_layernorm, q, k, v, o, post_attention_layernorm (Llama's) and,
    with cfg.qk_norm, self_attn.q_norm / k_norm [K]."""
    p, k = f"model.layers.{i}.self_attn.", cfg.head_dim
    tensors = [t for t in llama.layout(cfg).layer(i) if ".mlp." not in t.name]
    qk_norms = [*norm(p + "q_norm", "attn/q_norm", k, bias=False), *norm(p + "k_norm", "attn/k_norm", k, bias=False)]
    return tensors + (qk_norms if cfg.qk_norm else [])


def layout(cfg: ModelConfig) -> Layout:
    """Qwen3's tensors: `attention`, then Llama's SwiGLU MLP."""
    return Layout(*llama.top_and_ignored(cfg),
                  lambda i: attention(cfg, i) + llama.swiglu(cfg, f"model.layers.{i}.", bias=False))


def export(cfg: ModelConfig) -> dict:
    """Qwen3's config.json fields for `cfg`; ValueError naming what it cannot hold."""
    check_export(cfg, "Qwen3ForCausalLM (qk_norm)", {"use_bias": (False,), "attention_window": (0,)})
    hf = llama.export(cfg)
    del hf["mlp_bias"]
    return {**hf, "use_sliding_window": False, "sliding_window": None}
