"""Qwen3MoeForCausalLM <-> ModelConfig: Qwen3's attention (qk_norm) and in every layer a mixture of
num_experts SwiGLU experts of width moe_intermediate_size (Mixtral's layout under `mlp.`, gate_proj /
up_proj / down_proj), top num_experts_per_tok of the router's softmax, renormalised with norm_topk_prob.
Dense layers between them (decoder_sparse_step > 1, mlp_only_layers) are refused by name."""

from __future__ import annotations

from transformer.hf import llama, qwen3
from transformer.hf.mapping import Layout
from transformer.hf.mixtral import experts
from transformer.model.config import ModelConfig

ARCH, MODEL_TYPE = "Qwen3MoeForCausalLM", "qwen3_moe"
DEFAULTS = {
    **qwen3.DEFAULTS, "intermediate_size": 6144, "num_key_value_heads": 4, "moe_intermediate_size": 768,
    "num_local_experts": 128, "num_experts_per_tok": 8, "norm_topk_prob": False, "decoder_sparse_step": 1,
    "mlp_only_layers": None, "router_aux_loss_coef": 0.001,
}


def import_config(hf: dict) -> tuple[ModelConfig, Layout]:
    if hf["decoder_sparse_step"] != 1 or hf["mlp_only_layers"]:
        raise ValueError(f"Qwen3-MoE with decoder_sparse_step={hf['decoder_sparse_step']} and mlp_only_layers="
                         f"{hf['mlp_only_layers']} is not supported: only a mixture of experts in every layer "
                         "(decoder_sparse_step=1, mlp_only_layers=[])")
    cfg, _ = qwen3.import_config(hf)
    cfg = cfg.replace(mlp_dim=hf["moe_intermediate_size"], num_experts=hf.get("num_experts") or hf["num_local_experts"],
                      experts_per_token=hf["num_experts_per_tok"], renormalize_top_k=bool(hf["norm_topk_prob"]),
                      load_balance_coef=float(hf["router_aux_loss_coef"]))
    return cfg, layout(cfg)


def layout(cfg: ModelConfig) -> Layout:
    """Qwen3's attention, then the router mlp.gate and the experts mlp.experts.{j}."""
    return Layout(*llama.top_and_ignored(cfg), lambda i: qwen3.attention(cfg, i) + experts(
        cfg, f"model.layers.{i}.mlp.", ("gate_proj", "up_proj", "down_proj")))


def export(cfg: ModelConfig) -> dict:
    """Qwen3-MoE's config.json fields for `cfg`; ValueError naming what it cannot hold."""
    return {**qwen3.export(cfg), "moe_intermediate_size": cfg.mlp_dim, "num_experts": cfg.num_experts,
            "num_experts_per_tok": cfg.experts_per_token, "norm_topk_prob": cfg.renormalize_top_k,
            "decoder_sparse_step": 1, "mlp_only_layers": [], "router_aux_loss_coef": cfg.load_balance_coef}
