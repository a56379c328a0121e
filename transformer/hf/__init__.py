"""Hugging Face checkpoints: import GPT-2, Llama, Mistral and dense DeepSeek-V3 models; export GPT-2 /
Llama / Mistral.

    cfg, params = from_hf("path/to/gpt2")          # a local folder: config.json + *.safetensors
    cfg, params = from_hf(hf_model)                # or a `transformers` model object in memory
    logits, _ = Decoder(cfg).apply({"params": params}, tokens)

    to_hf(cfg, params, "out/", tokenizer=tok)      # AutoModelForCausalLM.from_pretrained("out/"),
                                                   # sample.py --hf_dir out/

Reading a folder needs only `safetensors` and NumPy (no PyTorch, no `transformers`); sharded
checkpoints (model.safetensors.index.json) are read shard by shard. Nothing is downloaded.

    model_files.py reading a folder (config.json, safetensors) or a model object; writing a folder
    gpt2.py        GPT2LMHeadModel        import and export
    llama.py       LlamaForCausalLM       import and export (and the conventions DeepSeek shares)
    mistral.py     MistralForCausalLM     import and export: Llama with a sliding window (attention_window)
    deepseek.py    DeepseekV3ForCausalLM  import: multi-head latent attention, dense MLPs only
    mapping.py     what each of those three gives from_hf and to_hf
    tokenizer.py   the tokenizer files to_hf writes

Anything the model code does not implement raises a ValueError naming it, rather than giving a
silently different model: rope scaling ('yarn', 'llama3', 'linear', 'dynamic', ...), mixture-of-
experts layers, sliding windows (but Mistral's), biases our layers lack, quantised weights, unknown architectures,
tensors of the wrong shape, and tensors the importer would not use.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from transformer.model.config import ModelConfig
from transformer.hf import deepseek, gpt2, llama, mapping, mistral, model_files
from transformer.hf.tokenizer_files import check_tokenizer, write_tokenizer
from transformer.model.param_tree import join_layers, layout_differences, split_layers
from transformer.data.tokenizer import Tokenizer

_FAMILIES = {family.ARCH: family for family in (gpt2, llama, mistral, deepseek)}
SUPPORTED = tuple(_FAMILIES)
MODEL_TYPES = {family.MODEL_TYPE: family.ARCH for family in _FAMILIES.values()}


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
    hf, arch, open_tensors = model_files.open_source(source)
    arch = str(arch or MODEL_TYPES.get(hf.get("model_type"), hf.get("model_type")))
    if arch not in SUPPORTED:
        raise ValueError(
            f"cannot import the Hugging Face architecture {arch!r}: supported are "
            f"{', '.join(SUPPORTED)} (DeepSeek-V3 only with dense MLP layers)"
        )
    family = _FAMILIES[arch]
    hf = {**family.DEFAULTS, **hf}
    _check_common(hf, arch, windows=getattr(family, "SLIDING_WINDOW", False))
    cfg, layout = family.import_config(hf)
    if cfg.mlp_dim == 0:  # ModelConfig reads it as "no MLP"; a zero-width MLP is not worth importing
        raise ValueError(f"cannot import {arch} with an MLP width of 0: this importer expects an MLP in every layer")
    cfg = cfg.replace(scan_layers=scan_layers)
    tensors = open_tensors()  # only now, after every check of the config
    layers = [mapping.read(tensors, layout.layer(i)) for i in range(cfg.num_layers)]
    params = join_layers(mapping.read(tensors, layout.top), layers, scanned=scan_layers)
    tensors.check_all_used(layout.ignored)
    params = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), params)
    diff = layout_differences(cfg, params)
    if diff:
        raise RuntimeError(f"internal error: imported params do not match Decoder(cfg)'s layout: {diff[:6]}")
    return cfg, params


def to_hf(
    cfg: ModelConfig, params: Mapping, directory: str | os.PathLike, *,
    tokenizer: Tokenizer | None = None,
) -> None:
    """Writes config.json and model.safetensors that `transformers` loads as the same model.

    GPT-2-shaped configs (learned positions, pre-norm layer norm, multi-head attention, a
    gelu_tanh / gelu / relu / relu2 MLP) become GPT2LMHeadModel; Llama-shaped configs (RoPE, pre-norm
    RMSNorm, SwiGLU, optional grouped-query attention) become LlamaForCausalLM, or MistralForCausalLM
    with a sliding window in every layer (attention_window, no biases). A missing norm gain
    or bias (norm_scale / norm_bias / use_bias False) is written as ones / zeros, so importing the
    export gives an equivalent model whose config has them. Anything else (post-norm, sinusoidal or
    no positions, MLA, mlp_dim=0, a sink logit, registers, qk_norm, a logit soft-cap, local layers
    between global ones (global_every), a window without RoPE, ...) raises a
    ValueError saying why, before anything is written. The initialisation fields (zero_init_out,
    zero_init_head) say nothing about the parameters: they are not exported.

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
    if cfg.attention_sink or cfg.num_registers:
        raise ValueError(
            f"cannot export attention_sink={cfg.attention_sink}, num_registers={cfg.num_registers}: neither "
            "GPT-2 nor Llama has a sink logit or register tokens, so no supported Hugging Face architecture "
            "can hold this model; train it with attention_sink=False and num_registers=0 to export"
        )
    recipe = [f"{k}={getattr(cfg, k)!r}" for k in ("qk_norm", "logit_softcap") if getattr(cfg, k)]
    if recipe:
        raise ValueError(
            f"cannot export {', '.join(recipe)}: neither GPT-2 nor Llama normalises queries and keys or "
            "soft-caps its logits, so no supported Hugging Face architecture can hold this model; train it "
            "with qk_norm=False and logit_softcap=0 to export"
        )
    if cfg.mlp_dim == 0:
        raise ValueError(
            "cannot export mlp_dim=0 (attention-only blocks): GPT-2 and Llama have an MLP in every layer, "
            "so no supported Hugging Face architecture can hold this model"
        )
    if tokenizer is not None:
        check_tokenizer(cfg, tokenizer)
    if "params" in params and len(params) == 1:
        params = params["params"]
    top, layers = split_layers(jax.tree.map(np.asarray, params), cfg.num_layers)
    if cfg.attention_window and cfg.position != "rope":
        raise ValueError(
            f"cannot export attention_window={cfg.attention_window} with position={cfg.position!r}: GPT-2 has no "
            "sliding window, and Mistral (the supported architecture with one) has RoPE"
        )
    if cfg.position not in ("learned", "rope"):
        raise ValueError(
            f"cannot export position={cfg.position!r}: GPT-2 has learned positions and Llama has RoPE; "
            "no supported Hugging Face architecture has sinusoidal or no positions"
        )
    family = gpt2 if cfg.position == "learned" else mistral if cfg.attention_window else llama
    hf = family.export(cfg)
    model_files.write_model(directory, hf, mapping.export(family.layout(cfg), top, layers))
    if tokenizer is not None:
        write_tokenizer(cfg, tokenizer, directory)


def check_same_architecture(imported: ModelConfig, run: ModelConfig, *, seq_len: int | None = None) -> None:
    """Raises ValueError if the run's config cannot train the imported model, listing every fix.

    Names every architectural field where `run` differs from `imported` and, when the run's
    train.seq_len (`seq_len`) is longer than the imported context, that too: the message ends with
    all the --config overrides that make the run fit, in one go. The initialisation and execution
    fields (config.INIT_FIELDS, EXECUTION_FIELDS: how the parameters start and are computed) are not
    compared.
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


def _check_common(hf: dict, arch: str, windows: bool = False) -> None:
    """Features of a config that no importer implements (sliding windows: all but those that say so)."""
    if hf.get("quantization_config"):
        quant = hf["quantization_config"]
        method = quant.get("quant_method", "?") if isinstance(quant, Mapping) else "?"
        raise ValueError(
            f"this {arch} checkpoint is quantised (quantization_config, quant_method={method!r}); "
            "only unquantised float32 / bfloat16 / float16 weights can be imported"
        )
    if not windows and (hf.get("sliding_window") or hf.get("use_sliding_window")):
        raise ValueError(
            f"this {arch} config uses sliding-window attention (sliding_window={hf.get('sliding_window')}), "
            "which the importer of this architecture does not read (only MistralForCausalLM's is imported)"
        )
