"""MixtralForCausalLM <-> ModelConfig: Mistral's attention (a sliding window, or none) and in every layer
a mixture of num_local_experts SwiGLU experts (w1 gate, w3 up, w2 down, stored one tensor per expert)
with a router `gate`: top num_experts_per_tok, weights a softmax over the chosen (renormalize_top_k).
router_aux_loss_coef is our load_balance_coef; router noise is refused."""

from __future__ import annotations

from transformer.hf import llama, mistral, qwen3
from transformer.hf.mapping import Layout, Tensor, check_export
from transformer.model.config import ModelConfig

ARCH, MODEL_TYPE = "MixtralForCausalLM", "mixtral"
DEFAULTS = {
    **mistral.DEFAULTS, "rms_norm_eps": 1e-5, "sliding_window": None, "rope_theta": 1e6, "num_local_experts": 8,
    "num_experts_per_tok": 2, "router_aux_loss_coef": 0.001, "router_jitter_noise": 0.0,
}


def import_config(hf: dict) -> tuple[ModelConfig, Layout]:
    if hf["router_jitter_noise"]:
        raise ValueError(f"Mixtral with router_jitter_noise={hf['router_jitter_noise']} is not supported: the "
                         "router here has no noise (model/moe.py); set it to 0.0")
    cfg, _ = mistral.import_config(hf)
    cfg = cfg.replace(num_experts=hf["num_local_experts"], experts_per_token=hf["num_experts_per_tok"],
                      renormalize_top_k=True, load_balance_coef=float(hf["router_aux_loss_coef"]))
    return cfg, layout(cfg)


def experts(cfg: ModelConfig, p: str, names: tuple[str, str, str]) -> list[Tensor]:
    """The MoE MLP under prefix `p`: the router p.gate [E, D] and each expert j's gate, up [F, D] and down
    [D, F] projections (`names`), as slices j of expert_gate, expert_up [E, F, D] and expert_out [D, E, F]."""
    d, f = cfg.d_model, cfg.mlp_dim
    tensors = [Tensor(p + "gate.weight", (cfg.num_experts, d), "mlp/router/kernel")]
    for j in range(cfg.num_experts):
        gate, up, down = (f"{p}experts.{j}.{name}.weight" for name in names)
        tensors += [Tensor(gate, (f, d), "mlp/expert_gate/kernel", expert=(j, 0)),
                    Tensor(up, (f, d), "mlp/expert_up/kernel", expert=(j, 0)),
                    Tensor(down, (d, f), "mlp/expert_out/kernel", expert=(j, 1))]
    return tensors


def layout(cfg: ModelConfig) -> Layout:
    """Mixtral's tensors: Llama's attention, then block_sparse_moe's router and experts."""
    return Layout(*llama.top_and_ignored(cfg), lambda i: qwen3.attention(cfg, i) + experts(
        cfg, f"model.layers.{i}.block_sparse_moe.", ("w1", "w3", "w2")))


def export(cfg: ModelConfig) -> dict:
    """Mixtral's config.json fields for `cfg`; ValueError naming what it cannot hold."""
    check_export(cfg, "MixtralForCausalLM", {"renormalize_top_k": (True,)})
    hf = mistral.export(cfg)
    return {**hf, "sliding_window": cfg.attention_window or None, "num_local_experts": cfg.num_experts,
            "num_experts_per_tok": cfg.experts_per_token, "router_aux_loss_coef": cfg.load_balance_coef,
            "router_jitter_noise": 0.0}
