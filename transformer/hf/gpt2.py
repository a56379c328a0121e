"""GPT2LMHeadModel <-> ModelConfig and params.

Learned positions, pre-norm layer norm with gain and bias, biases everywhere, MLP activation
gelu_new -> 'gelu_tanh' (or 'gelu' / 'relu' / 'relu2', transformers' squared ReLU), tied head.
Conv1D weights are [in, out] (ours [out, in]: transposed); the fused c_attn splits into q, k, v.
"""

from __future__ import annotations

import numpy as np

from transformer.model.config import ModelConfig
from transformer.hf.mapping import Converter, check_export
from transformer.hf.model_files import Tensors

ARCH, MODEL_TYPE = "GPT2LMHeadModel", "gpt2"
DEFAULTS = dict(
    vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12, n_inner=None,
    activation_function="gelu_new", layer_norm_epsilon=1e-5, tie_word_embeddings=True,
    scale_attn_weights=True, scale_attn_by_inverse_layer_idx=False, add_cross_attention=False,
)
ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu", "relu": "relu",
               "relu2": "relu2"}


def import_config(hf: dict) -> tuple[ModelConfig, Converter]:
    check_supported(hf)
    d = hf["n_embd"]
    cfg = ModelConfig(
        vocab_size=hf["vocab_size"], max_seq_len=hf["n_positions"], d_model=d,
        num_layers=hf["n_layer"], num_heads=hf["n_head"], mlp_dim=hf["n_inner"] or 4 * d,
        activation=ACTIVATIONS[hf["activation_function"]], position="learned", norm="layernorm",
        norm_eps=float(hf["layer_norm_epsilon"]), use_bias=True,
        tie_embeddings=bool(hf["tie_word_embeddings"]),
    )
    return cfg, Converter(read_top, read_layer, ignored)


def check_supported(hf: dict) -> None:
    """Raises a ValueError for a GPT-2 variant the model does not compute: other attention scalings,
    cross-attention, or an activation missing from ACTIVATIONS."""
    for key, want in (("scale_attn_weights", True), ("scale_attn_by_inverse_layer_idx", False),
                      ("add_cross_attention", False)):
        if bool(hf[key]) != want:
            raise ValueError(f"GPT-2 with {key}={hf[key]} is not supported (only {key}={want})")
    act = hf["activation_function"]
    if act not in ACTIVATIONS:
        raise ValueError(
            f"GPT-2 activation_function={act!r} is not supported; supported are "
            f"{', '.join(ACTIVATIONS)}"
        )


def read_norm(t: Tensors, name: str, d: int) -> dict:
    """The layer norm `name`'s gain and bias [D]."""
    return {"scale": t.get(f"{name}.weight", (d,)), "bias": t.get(f"{name}.bias", (d,))}


def read_layer(t: Tensors, cfg: ModelConfig, i: int) -> dict:
    """Layer i's params: ln_1, the fused c_attn split into q, k, v, c_proj as o, ln_2 and the MLP."""
    d, h, k, f = cfg.d_model, cfg.num_heads, cfg.head_dim, cfg.mlp_dim
    p = f"transformer.h.{i}."
    # GPT-2's Conv1D stores [in, out]; our kernels are [out, in] (transformer/model/linear.py).
    w = t.get(p + "attn.c_attn.weight", (d, 3 * d)).T  # [3D, D]: W_q, W_k, W_v stacked
    b = t.get(p + "attn.c_attn.bias", (3 * d,))
    attn = {
        name: {"kernel": w[j * d:(j + 1) * d].reshape(h, k, d),
               "bias": b[j * d:(j + 1) * d].reshape(h, k)}
        for j, name in enumerate(("q", "k", "v"))
    }
    attn["o"] = {"kernel": t.get(p + "attn.c_proj.weight", (d, d)).T.reshape(d, h, k),
                 "bias": t.get(p + "attn.c_proj.bias", (d,))}
    mlp = {
        "fc_in": {"kernel": t.get(p + "mlp.c_fc.weight", (d, f)).T,
                  "bias": t.get(p + "mlp.c_fc.bias", (f,))},
        "fc_out": {"kernel": t.get(p + "mlp.c_proj.weight", (f, d)).T,
                   "bias": t.get(p + "mlp.c_proj.bias", (d,))},
    }
    return {
        "attn_norm": read_norm(t, p + "ln_1", d), "attn": attn, "mlp_norm": read_norm(t, p + "ln_2", d), "mlp": mlp,
    }


def read_top(t: Tensors, cfg: ModelConfig) -> dict:
    """embed, pos_embed, final_norm and (untied) head."""
    d = cfg.d_model
    params = {
        "embed": {"embedding": t.get("transformer.wte.weight", (cfg.vocab_size, d))},
        "pos_embed": t.get("transformer.wpe.weight", (cfg.max_seq_len, d)),
        "final_norm": read_norm(t, "transformer.ln_f", d),
    }
    if not cfg.tie_embeddings:
        params["head"] = {"kernel": t.get("lm_head.weight", (cfg.vocab_size, d))}
    return params


def ignored(cfg: ModelConfig) -> list[str]:
    """The causal-mask buffers of old checkpoints; the head when it is tied to the embedding."""
    tied_head = ["lm_head.weight"] if cfg.tie_embeddings else []
    return [r"transformer\.h\.\d+\.attn\.(bias|masked_bias)"] + tied_head


def export(cfg: ModelConfig, top: dict, layers: list[dict]) -> tuple[dict, dict]:
    acts = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu", "relu2": "relu2"}
    check_export(cfg, "GPT2LMHeadModel (learned positions)", {
        "attention": ("mha",), "norm": ("layernorm",), "prenorm": (True,), "activation": tuple(acts),
        "num_kv_heads": (cfg.num_heads,), "head_dim": (cfg.d_model // cfg.num_heads,),
    })
    if cfg.head_dim * cfg.num_heads != cfg.d_model:
        raise ValueError("cannot export as GPT2LMHeadModel: num_heads * head_dim must equal d_model")
    d, f = cfg.d_model, cfg.mlp_dim
    ones, zeros = np.ones(d, np.float32), np.zeros(d, np.float32)
    norm = lambda p: (p.get("scale", ones), p.get("bias", zeros))  # noqa: E731
    bias = lambda p, n: p.get("bias", np.zeros(n, np.float32)).reshape(-1)  # noqa: E731
    t = {"transformer.wte.weight": top["embed"]["embedding"], "transformer.wpe.weight": top["pos_embed"]}
    for i, layer in enumerate(layers):
        p, a, m = f"transformer.h.{i}.", layer["attn"], layer["mlp"]
        t[p + "ln_1.weight"], t[p + "ln_1.bias"] = norm(layer.get("attn_norm", {}))
        t[p + "ln_2.weight"], t[p + "ln_2.bias"] = norm(layer.get("mlp_norm", {}))
        # Conv1D stores [in, out]: the transposes of our [out, in] kernels.
        t[p + "attn.c_attn.weight"] = np.concatenate([a[n]["kernel"].reshape(d, d) for n in "qkv"]).T
        t[p + "attn.c_attn.bias"] = np.concatenate([bias(a[n], d) for n in "qkv"])
        t[p + "attn.c_proj.weight"] = a["o"]["kernel"].reshape(d, d).T
        t[p + "attn.c_proj.bias"] = bias(a["o"], d)
        t[p + "mlp.c_fc.weight"], t[p + "mlp.c_fc.bias"] = m["fc_in"]["kernel"].T, bias(m["fc_in"], f)
        t[p + "mlp.c_proj.weight"], t[p + "mlp.c_proj.bias"] = m["fc_out"]["kernel"].T, bias(m["fc_out"], d)
    t["transformer.ln_f.weight"], t["transformer.ln_f.bias"] = norm(top.get("final_norm", {}))
    if not cfg.tie_embeddings:
        t["lm_head.weight"] = top["head"]["kernel"]
    hf = {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": cfg.vocab_size,
        "n_positions": cfg.max_seq_len, "n_embd": d, "n_layer": cfg.num_layers, "n_head": cfg.num_heads,
        "n_inner": f, "activation_function": acts[cfg.activation], "layer_norm_epsilon": cfg.norm_eps,
        "resid_pdrop": cfg.dropout, "embd_pdrop": cfg.dropout, "attn_pdrop": 0.0,
        "tie_word_embeddings": cfg.tie_embeddings, "bos_token_id": None, "eos_token_id": None,
        "dtype": "float32",
    }
    return hf, t
