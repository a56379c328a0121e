"""GPT2LMHeadModel <-> ModelConfig: learned positions, pre-norm layer norm with gain and bias, biases
everywhere, MLP activation gelu_new -> 'gelu_tanh' (or 'gelu' / 'relu' / 'relu2'), tied head."""

from __future__ import annotations

from transformer.model.config import ModelConfig
from transformer.hf.mapping import Layout, Tensor, check_export, linear, norm, top

ARCH, MODEL_TYPE = "GPT2LMHeadModel", "gpt2"
DEFAULTS = dict(
    vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12, n_inner=None,
    activation_function="gelu_new", layer_norm_epsilon=1e-5, tie_word_embeddings=True,
    scale_attn_weights=True, scale_attn_by_inverse_layer_idx=False, add_cross_attention=False,
)
ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu", "relu": "relu",
               "relu2": "relu2"}


def import_config(hf: dict) -> tuple[ModelConfig, Layout]:
    """Refuses the GPT-2 variants the model does not compute (attention scalings, cross-attention, ...)."""
    for key, want in (("scale_attn_weights", True), ("scale_attn_by_inverse_layer_idx", False),
                      ("add_cross_attention", False)):
        if bool(hf[key]) != want:
            raise ValueError(f"GPT-2 with {key}={hf[key]} is not supported (only {key}={want})")
    if hf["activation_function"] not in ACTIVATIONS:
        raise ValueError(f"GPT-2 activation_function={hf['activation_function']!r} is not supported; supported "
                         f"are {', '.join(ACTIVATIONS)}")
    d = hf["n_embd"]
    cfg = ModelConfig(
        vocab_size=hf["vocab_size"], max_seq_len=hf["n_positions"], d_model=d,
        num_layers=hf["n_layer"], num_heads=hf["n_head"], mlp_dim=hf["n_inner"] or 4 * d,
        activation=ACTIVATIONS[hf["activation_function"]], position="learned", norm="layernorm",
        norm_eps=float(hf["layer_norm_epsilon"]), use_bias=True, tie_embeddings=bool(hf["tie_word_embeddings"]),
    )
    return cfg, layout(cfg)


def layout(cfg: ModelConfig) -> Layout:
    """GPT-2's tensors. Conv1D weights are stored [in, out] (transposed); c_attn [D, 3D] holds q, k, v."""
    d, h, k, f = cfg.d_model, cfg.num_heads, cfg.head_dim, cfg.mlp_dim

    def layer(i: int) -> list[Tensor]:
        p = f"transformer.h.{i}."
        return [
            *norm(p + "ln_1", "attn_norm", d, bias=True),
            Tensor(p + "attn.c_attn.weight", (d, 3 * d), {f"attn/{n}/kernel": (h, k, d) for n in "qkv"}, True),
            Tensor(p + "attn.c_attn.bias", (3 * d,), {f"attn/{n}/bias": (h, k) for n in "qkv"}, fill=0.0),
            *linear(p + "attn.c_proj", "attn/o", (d,), (h, k), bias=True, transposed=True),
            *norm(p + "ln_2", "mlp_norm", d, bias=True),
            *linear(p + "mlp.c_fc", "mlp/fc_in", (f,), (d,), bias=True, transposed=True),
            *linear(p + "mlp.c_proj", "mlp/fc_out", (d,), (f,), bias=True, transposed=True),
        ]

    # Old checkpoints store causal-mask buffers; a tied head is the embedding.
    ignored = [r"transformer\.h\.\d+\.attn\.(bias|masked_bias)"] + (["lm_head.weight"] if cfg.tie_embeddings else [])
    return Layout(top(cfg, "transformer.wte.weight", "transformer.ln_f", bias=True, pos_embed="transformer.wpe.weight"),
                  ignored, layer)


def export(cfg: ModelConfig) -> dict:
    """GPT-2's config.json fields for `cfg`; ValueError naming what it cannot hold."""
    acts = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu", "relu2": "relu2"}
    check_export(cfg, "GPT2LMHeadModel (learned positions)", {
        "attention": ("mha",), "norm": ("layernorm",), "prenorm": (True,), "activation": tuple(acts),
        "num_kv_heads": (cfg.num_heads,), "head_dim": (cfg.d_model // cfg.num_heads,),
    })
    if cfg.head_dim * cfg.num_heads != cfg.d_model:
        raise ValueError("cannot export as GPT2LMHeadModel: num_heads * head_dim must equal d_model")
    return {
        "n_positions": cfg.max_seq_len, "n_embd": cfg.d_model, "n_layer": cfg.num_layers, "n_head": cfg.num_heads,
        "n_inner": cfg.mlp_dim, "activation_function": acts[cfg.activation], "layer_norm_epsilon": cfg.norm_eps,
        "resid_pdrop": cfg.dropout, "embd_pdrop": cfg.dropout, "attn_pdrop": 0.0,
    }
