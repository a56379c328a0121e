"""Gemma2ForCausalLM and Gemma3ForCausalLM (the text model) <-> ModelConfig: RMSNorm with a (1 + w) gain
(norm_unit_offset), four norms per block (sublayer_out_norm: post_attention_layernorm is the attention's
output norm), GeGLU with tanh GELU, embeddings times sqrt(D) (embed_scale), the query scale from
query_pre_attn_scalar (attn_scale_dim), the attention (Gemma 2 only: transformers' Gemma 3 does not apply
it) and final logit soft-caps, local layers with
`sliding_window` from `layer_types` (a global layer every k-th: global_every) and, Gemma 3, qk_norm and
the local layers' RoPE base (rope_local_theta). The two differ only in their defaults and those fields."""

from __future__ import annotations

import dataclasses
import functools
import types

from transformer.hf import llama, qwen3
from transformer.hf.mapping import Layout, Tensor, check_export, norm
from transformer.model.config import ModelConfig

GEMMA2_DEFAULTS = dict(
    vocab_size=256000, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26, num_attention_heads=8,
    num_key_value_heads=4, head_dim=256, hidden_activation="gelu_pytorch_tanh", max_position_embeddings=8192,
    rms_norm_eps=1e-6, tie_word_embeddings=True, attention_bias=False, attention_dropout=0.0,
    query_pre_attn_scalar=256, sliding_window=4096, final_logit_softcapping=30.0, attn_logit_softcapping=50.0,
    sliding_window_pattern=2,  # what transformers derives layer_types from when a config leaves them out
)
GEMMA3_DEFAULTS = {**GEMMA2_DEFAULTS, "vocab_size": 262208, "max_position_embeddings": 131072,
                   "final_logit_softcapping": None, "attn_logit_softcapping": None, "sliding_window_pattern": 6,
                   "rope_theta": 1_000_000.0, "rope_local_base_freq": 10_000.0}
# The fields only Gemma has: one set selects Gemma 2 / 3 for an export (with qk_norm or rope_local_theta: 3).
FIELDS = ("norm_unit_offset", "sublayer_out_norm", "embed_scale", "attn_scale_dim", "attn_softcap", "rope_local_theta")


def import_config(hf: dict, version: int) -> tuple[ModelConfig, Layout]:
    name = f"Gemma {version}"
    qwen3.check_dense_attention(hf, name)
    for key, ok, why in (
            ("hidden_activation", hf["hidden_activation"] == "gelu_pytorch_tanh", "only tanh GELU, gelu_pytorch_tanh"),
            ("use_bidirectional_attention", not hf.get("use_bidirectional_attention"), "the decoder is causal"),
            ("attn_logit_softcapping", version == 2 or hf["attn_logit_softcapping"] is None,
             "transformers' Gemma 3 does not apply it (qk_norm took its place), so set it to null")):
        if not ok:
            raise ValueError(f"{name} with {key}={hf.get(key)!r} is not supported: {why}")
    window, every = layer_windows(hf, name)
    theta, local_theta = rope_thetas(hf, name)
    cfg, _ = llama.import_config({**hf, "hidden_act": "silu", "mlp_bias": False, "rope_scaling": None,
                                  "rope_parameters": {"rope_type": "default", "rope_theta": theta}})
    scale_dim = float(hf["query_pre_attn_scalar"])
    cfg = cfg.replace(activation="geglu", norm_unit_offset=True, sublayer_out_norm=True, embed_scale=True,
                      attn_scale_dim=0.0 if scale_dim == cfg.head_dim else scale_dim, qk_norm=version == 3,
                      attn_softcap=float(hf["attn_logit_softcapping"] or 0.0), attention_window=window,
                      logit_softcap=float(hf["final_logit_softcapping"] or 0.0), global_every=every,
                      rope_local_theta=local_theta if window and local_theta != theta else 0.0)
    return cfg, layout(cfg)


def layer_windows(hf: dict, name: str) -> tuple[int, int]:
    """(attention_window, global_every) from layer_types (or transformers' pattern when it is left out):
    every layer local, every k-th global, or all global; another pattern raises."""
    n, window = hf["num_hidden_layers"], hf["sliding_window"]
    kinds = hf.get("layer_types") or ["sliding_attention" if (i + 1) % hf["sliding_window_pattern"] else
                                      "full_attention" for i in range(n)]
    local = [kind == "sliding_attention" for kind in kinds]
    if not any(local):
        return 0, 0
    every = 0 if all(local) else local.index(False) + 1
    if (set(kinds) - {"sliding_attention", "full_attention"} or not isinstance(window, int) or window < 1
            or local != [not every or bool((i + 1) % every) for i in range(n)]):
        raise ValueError(f"{name} with layer_types={kinds} and sliding_window={window} is not supported: "
                         "ModelConfig has local layers of one window W with every k-th layer (k-1, 2k-1, ...) "
                         "global (global_every=k), or every layer local or global")
    return window, every


def rope_thetas(hf: dict, name: str) -> tuple[float, float]:
    """(the global layers' RoPE base, the local ones'): Gemma 3's rope_parameters per layer type, or its older
    rope_theta and rope_local_base_freq; Gemma 2 one base. Rope scaling raises (llama.rope_theta)."""
    rope = hf.get("rope_parameters") or {}
    if "full_attention" in rope or "sliding_attention" in rope:
        return tuple(llama.rope_theta({"rope_parameters": rope.get(kind) or {}}, f"{name}'s {kind} layers")
                     for kind in ("full_attention", "sliding_attention"))
    theta = llama.rope_theta(hf, name)
    return theta, float(hf.get("rope_local_base_freq") or theta)


def layout(cfg: ModelConfig) -> Layout:
    """Qwen3's attention tensors (q_norm, k_norm with qk_norm), post_attention_layernorm as attn_out_norm,
    pre_ / post_feedforward_layernorm, Llama's gated MLP."""
    d = cfg.d_model

    def layer(i: int) -> list[Tensor]:
        p = f"model.layers.{i}."
        out_norm = f"{p}post_attention_layernorm.weight"  # Llama's MLP norm, Gemma's attention output norm
        tensors = [dataclasses.replace(t, parts="attn_out_norm/scale") if t.name == out_norm else t
                   for t in qwen3.attention(cfg, i)]
        return [*tensors, *norm(p + "pre_feedforward_layernorm", "mlp_norm", d, bias=False),
                *norm(p + "post_feedforward_layernorm", "mlp_out_norm", d, bias=False),
                *llama.swiglu(cfg, p, bias=False)]

    return Layout(*llama.top_and_ignored(cfg), layer)


def export(cfg: ModelConfig, version: int) -> dict:
    """Gemma's config.json fields for `cfg`; ValueError naming what it cannot hold."""
    check_export(cfg, f"Gemma{version}ForCausalLM", {
        "norm": ("rmsnorm",), "activation": ("geglu",), "use_bias": (False,), "attention": ("mha",),
        "qk_norm": (version == 3,), **{k: (True,) for k in ("norm_unit_offset", "sublayer_out_norm", "embed_scale")},
        **({"rope_local_theta": (0.0,)} if version == 2 else {"attn_softcap": (0.0,)})})
    hf = llama.export(cfg.replace(activation="swiglu"))
    del hf["hidden_act"], hf["mlp_bias"]
    scale_dim = cfg.attn_scale_dim or cfg.head_dim
    hf |= {"hidden_activation": "gelu_pytorch_tanh", "sliding_window": cfg.attention_window or cfg.max_seq_len,
           "query_pre_attn_scalar": int(scale_dim) if float(scale_dim).is_integer() else scale_dim,
           "layer_types": ["full_attention" if w is None else "sliding_attention" for w in cfg.layer_windows()],
           "final_logit_softcapping": cfg.logit_softcap or None, "attn_logit_softcapping": cfg.attn_softcap or None}
    if version == 3:
        local = cfg.rope_local_theta or cfg.rope_theta
        hf |= {"rope_local_base_freq": local, "rope_parameters": {
            "full_attention": {"rope_type": "default", "rope_theta": cfg.rope_theta},
            "sliding_attention": {"rope_type": "default", "rope_theta": local}}}
    return hf


def fields_set(cfg: ModelConfig) -> str:
    """The Gemma-only fields `cfg` sets, as 'name=value, ...' ('' for none)."""
    return ", ".join(f"{k}={getattr(cfg, k)!r}" for k in FIELDS + ("activation",)
                     if getattr(cfg, k) and (k != "activation" or cfg.activation == "geglu"))


def family(cfg: ModelConfig) -> types.SimpleNamespace:
    """Gemma 3 with qk_norm or a local RoPE base, else Gemma 2 (for an export)."""
    return GEMMA3 if cfg.qk_norm or cfg.rope_local_theta else GEMMA2


def _family(version: int, model_type: str, defaults: dict) -> types.SimpleNamespace:
    return types.SimpleNamespace(
        ARCH=f"Gemma{version}ForCausalLM", MODEL_TYPE=model_type, DEFAULTS=defaults, layout=layout,
        import_config=functools.partial(import_config, version=version),
        export=functools.partial(export, version=version))


GEMMA2, GEMMA3 = _family(2, "gemma2", GEMMA2_DEFAULTS), _family(3, "gemma3_text", GEMMA3_DEFAULTS)
