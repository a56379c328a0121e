"""DeepseekV3ForCausalLM -> ModelConfig and params (import only): multi-head latent attention.

Multi-head latent attention with decoupled RoPE, only when every MLP layer is dense
(first_k_dense_replace >= num_hidden_layers). q_lora_rank -> q_latent_dim (None / 0: a plain
q_proj), kv_lora_rank -> kv_latent_dim, qk_nope_head_dim -> head_dim, qk_rope_head_dim ->
rope_head_dim, v_head_dim -> v_head_dim; q_a_layernorm -> q_norm, kv_a_layernorm -> kv_norm;
kv_b_proj splits into k_up and v_up. Embedding, norms, MLP and head are named as Llama's (llama.py).

RoPE layout. With `rope_interleave` (the default), Hugging Face rotates the rotary features of
queries and of the shared rotary key as interleaved pairs (x0, x1), (x2, x3), ... and emits the
result half-split; our `ops.rope` rotates half-split pairs (x_i, x_{i + Kr/2}). The import therefore
permutes the output rows of the rotary part of q_proj / q_b_proj (per head) and of the rotary key
in kv_a_proj_with_mqa into the order (x0, x2, x4, ..., x1, x3, ...): the rotated queries and keys
are then exactly Hugging Face's, and so are the scores.
"""

from __future__ import annotations

import functools
import re

import numpy as np

from transformer.model.config import ModelConfig
from transformer.hf import llama
from transformer.hf.mapping import Converter
from transformer.hf.model_files import Tensors

ARCH, MODEL_TYPE = "DeepseekV3ForCausalLM", "deepseek_v3"
DEFAULTS = dict(
    vocab_size=129280, hidden_size=7168, intermediate_size=18432, num_hidden_layers=61,
    num_attention_heads=128, kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64,
    v_head_dim=128, qk_nope_head_dim=128, first_k_dense_replace=3, hidden_act="silu",
    max_position_embeddings=4096, rms_norm_eps=1e-6, tie_word_embeddings=False,
    rope_interleave=True, attention_bias=False,
)

# The eps Hugging Face's DeepseekV3RMSNorm uses for the latent norms (q_a_layernorm,
# kv_a_layernorm): fixed, not config.rms_norm_eps. Our LatentAttention uses norm_eps for them.
LATENT_NORM_EPS = 1e-6


def import_config(hf: dict) -> tuple[ModelConfig, Converter]:
    check_supported(hf)
    q_latent = hf["q_lora_rank"] or None
    cfg = ModelConfig(
        vocab_size=hf["vocab_size"], max_seq_len=hf["max_position_embeddings"], d_model=hf["hidden_size"],
        num_layers=hf["num_hidden_layers"], num_heads=hf["num_attention_heads"], head_dim=hf["qk_nope_head_dim"],
        v_head_dim=hf["v_head_dim"], mlp_dim=hf["intermediate_size"], activation="swiglu",
        position="rope", rope_theta=llama.rope_theta(hf, "DeepSeek-V3"), norm="rmsnorm", norm_bias=False,
        norm_eps=float(hf["rms_norm_eps"]), use_bias=False, tie_embeddings=bool(hf["tie_word_embeddings"]),
        attention="mla", kv_latent_dim=hf["kv_lora_rank"], q_latent_dim=q_latent,
        rope_head_dim=hf["qk_rope_head_dim"],
    )
    r = cfg.rope_head_dim
    # Interleaved rotary pairs -> half-split pairs (see the module docstring).
    perm = np.concatenate([np.arange(0, r, 2), np.arange(1, r, 2)]) if hf["rope_interleave"] else np.arange(r)
    return cfg, Converter(llama.read_top, functools.partial(read_layer, perm=perm), ignored)


def check_supported(hf: dict) -> None:
    """Raises a ValueError for what ModelConfig cannot express: MoE layers, DeepSeek's biases, a
    latent-norm eps other than LATENT_NORM_EPS, no rotary part (and an MLP other than SwiGLU)."""
    llama.check_silu(hf, "DeepSeek-V3")
    num_layers = hf["num_hidden_layers"]
    dense = hf["first_k_dense_replace"]
    if dense is None or dense < num_layers:
        raise ValueError(
            f"this DeepSeek-V3 model has mixture-of-experts MLP layers (first_k_dense_replace={dense} < "
            f"num_hidden_layers={num_layers}); MoE layers are not supported, only models whose MLP "
            "layers are all dense"
        )
    if hf["attention_bias"]:
        raise ValueError(
            "DeepSeek-V3 with attention_bias=True is not supported: its q_a_proj, kv_a_proj_with_mqa "
            "and o_proj have biases but its q_proj, q_b_proj and MLP do not, which ModelConfig.use_bias "
            "cannot express"
        )
    eps = float(hf["rms_norm_eps"])
    if eps != LATENT_NORM_EPS:
        raise ValueError(
            f"DeepSeek-V3 with rms_norm_eps={eps} is not supported: Hugging Face's latent norms "
            f"(q_a_layernorm, kv_a_layernorm) always use eps={LATENT_NORM_EPS}, while our "
            "MLA uses norm_eps for every norm, so only rms_norm_eps=1e-6 imports exactly"
        )
    if not hf["qk_rope_head_dim"]:
        raise ValueError("DeepSeek-V3 with qk_rope_head_dim=0 (no rotary part) is not supported")


def read_layer(t: Tensors, cfg: ModelConfig, i: int, perm: np.ndarray) -> dict:
    """Layer i's params: the latent attention (`read_attention`), then norms and MLP named as Llama's."""
    d, q = cfg.d_model, f"model.layers.{i}."
    attn = read_attention(t, cfg, q + "self_attn.", perm)
    return {
        "attn_norm": {"scale": t.get(q + "input_layernorm.weight", (d,))},
        "attn": attn,
        "mlp_norm": {"scale": t.get(q + "post_attention_layernorm.weight", (d,))},
        "mlp": llama.swiglu_mlp(t, q, d, cfg.mlp_dim, False),
    }


def read_attention(t: Tensors, cfg: ModelConfig, p: str, perm: np.ndarray) -> dict:
    """The LatentAttention params of the attention prefix `p`; `perm` [Kr] reorders the rotary
    features (queries per head, and the shared rotary key) into half-split pairs."""
    d, h, k, r = cfg.d_model, cfg.num_heads, cfg.head_dim, cfg.rope_head_dim
    kv, c, q_latent = cfg.v_head_dim, cfg.kv_latent_dim, cfg.q_latent_dim

    def q_rows(w, n_in):
        """[H * (K + Kr), in] -> kernel [H, K + Kr, in] with the rotary rows of each head permuted."""
        w = w.reshape(h, k + r, n_in)
        return np.concatenate([w[:, :k], w[:, k:][:, perm]], axis=1)

    if q_latent:
        attn = {
            "q_down": {"kernel": t.get(p + "q_a_proj.weight", (q_latent, d))},
            "q_norm": {"scale": t.get(p + "q_a_layernorm.weight", (q_latent,))},
            "q_up": {"kernel": q_rows(t.get(p + "q_b_proj.weight", (h * (k + r), q_latent)), q_latent)},
        }
    else:
        attn = {"q": {"kernel": q_rows(t.get(p + "q_proj.weight", (h * (k + r), d)), d)}}
    w = t.get(p + "kv_a_proj_with_mqa.weight", (c + r, d))
    attn["kv_down"] = {"kernel": np.concatenate([w[:c], w[c:][perm]], axis=0)}
    attn["kv_norm"] = {"scale": t.get(p + "kv_a_layernorm.weight", (c,))}
    w = t.get(p + "kv_b_proj.weight", (h * (k + kv), c)).reshape(h, k + kv, c)
    attn["k_up"] = w[:, :k]  # [H, K, C]
    attn["v_up"] = w[:, k:]  # [H, Kv, C]
    attn["o"] = {"kernel": t.get(p + "o_proj.weight", (d, h * kv)).reshape(d, h, kv)}
    return attn


def ignored(cfg: ModelConfig) -> list:
    """Llama's ignored tensors, and the multi-token-prediction modules (num_nextn_predict_layers):
    stored as extra layers past the model's last one, they are not part of the language model."""

    def mtp(name):
        m = re.fullmatch(r"model\.layers\.(\d+)\..*", name)
        return m is not None and int(m[1]) >= cfg.num_layers

    return llama.ignored(cfg) + [mtp]
