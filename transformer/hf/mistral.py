"""MistralForCausalLM <-> ModelConfig: Llama's tensors (no biases) with `sliding_window` = W (default
4096; None: full attention) in every layer as our attention_window (a query sees itself and W - 1
tokens before it). Per-layer windows (`layer_types`, global_every) are refused both ways."""

from __future__ import annotations

from transformer.hf import llama
from transformer.hf.mapping import Layout
from transformer.model.config import ModelConfig

ARCH, MODEL_TYPE = "MistralForCausalLM", "mistral"
DEFAULTS = {
    **llama.DEFAULTS, "intermediate_size": 14336, "num_key_value_heads": 8, "max_position_embeddings": 4096 * 32,
    "sliding_window": 4096,
}


def import_config(hf: dict) -> tuple[ModelConfig, Layout]:
    types = hf.get("layer_types")
    if types and set(types) != {"sliding_attention"} and hf["sliding_window"] is not None:
        raise ValueError(f"Mistral with per-layer layer_types {sorted(set(types))} is not supported: "
                         "MistralForCausalLM applies sliding_window to every layer (ModelConfig.global_every's "
                         "pattern is not read from layer_types)")
    if hf.get("attention_bias") or hf.get("mlp_bias"):
        raise ValueError("Mistral has no biases in its projections; this config.json asks for some")
    cfg, tensors = llama.import_config(hf)
    window = hf["sliding_window"]
    if window is not None and (not isinstance(window, int) or window < 1):
        raise ValueError(f"Mistral's sliding_window must be a positive integer or null, got {window!r}")
    return cfg.replace(attention_window=window or 0), tensors


layout = llama.layout


def export(cfg: ModelConfig) -> dict:
    """Mistral's config.json fields for `cfg`; ValueError naming what it cannot hold."""
    if cfg.global_every:
        raise ValueError(f"cannot export global_every={cfg.global_every}: MistralForCausalLM applies its "
                         "sliding_window to every layer, and no supported Hugging Face architecture interleaves "
                         "local and global layers; train with global_every=0 (a window in every layer) to export")
    if cfg.use_bias:
        raise ValueError("cannot export use_bias=True with a sliding window: MistralForCausalLM has no biases")
    hf = llama.export(cfg.replace(attention_window=0))
    del hf["attention_bias"], hf["mlp_bias"]
    return {**hf, "sliding_window": cfg.attention_window}
