"""DeepseekV3ForCausalLM -> ModelConfig (import only, every MLP layer dense): multi-head latent attention;
kv_b_proj splits into k_up and v_up. With `rope_interleave` Hugging Face rotates pairs (x0, x1), ...,
our `ops.rope` pairs (x_i, x_{i + Kr/2}): the import reorders the rotary rows to (x0, x2, ..., x1, x3, ...)."""

from __future__ import annotations

import re

import numpy as np

from transformer.hf import llama
from transformer.hf.mapping import Layout, Tensor, norm
from transformer.model.config import ModelConfig

ARCH, MODEL_TYPE = "DeepseekV3ForCausalLM", "deepseek_v3"
DEFAULTS = dict(
    vocab_size=129280, hidden_size=7168, intermediate_size=18432, num_hidden_layers=61,
    num_attention_heads=128, kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64,
    v_head_dim=128, qk_nope_head_dim=128, first_k_dense_replace=3, hidden_act="silu",
    max_position_embeddings=4096, rms_norm_eps=1e-6, tie_word_embeddings=False,
    rope_interleave=True, attention_bias=False,
)

LATENT_NORM_EPS = 1e-6  # fixed in Hugging Face's latent norms; ours use norm_eps


def import_config(hf: dict) -> tuple[ModelConfig, Layout]:
    """Refuses what ModelConfig cannot express (MoE, DeepSeek's biases, another latent-norm eps, ...)."""
    llama.check_silu(hf, "DeepSeek-V3")
    dense, num_layers = hf["first_k_dense_replace"], hf["num_hidden_layers"]
    if dense is None or dense < num_layers:
        raise ValueError(f"this DeepSeek-V3 model has mixture-of-experts MLP layers (first_k_dense_replace={dense} < "
                         f"num_hidden_layers={num_layers}); MoE layers are not supported, only models whose MLP "
                         "layers are all dense")
    if hf["attention_bias"]:
        raise ValueError("DeepSeek-V3 with attention_bias=True is not supported: its q_a_proj, kv_a_proj_with_mqa "
                         "and o_proj have biases but its q_proj, q_b_proj and MLP do not, which ModelConfig.use_bias "
                         "cannot express")
    if float(hf["rms_norm_eps"]) != LATENT_NORM_EPS:
        raise ValueError(f"DeepSeek-V3 with rms_norm_eps={float(hf['rms_norm_eps'])} is not supported: Hugging Face's "
                         f"latent norms (q_a_layernorm, kv_a_layernorm) always use eps={LATENT_NORM_EPS}, while our "
                         "MLA uses norm_eps for every norm, so only rms_norm_eps=1e-6 imports exactly")
    if not hf["qk_rope_head_dim"]:
        raise ValueError("DeepSeek-V3 with qk_rope_head_dim=0 (no rotary part) is not supported")
    cfg = ModelConfig(
        vocab_size=hf["vocab_size"], max_seq_len=hf["max_position_embeddings"], d_model=hf["hidden_size"],
        num_layers=hf["num_hidden_layers"], num_heads=hf["num_attention_heads"], head_dim=hf["qk_nope_head_dim"],
        v_head_dim=hf["v_head_dim"], mlp_dim=hf["intermediate_size"], activation="swiglu",
        position="rope", rope_theta=llama.rope_theta(hf, "DeepSeek-V3"), norm="rmsnorm", norm_bias=False,
        norm_eps=float(hf["rms_norm_eps"]), use_bias=False, tie_embeddings=bool(hf["tie_word_embeddings"]),
        attention="mla", kv_latent_dim=hf["kv_lora_rank"], q_latent_dim=hf["q_lora_rank"] or None,
        rope_head_dim=hf["qk_rope_head_dim"],
    )
    return cfg, layout(cfg, hf["rope_interleave"])


def layout(cfg: ModelConfig, interleaved: bool) -> Layout:
    """DeepSeek-V3's tensors; `interleaved`: reorder the rotary rows (see the module docstring)."""
    d, h, k, r = cfg.d_model, cfg.num_heads, cfg.head_dim, cfg.rope_head_dim
    kv, c, q_latent = cfg.v_head_dim, cfg.kv_latent_dim, cfg.q_latent_dim
    rotary = np.concatenate([np.arange(0, r, 2), np.arange(1, r, 2)]) if interleaved else np.arange(r)
    q = np.arange(h * (k + r)).reshape(h, k + r)  # the stored rows of q_proj / q_b_proj, per head
    q_rows = np.concatenate([q[:, :k], q[:, k:][:, rotary]], axis=1).reshape(-1)
    kv_up = np.arange(h * (k + kv)).reshape(h, k + kv)  # kv_b_proj's rows: each head's key, then value rows
    q_in = q_latent or d

    def layer(i: int) -> list[Tensor]:
        p = f"model.layers.{i}."
        a = p + "self_attn."
        q_proj = (a + "q_b_proj" if q_latent else a + "q_proj") + ".weight"
        attn = [*norm(a + "q_a_layernorm", "attn/q_norm", q_latent, bias=False),
                Tensor(a + "q_a_proj.weight", (q_latent, d), "attn/q_down/kernel")] if q_latent else []
        attn += [
            Tensor(q_proj, (h * (k + r), q_in), {f"attn/{'q_up' if q_latent else 'q'}/kernel": (h, k + r, q_in)},
                   rows=q_rows),
            Tensor(a + "kv_a_proj_with_mqa.weight", (c + r, d), "attn/kv_down/kernel",
                   rows=np.concatenate([np.arange(c), c + rotary])),
            *norm(a + "kv_a_layernorm", "attn/kv_norm", c, bias=False),
            Tensor(a + "kv_b_proj.weight", (h * (k + kv), c), {"attn/k_up": (h, k, c), "attn/v_up": (h, kv, c)},
                   rows=np.concatenate([kv_up[:, :k].reshape(-1), kv_up[:, k:].reshape(-1)])),
            Tensor(a + "o_proj.weight", (d, h * kv), {"attn/o/kernel": (d, h, kv)}),
        ]
        return [*norm(p + "input_layernorm", "attn_norm", d, bias=False), *attn,
                *norm(p + "post_attention_layernorm", "mlp_norm", d, bias=False), *llama.swiglu(cfg, p, False)]

    def mtp(name: str) -> bool:
        """The multi-token-prediction modules, stored as layers past the last: not the language model."""
        m = re.fullmatch(r"model\.layers\.(\d+)\..*", name)
        return m is not None and int(m[1]) >= cfg.num_layers

    top, ignored = llama.top_and_ignored(cfg)
    return Layout(top, ignored + [mtp], layer)
