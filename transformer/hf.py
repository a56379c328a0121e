"""Hugging Face checkpoints: import GPT-2, Llama and dense DeepSeek-V3 models; export GPT-2 / Llama.

    cfg, params = from_hf("path/to/gpt2")          # a local folder: config.json + *.safetensors
    cfg, params = from_hf(hf_model)                # or a `transformers` model object in memory
    logits, _ = Decoder(cfg).apply({"params": params}, tokens)

    to_hf(cfg, params, "out/", tokenizer=tok)      # AutoModelForCausalLM.from_pretrained("out/"),
                                                   # sample.py --hf_dir out/

Reading a folder needs only `safetensors` and NumPy (no PyTorch, no `transformers`); sharded
checkpoints (model.safetensors.index.json) are read shard by shard. Nothing is downloaded.

What is imported, and how each maps onto `ModelConfig` (see `SUPPORTED`):

  GPT2LMHeadModel        learned positions, pre-norm layer norm with gain and bias, biases
                         everywhere, MLP activation gelu_new -> 'gelu_tanh' (or 'gelu' / 'relu'),
                         tied head. Conv1D weights are [in, out] (ours [out, in]: transposed); the
                         fused c_attn splits into q, k, v.
  LlamaForCausalLM       RoPE (any rope_theta, no rope scaling), RMSNorm (gain only), SwiGLU MLP,
                         grouped-query attention, head_dim from the config, tied or untied head;
                         attention_bias and mlp_bias must be equal (our use_bias covers both).
  DeepseekV3ForCausalLM  multi-head latent attention with decoupled RoPE, only when every MLP layer
                         is dense (first_k_dense_replace >= num_hidden_layers). q_lora_rank ->
                         q_latent_dim (None / 0: a plain q_proj), kv_lora_rank -> kv_latent_dim,
                         qk_nope_head_dim -> head_dim, qk_rope_head_dim -> rope_head_dim,
                         v_head_dim -> v_head_dim; q_a_layernorm -> q_norm, kv_a_layernorm -> kv_norm;
                         kv_b_proj splits into k_up and v_up.

RoPE layout of DeepSeek-V3. With `rope_interleave` (the default), Hugging Face rotates the rotary
features of queries and of the shared rotary key as interleaved pairs (x0, x1), (x2, x3), ... and
emits the result half-split; our `ops.rope` rotates half-split pairs (x_i, x_{i + R/2}). The import
therefore permutes the output rows of the rotary part of q_proj / q_b_proj (per head) and of the
rotary key in kv_a_proj_with_mqa into the order (x0, x2, x4, ..., x1, x3, ...): the rotated
queries and keys are then exactly Hugging Face's, and so are the scores.

Anything the model code does not implement raises a ValueError naming it, rather than giving a
silently different model: rope scaling ('yarn', 'llama3', 'linear', 'dynamic', ...), mixture-of-
experts layers, sliding windows, biases our layers lack, quantised weights, unknown architectures,
tensors of the wrong shape, and tensors the importer would not use.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import tokenizers

from transformer.config import ModelConfig
from transformer.tokenizer import HF_FILE, BPETokenizer, ByteTokenizer, Tokenizer, save_tokenizer

SUPPORTED = ("GPT2LMHeadModel", "LlamaForCausalLM", "DeepseekV3ForCausalLM")
MODEL_TYPES = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM", "deepseek_v3": "DeepseekV3ForCausalLM"}

# Hugging Face's class defaults for the keys we read, used when a config.json omits one.
_DEFAULTS = {
    "GPT2LMHeadModel": dict(
        vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12, n_inner=None,
        activation_function="gelu_new", layer_norm_epsilon=1e-5, tie_word_embeddings=True,
        scale_attn_weights=True, scale_attn_by_inverse_layer_idx=False, add_cross_attention=False,
    ),
    "LlamaForCausalLM": dict(
        vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=None, hidden_act="silu",
        max_position_embeddings=2048, rms_norm_eps=1e-6, tie_word_embeddings=False,
        attention_bias=False, mlp_bias=False, head_dim=None,
    ),
    "DeepseekV3ForCausalLM": dict(
        vocab_size=129280, hidden_size=7168, intermediate_size=18432, num_hidden_layers=61,
        num_attention_heads=128, kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64,
        v_head_dim=128, qk_nope_head_dim=128, first_k_dense_replace=3, hidden_act="silu",
        max_position_embeddings=4096, rms_norm_eps=1e-6, tie_word_embeddings=False,
        rope_interleave=True, attention_bias=False,
    ),
}

# The eps Hugging Face's DeepseekV3RMSNorm uses for the latent norms (q_a_layernorm,
# kv_a_layernorm): fixed, not config.rms_norm_eps. Our LatentAttention uses norm_eps for them.
_DEEPSEEK_LATENT_NORM_EPS = 1e-6

_GPT2_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu", "relu": "relu"}


# ---------------------------------------------------------------------------------------------
# Import
# ---------------------------------------------------------------------------------------------


def from_hf(source: str | os.PathLike | Any, scan_layers: bool = True) -> tuple[ModelConfig, dict]:
    """Imports a Hugging Face causal language model as (ModelConfig, params).

    Args:
      source: a local folder holding config.json and model.safetensors (or shards listed in
        model.safetensors.index.json), read without PyTorch; or a `transformers` model object
        (a PreTrainedModel: its `config` and `state_dict()` are used).
      scan_layers: lay the layers out for `nn.scan` (one `layers` subtree whose leaves have a
        leading L axis, the default) or as layers_0 ... layers_{L-1}; sets cfg.scan_layers.
    Returns:
      (cfg, params): `Decoder(cfg).apply({"params": params}, tokens)` gives the model's logits.
      Parameters are float32 (bfloat16 / float16 checkpoints are widened).
    Raises:
      ValueError naming what is not supported (architecture, rope scaling, MoE layers, ...), a
      tensor whose shape disagrees with the config, or a tensor that is missing or left unused.
    """
    hf, arch, open_tensors = _open(source)
    if arch not in SUPPORTED:
        raise ValueError(
            f"cannot import the Hugging Face architecture {arch!r}: supported are "
            f"{', '.join(SUPPORTED)} (DeepSeek-V3 only with dense MLP layers)"
        )
    hf = {**_DEFAULTS[arch], **hf}
    _check_common(hf, arch)
    cfg, convert = _IMPORTERS[arch](hf)
    cfg = cfg.replace(scan_layers=scan_layers)
    tensors = open_tensors()  # only now, after every check of the config
    layers = [convert.layer(tensors, cfg, i) for i in range(cfg.num_layers)]
    params = convert.top(tensors, cfg)
    if scan_layers:
        params["layers"] = _stack(layers)
    else:
        for i, layer in enumerate(layers):
            params[f"layers_{i}"] = layer
    tensors.check_all_used(convert.ignore(cfg))
    params = _map(lambda a: jnp.asarray(a, jnp.float32), params)
    _check_layout(cfg, params)
    return cfg, params


def check_same_architecture(imported: ModelConfig, run: ModelConfig, *, seq_len: int | None = None) -> None:
    """Raises ValueError if the run's config cannot train the imported model, listing every fix.

    Names every architectural field where `run` differs from `imported` and, when the run's
    train.seq_len (`seq_len`) is longer than the imported context, that too: the message ends with
    all the --config overrides that make the run fit, in one go. The execution fields
    (config.EXECUTION_FIELDS: how the parameters are computed) are not compared.
    Used by `train.py --config.init_from_hf=DIR`.
    """
    a, b = imported.architecture(), run.architecture()
    diffs = [k for k in a if a[k] != b[k]]
    problems = [f"{k}: imported {a[k]!r}, config {b[k]!r}" for k in diffs]
    flags = [f"--config.model.{k}={a[k]}" for k in diffs]
    # Checked against the imported context, not run.max_seq_len: once the flags above are applied,
    # the run's context is the imported one.
    if seq_len is not None and seq_len > imported.max_seq_len:
        problems.append(f"train.seq_len={seq_len} exceeds the imported max_seq_len={imported.max_seq_len}")
        flags.append(f"--config.train.seq_len={imported.max_seq_len}")
    if problems:
        raise ValueError(
            f"the run's config does not fit the imported Hugging Face model ({'; '.join(problems)}). "
            f"Pass these overrides to match it: {' '.join(flags)}"
        )


@dataclasses.dataclass
class _Converter:
    top: Callable[["_Tensors", ModelConfig], dict]  # embed, pos_embed, final_norm, head
    layer: Callable[["_Tensors", ModelConfig, int], dict]  # one layer's params
    ignore: Callable[[ModelConfig], list]  # regexes (or predicates) of tensors no one reads


def _import_gpt2(hf: dict) -> tuple[ModelConfig, _Converter]:
    for key, want in (("scale_attn_weights", True), ("scale_attn_by_inverse_layer_idx", False),
                      ("add_cross_attention", False)):
        if bool(hf[key]) != want:
            raise ValueError(f"GPT-2 with {key}={hf[key]} is not supported (only {key}={want})")
    act = hf["activation_function"]
    if act not in _GPT2_ACTIVATIONS:
        raise ValueError(
            f"GPT-2 activation_function={act!r} is not supported; supported are "
            f"{', '.join(_GPT2_ACTIVATIONS)}"
        )
    d = hf["n_embd"]
    cfg = ModelConfig(
        vocab_size=hf["vocab_size"], max_seq_len=hf["n_positions"], d_model=d,
        num_layers=hf["n_layer"], num_heads=hf["n_head"], mlp_dim=hf["n_inner"] or 4 * d,
        activation=_GPT2_ACTIVATIONS[act], position="learned", norm="layernorm",
        norm_eps=float(hf["layer_norm_epsilon"]), use_bias=True,
        tie_embeddings=bool(hf["tie_word_embeddings"]),
    )
    h, k, f = cfg.num_heads, cfg.head_dim, cfg.mlp_dim

    def norm(t, name):
        return {"scale": t.get(f"{name}.weight", (d,)), "bias": t.get(f"{name}.bias", (d,))}

    def layer(t, cfg, i):
        p = f"transformer.h.{i}."
        # GPT-2's Conv1D stores [in, out]; our kernels are [out, in] (transformer/linear.py).
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
        return {"attn_norm": norm(t, p + "ln_1"), "attn": attn, "mlp_norm": norm(t, p + "ln_2"), "mlp": mlp}

    def top(t, cfg):
        params = {
            "embed": {"embedding": t.get("transformer.wte.weight", (cfg.vocab_size, d))},
            "pos_embed": t.get("transformer.wpe.weight", (cfg.max_seq_len, d)),
            "final_norm": norm(t, "transformer.ln_f"),
        }
        if not cfg.tie_embeddings:
            params["head"] = {"kernel": t.get("lm_head.weight", (cfg.vocab_size, d))}
        return params

    def ignore(cfg):
        # The causal-mask buffers of old checkpoints; the head when it is tied to the embedding.
        tied_head = ["lm_head.weight"] if cfg.tie_embeddings else []
        return [r"transformer\.h\.\d+\.attn\.(bias|masked_bias)"] + tied_head

    return cfg, _Converter(top, layer, ignore)


def _import_llama(hf: dict) -> tuple[ModelConfig, _Converter]:
    _check_silu(hf, "Llama")
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
        position="rope", rope_theta=_rope_theta(hf, "Llama"), norm="rmsnorm", norm_bias=False,
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
            "mlp": _swiglu(t, p, d, f, bias),
        }

    return cfg, _Converter(_llama_top, layer, _llama_ignore)


def _import_deepseek_v3(hf: dict) -> tuple[ModelConfig, _Converter]:
    _check_silu(hf, "DeepSeek-V3")
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
    if eps != _DEEPSEEK_LATENT_NORM_EPS:
        raise ValueError(
            f"DeepSeek-V3 with rms_norm_eps={eps} is not supported: Hugging Face's latent norms "
            f"(q_a_layernorm, kv_a_layernorm) always use eps={_DEEPSEEK_LATENT_NORM_EPS}, while our "
            "MLA uses norm_eps for every norm, so only rms_norm_eps=1e-6 imports exactly"
        )
    if not hf["qk_rope_head_dim"]:
        raise ValueError("DeepSeek-V3 with qk_rope_head_dim=0 (no rotary part) is not supported")
    d, h = hf["hidden_size"], hf["num_attention_heads"]
    q_latent = hf["q_lora_rank"] or None
    cfg = ModelConfig(
        vocab_size=hf["vocab_size"], max_seq_len=hf["max_position_embeddings"], d_model=d,
        num_layers=num_layers, num_heads=h, head_dim=hf["qk_nope_head_dim"],
        v_head_dim=hf["v_head_dim"], mlp_dim=hf["intermediate_size"], activation="swiglu",
        position="rope", rope_theta=_rope_theta(hf, "DeepSeek-V3"), norm="rmsnorm", norm_bias=False,
        norm_eps=eps, use_bias=False, tie_embeddings=bool(hf["tie_word_embeddings"]),
        attention="mla", kv_latent_dim=hf["kv_lora_rank"], q_latent_dim=q_latent,
        rope_head_dim=hf["qk_rope_head_dim"],
    )
    k, r, kv, c, f = cfg.head_dim, cfg.rope_head_dim, cfg.v_head_dim, cfg.kv_latent_dim, cfg.mlp_dim
    # Interleaved rotary pairs -> half-split pairs (see the module docstring).
    perm = np.concatenate([np.arange(0, r, 2), np.arange(1, r, 2)]) if hf["rope_interleave"] else np.arange(r)

    def q_rows(w, n_in):
        """[H * (K + R), in] -> kernel [H, K + R, in] with the rotary rows of each head permuted."""
        w = w.reshape(h, k + r, n_in)
        return np.concatenate([w[:, :k], w[:, k:][:, perm]], axis=1)

    def layer(t, cfg, i):
        p = f"model.layers.{i}.self_attn."
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
        q = f"model.layers.{i}."
        return {
            "attn_norm": {"scale": t.get(q + "input_layernorm.weight", (d,))},
            "attn": attn,
            "mlp_norm": {"scale": t.get(q + "post_attention_layernorm.weight", (d,))},
            "mlp": _swiglu(t, q, d, f, False),
        }

    def ignore(cfg):
        # Multi-token-prediction modules (num_nextn_predict_layers) are stored as extra layers past
        # the model's last one; they are not part of the language model.
        def mtp(name):
            m = re.fullmatch(r"model\.layers\.(\d+)\..*", name)
            return m is not None and int(m[1]) >= cfg.num_layers

        return _llama_ignore(cfg) + [mtp]

    return cfg, _Converter(_llama_top, layer, ignore)


def _swiglu(t: "_Tensors", p: str, d: int, f: int, bias: bool) -> dict:
    mlp = {}
    for ours, theirs, shape in (("gate", "gate_proj", (f, d)), ("up", "up_proj", (f, d)),
                                ("fc_out", "down_proj", (d, f))):
        mlp[ours] = {"kernel": t.get(f"{p}mlp.{theirs}.weight", shape)}
        if bias:
            mlp[ours]["bias"] = t.get(f"{p}mlp.{theirs}.bias", (shape[0],))
    return mlp


def _llama_top(t: "_Tensors", cfg: ModelConfig) -> dict:
    params = {
        "embed": {"embedding": t.get("model.embed_tokens.weight", (cfg.vocab_size, cfg.d_model))},
        "final_norm": {"scale": t.get("model.norm.weight", (cfg.d_model,))},
    }
    if not cfg.tie_embeddings:
        params["head"] = {"kernel": t.get("lm_head.weight", (cfg.vocab_size, cfg.d_model))}
    return params


def _llama_ignore(cfg: ModelConfig) -> list[str]:
    return [r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq", r"model\.rotary_emb\.inv_freq"] + (
        ["lm_head.weight"] if cfg.tie_embeddings else []
    )


_IMPORTERS = {
    "GPT2LMHeadModel": _import_gpt2,
    "LlamaForCausalLM": _import_llama,
    "DeepseekV3ForCausalLM": _import_deepseek_v3,
}


def _check_common(hf: dict, arch: str) -> None:
    """Features of a config that no importer implements."""
    if hf.get("quantization_config"):
        quant = hf["quantization_config"]
        method = quant.get("quant_method", "?") if isinstance(quant, Mapping) else "?"
        raise ValueError(
            f"this {arch} checkpoint is quantised (quantization_config, quant_method={method!r}); "
            "only unquantised float32 / bfloat16 / float16 weights can be imported"
        )
    if hf.get("sliding_window") or hf.get("use_sliding_window"):
        raise ValueError(
            f"this {arch} config uses sliding-window attention (sliding_window={hf.get('sliding_window')}), "
            "which the model code does not implement"
        )


def _check_silu(hf: dict, name: str) -> None:
    if hf["hidden_act"] not in ("silu", "swish"):
        raise ValueError(
            f"{name} with hidden_act={hf['hidden_act']!r} is not supported; only 'silu' (SwiGLU)"
        )


def _rope_theta(hf: dict, name: str) -> float:
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


# ---------------------------------------------------------------------------------------------
# Reading checkpoints
# ---------------------------------------------------------------------------------------------


class _Tensors:
    """Named tensors, read lazily as float32 NumPy arrays; tracks which were used.

    `get(name, shape)` also finds a name without its first component ('transformer.', 'model.'),
    as old checkpoints (e.g. the original `gpt2`) store them.
    """

    def __init__(self, names: list[str], read: Callable[[str], np.ndarray], where: str):
        self.names = set(names)
        self.read = read
        self.where = where
        self.used: set[str] = set()

    def get(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        stored = name
        if stored not in self.names and "." in name and name.split(".", 1)[1] in self.names:
            stored = name.split(".", 1)[1]
        if stored not in self.names:
            raise ValueError(f"tensor {name} is missing from {self.where}")
        self.used.add(stored)
        array = self.read(stored)
        if tuple(array.shape) != tuple(shape):
            raise ValueError(
                f"tensor {stored} in {self.where} has shape {tuple(array.shape)}, but the config "
                f"implies {tuple(shape)}; the weights do not belong to this config.json"
            )
        return array

    def check_all_used(self, ignore: list) -> None:
        """Raises if a tensor was neither read nor matched by `ignore` (regexes or predicates)."""
        tests = [p if callable(p) else re.compile(p).fullmatch for p in ignore]
        full = lambda n: [n] + [f"{p}.{n}" for p in ("transformer", "model")]  # noqa: E731
        left = sorted(
            n for n in self.names - self.used if not any(t(m) for t in tests for m in full(n))
        )
        if left:
            shown = ", ".join(left[:8]) + (f" and {len(left) - 8} more" if len(left) > 8 else "")
            raise ValueError(
                f"{self.where} holds tensors the importer does not use ({shown}): the model uses "
                "a feature this code does not implement, so it would not compute the same function"
            )


def _open(source: Any) -> tuple[dict, str, Callable[[], _Tensors]]:
    """(config dict, architecture name, a function that opens the tensors) of a folder or a model."""
    if isinstance(source, (str, os.PathLike)):
        return _open_directory(os.fspath(source))
    if hasattr(source, "state_dict") and hasattr(source, "config"):
        hf = source.config.to_dict()
        arch = type(source).__name__

        def open_tensors():
            state = source.state_dict()
            read = lambda name: _torch_to_numpy(state[name])  # noqa: E731
            return _Tensors(list(state), read, f"the {arch} model's state_dict")

        return hf, arch, open_tensors
    raise TypeError(
        f"from_hf takes a local model folder or a transformers model object, got {type(source).__name__}"
    )


def _torch_to_numpy(tensor: Any) -> np.ndarray:
    """A torch tensor (any float dtype) -> float32 NumPy array."""
    import torch

    return tensor.detach().to(device="cpu", dtype=torch.float32).numpy()


def _open_directory(directory: str) -> tuple[dict, str, Callable[[], _Tensors]]:
    config_path = os.path.join(directory, "config.json")
    if not os.path.isfile(config_path):
        raise FileNotFoundError(
            f"{directory} holds no config.json; pass a folder written by save_pretrained (config.json "
            "and *.safetensors), e.g. a model downloaded with huggingface-cli"
        )
    with open(config_path) as f:
        hf = json.load(f)
    arch = (hf.get("architectures") or [None])[0] or MODEL_TYPES.get(hf.get("model_type"), hf.get("model_type"))
    return hf, str(arch), lambda: _directory_tensors(directory)


def _directory_tensors(directory: str) -> _Tensors:
    index_path = os.path.join(directory, "model.safetensors.index.json")
    if os.path.isfile(index_path):
        with open(index_path) as f:
            weight_map = json.load(f)["weight_map"]
    else:
        files = sorted(n for n in os.listdir(directory) if n.endswith(".safetensors"))
        if not files:
            raise FileNotFoundError(
                f"{directory} holds no *.safetensors weights (PyTorch .bin files are not read); "
                "convert them with save_pretrained(..., safe_serialization=True)"
            )
        weight_map = {}
        for file in files:
            for name in _safe_open(os.path.join(directory, file), "numpy").keys():
                weight_map[name] = file

    handles: dict[tuple[str, str], Any] = {}

    def handle(file: str, framework: str):
        if (file, framework) not in handles:
            handles[file, framework] = _safe_open(os.path.join(directory, file), framework)
        return handles[file, framework]

    def read(name: str) -> np.ndarray:
        file = weight_map[name]
        if handle(file, "numpy").get_slice(name).get_dtype() == "BF16":
            # NumPy has no bfloat16: read it as a JAX array (ml_dtypes), then widen.
            return np.asarray(handle(file, "flax").get_tensor(name), np.float32)
        return np.asarray(handle(file, "numpy").get_tensor(name), np.float32)

    return _Tensors(list(weight_map), read, directory)


def _safe_open(path: str, framework: str):
    from safetensors import safe_open

    return safe_open(path, framework=framework)


# ---------------------------------------------------------------------------------------------
# Export
# ---------------------------------------------------------------------------------------------


def to_hf(
    cfg: ModelConfig, params: Mapping, directory: str | os.PathLike, *,
    tokenizer: Tokenizer | None = None,
) -> None:
    """Writes config.json and model.safetensors that `transformers` loads as the same model.

    GPT-2-shaped configs (learned positions, pre-norm layer norm, multi-head attention, a
    gelu_tanh / gelu / relu MLP) become GPT2LMHeadModel; Llama-shaped configs (RoPE, pre-norm
    RMSNorm, SwiGLU, optional grouped-query attention) become LlamaForCausalLM. A missing norm gain
    or bias (norm_scale / norm_bias / use_bias False) is written as ones / zeros, so importing the
    export gives an equivalent model whose config has them. Anything else (post-norm, sinusoidal or
    no positions, MLA, ...) raises a ValueError saying why, before anything is written.

    With `tokenizer` (the one the model was trained with) the folder also holds:
      tokenizer.json         a Hugging Face tokenizer: a BPE's own; for the byte tokenizer, a
                             byte-level BPE without merges whose ids are the byte values, so it
                             encodes and decodes exactly as ByteTokenizer does
      tokenizer_config.json  tokenizer_class PreTrainedTokenizerFast, model_max_length
      tokenizer_kind.json    what `load_tokenizer` reads first ("bytes" or "bpe")
    so `sample.py --hf_dir` and `load_tokenizer` get the original tokenizer back, and
    `AutoTokenizer.from_pretrained(directory)` loads one that gives the same ids. The exported
    tokenizer has no special tokens (no BOS / EOS / padding): set them in transformers if a tool
    needs them. Without `tokenizer`, `sample.py --hf_dir` cannot read the folder.

    Args:
      cfg: the model config. params: its parameters (scanned or unscanned layers).
      directory: created if needed; then `AutoModelForCausalLM.from_pretrained(directory)`.
      tokenizer: a ByteTokenizer or BPETokenizer with at most cfg.vocab_size ids, or None.
    """
    if tokenizer is not None:
        _check_tokenizer(cfg, tokenizer)
    params = dict(params)
    if "params" in params and len(params) == 1:
        params = dict(params["params"])
    if "layers" in params:
        stacked = _map(np.asarray, params.pop("layers"))
        layers = [_map(lambda a: a[i], stacked) for i in range(cfg.num_layers)]
    else:
        layers = [_map(np.asarray, params.pop(f"layers_{i}")) for i in range(cfg.num_layers)]
    top = _map(np.asarray, params)

    if cfg.position == "learned":
        hf, tensors = _export_gpt2(cfg, top, layers)
    elif cfg.position == "rope":
        hf, tensors = _export_llama(cfg, top, layers)
    else:
        raise ValueError(
            f"cannot export position={cfg.position!r}: GPT-2 has learned positions and Llama has RoPE; "
            "no supported Hugging Face architecture has sinusoidal or no positions"
        )
    from safetensors.numpy import save_file

    os.makedirs(directory, exist_ok=True)
    tensors = {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in tensors.items()}
    save_file(tensors, os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(hf, f, indent=2)
    if tokenizer is not None:
        _write_tokenizer(cfg, tokenizer, directory)


def _check_tokenizer(cfg: ModelConfig, tokenizer: Tokenizer) -> None:
    if not isinstance(tokenizer, (ByteTokenizer, BPETokenizer)):
        raise TypeError(
            f"to_hf got a tokenizer of type {type(tokenizer).__name__}; pass the ByteTokenizer or "
            "BPETokenizer the model was trained with (e.g. load_tokenizer(workdir + '/tokenizer'))"
        )
    if tokenizer.vocab_size > cfg.vocab_size:
        raise ValueError(
            f"the tokenizer has {tokenizer.vocab_size} ids but the model's vocab_size is {cfg.vocab_size}: "
            "it is not the tokenizer this model was trained with; pass that one"
        )


def _write_tokenizer(cfg: ModelConfig, tokenizer: Tokenizer, directory: str | os.PathLike) -> None:
    """tokenizer.json, tokenizer_config.json and tokenizer_kind.json (see `to_hf`)."""
    if isinstance(tokenizer, ByteTokenizer):
        # save_tokenizer writes only the kind file for bytes; transformers needs a tokenizer.json.
        _byte_level_identity().save(os.path.join(directory, HF_FILE))
    hf_config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": cfg.max_seq_len,
                 "clean_up_tokenization_spaces": False}
    with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
        json.dump(hf_config, f, indent=2)
    save_tokenizer(tokenizer, directory)  # BPE: tokenizer.json; then the kind file, last


def _byte_level_identity() -> tokenizers.Tokenizer:
    """A Hugging Face tokenizer equal to ByteTokenizer: token id = byte value, 256 tokens, no merges.

    The ByteLevel pre-tokenizer turns each UTF-8 byte into one printable character (GPT-2's table:
    printable bytes stand for themselves, the other 68 take U+0100, U+0101, ... in byte order);
    the vocabulary maps that character back to its byte value.
    """
    printable = {*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)}
    others = iter(range(0x100, 0x200))
    chars = [chr(b) if b in printable else chr(next(others)) for b in range(256)]
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(vocab={c: b for b, c in enumerate(chars)}, merges=[]))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    return tok


def _export_checks(cfg: ModelConfig, arch: str, required: dict[str, tuple]) -> None:
    wrong = [f"{k}={getattr(cfg, k)!r} (needs {' or '.join(map(repr, v))})"
             for k, v in required.items() if getattr(cfg, k) not in v]
    if wrong:
        raise ValueError(f"cannot export this config as {arch}: " + "; ".join(wrong))


def _export_gpt2(cfg: ModelConfig, top: dict, layers: list[dict]) -> tuple[dict, dict]:
    acts = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}
    _export_checks(cfg, "GPT2LMHeadModel (learned positions)", {
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


def _export_llama(cfg: ModelConfig, top: dict, layers: list[dict]) -> tuple[dict, dict]:
    _export_checks(cfg, "LlamaForCausalLM (RoPE)", {
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


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


def _map(fn: Callable, tree: Any) -> Any:
    """fn on every array of a nested dict."""
    return {k: _map(fn, v) for k, v in tree.items()} if isinstance(tree, Mapping) else fn(tree)


def _stack(layers: list[dict]) -> dict:
    """Per-layer nested dicts -> one nested dict of arrays with a leading L axis."""
    stack = lambda items: _stack(items) if isinstance(items[0], Mapping) else np.stack(items)  # noqa: E731
    return {k: stack([layer[k] for layer in layers]) for k in layers[0]}


def _check_layout(cfg: ModelConfig, params: dict) -> None:
    """The imported tree must be exactly `Decoder(cfg)`'s: same names, same shapes."""
    from transformer.model import layout_differences

    diff = layout_differences(cfg, params)
    if diff:
        raise RuntimeError(f"internal error: imported params do not match Decoder(cfg)'s layout: {diff[:6]}")
