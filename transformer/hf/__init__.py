"""Hugging Face checkpoints: import GPT-2, Llama, Mistral, Qwen3, Gemma 2 / 3, Mixtral, Qwen3-MoE and dense
DeepSeek-V3; export all but DeepSeek.

    cfg, params = from_hf("path/to/gpt2")          # a local folder: config.json + *.safetensors
    cfg, params = from_hf(hf_model)                # or a `transformers` model object in memory
    to_hf(cfg, params, "out/", tokenizer=tok)      # AutoModelForCausalLM.from_pretrained("out/")
Nothing is downloaded; what the model does not implement (rope scaling, DeepSeek-V3's MoE, ...) raises a ValueError."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from transformer.model.config import ModelConfig
from transformer.hf import deepseek, gemma, gpt2, llama, mapping, mistral, mixtral, model_files, qwen3, qwen3_moe
from transformer.hf.tokenizer_files import check_tokenizer, write_tokenizer
from transformer.model.param_tree import join_layers, layout_differences, split_layers
from transformer.data.tokenizer import Tokenizer

_FAMILIES = {family.ARCH: family for family in (gpt2, llama, mistral, deepseek, qwen3, gemma.GEMMA2, gemma.GEMMA3,
                                                mixtral, qwen3_moe)}
SUPPORTED = tuple(_FAMILIES)
MODEL_TYPES = {family.MODEL_TYPE: family.ARCH for family in _FAMILIES.values()}


def from_hf(source: str | os.PathLike | Any, scan_layers: bool = True) -> tuple[ModelConfig, dict]:
    """(cfg, float32 params) of a Hugging Face causal LM (a folder or a model object); `scan_layers`: [L, ...]."""
    hf, arch, open_tensors = model_files.open_source(source)
    arch = str(arch or MODEL_TYPES.get(hf.get("model_type"), hf.get("model_type")))
    if arch not in SUPPORTED:
        raise ValueError(f"cannot import the Hugging Face architecture {arch!r}: supported are "
                         f"{', '.join(SUPPORTED)} (DeepSeek-V3 only with dense MLP layers)")
    family = _FAMILIES[arch]
    defaulted = [k for k in family.DEFAULTS if k not in hf]  # transformers' defaults, as it reads the file
    hf = {**family.DEFAULTS, **hf}
    if quant := hf.get("quantization_config"):
        method = quant.get("quant_method", "?") if isinstance(quant, Mapping) else "?"
        raise ValueError(f"this {arch} checkpoint is quantised (quantization_config, quant_method={method!r}); "
                         "only unquantised float32 / bfloat16 / float16 weights can be imported")
    if family not in (mistral, qwen3, gemma.GEMMA2, gemma.GEMMA3, mixtral, qwen3_moe) and (hf.get("sliding_window")
                                                                       or hf.get("use_sliding_window")):
        raise ValueError(f"this {arch} config uses sliding-window attention "
                         f"(sliding_window={hf.get('sliding_window')}), which the importer of this architecture "
                         "does not read (only Mistral's, Mixtral's, Qwen3's, Qwen3-MoE's and Gemma's are read)")
    cfg, layout = family.import_config(hf)
    if cfg.mlp_dim == 0:  # ModelConfig reads it as "no MLP"; a zero-width MLP is not worth importing
        raise ValueError(f"cannot import {arch} with an MLP width of 0: this importer expects an MLP in every layer")
    cfg = cfg.replace(scan_layers=scan_layers)
    tensors = open_tensors()  # only now, after every check of the config
    tensors.where += f" (whose config leaves out {', '.join(defaulted)}: defaults taken)" if defaulted else ""
    layers = [mapping.read(tensors, layout.layer(i)) for i in range(cfg.num_layers)]
    params = join_layers(mapping.read(tensors, layout.top), layers, scanned=scan_layers)
    tensors.check_all_used(layout.ignored)
    params = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), params)
    diff = layout_differences(cfg, params)
    if diff:
        raise RuntimeError(f"internal error: imported params do not match Decoder(cfg)'s layout: {diff[:6]}")
    return cfg, params


def to_hf(cfg: ModelConfig, params: Mapping, directory: str | os.PathLike, *,
          tokenizer: Tokenizer | None = None) -> None:
    """Writes config.json and model.safetensors that `transformers` loads as the same model, and the files of
    `tokenizer` (the model's); ValueError, before any write, for what no supported family holds."""
    gemma_fields = gemma.fields_set(cfg)
    family = (gpt2 if cfg.position == "learned" else gemma.family(cfg) if gemma_fields
              else (qwen3_moe if cfg.qk_norm else mixtral) if cfg.num_experts else qwen3 if cfg.qk_norm
              else mistral if cfg.attention_window else llama)
    holds = {"qk_norm": (qwen3, qwen3_moe, gemma.GEMMA3), "logit_softcap": (gemma.GEMMA2, gemma.GEMMA3)}
    recipe = ", ".join(f"{k}={getattr(cfg, k)!r}" for k in holds if getattr(cfg, k) and family not in holds[k])
    nowhere = "so no supported Hugging Face architecture can hold this model"
    for refused, why in (
        (cfg.attention_sink or cfg.num_registers,
         f"attention_sink={cfg.attention_sink}, num_registers={cfg.num_registers}: neither GPT-2 nor Llama has a "
         f"sink logit or register tokens, {nowhere}; train it with attention_sink=False and num_registers=0 to export"),
        (recipe, f"{recipe}: neither GPT-2 nor Llama normalises queries and keys or soft-caps its logits (Qwen3 and "
         "Gemma 3 normalise them, Gemma 2 / 3 cap them, with RoPE and their other fields); train it with "
         "qk_norm=False and logit_softcap=0 to export"),
        (gemma_fields and family is gpt2, f"{gemma_fields} with learned positions: only Gemma 2 / 3 have these "
         "fields, and they have RoPE"),
        (cfg.num_experts and family not in (mixtral, qwen3_moe), f"num_experts={cfg.num_experts} with "
         f"position={cfg.position!r} or Gemma's fields: Mixtral and Qwen3-MoE, the architectures with experts, have "
         "RoPE and none of Gemma's fields"),
        (cfg.mlp_dim == 0, f"mlp_dim=0 (attention-only blocks): GPT-2 and Llama have an MLP in every layer, {nowhere}"),
        (cfg.attention_window and cfg.position != "rope",
         f"attention_window={cfg.attention_window} with position={cfg.position!r}: GPT-2 has no sliding window, "
         "and Mistral (the supported architecture with one) has RoPE"),
        (cfg.position not in ("learned", "rope"), f"position={cfg.position!r}: GPT-2 has learned positions and "
         "Llama has RoPE; no supported Hugging Face architecture has sinusoidal or no positions"),
    ):
        if refused:
            raise ValueError(f"cannot export {why}")
    if tokenizer is not None:
        check_tokenizer(cfg, tokenizer)
    if "params" in params and len(params) == 1:
        params = params["params"]
    top, layers = split_layers(jax.tree.map(np.asarray, params), cfg.num_layers)
    hf = {"architectures": [family.ARCH], "model_type": family.MODEL_TYPE, "vocab_size": cfg.vocab_size,
          **family.export(cfg), "tie_word_embeddings": cfg.tie_embeddings, "bos_token_id": None,
          "eos_token_id": None, "dtype": "float32"}
    model_files.write_model(directory, hf, mapping.export(family.layout(cfg), top, layers))
    if tokenizer is not None:
        write_tokenizer(cfg, tokenizer, directory)


def check_same_architecture(imported: ModelConfig, run: ModelConfig, *, seq_len: int | None = None) -> None:
    """ValueError naming every field (and a seq_len) where `run` cannot train `imported`, with the fixes."""
    a, b = imported.architecture(), run.architecture()
    diffs = [k for k in a if a[k] != b[k]]
    problems = [f"{k}: imported {a[k]!r}, config {b[k]!r}" for k in diffs]
    flags = [f"--config.model.{k}={a[k]}" for k in diffs]
    # Against the imported context: with the flags above applied, the run's context is that one.
    if seq_len is not None and seq_len > imported.max_seq_len:
        problems.append(f"train.seq_len={seq_len} exceeds the imported max_seq_len={imported.max_seq_len}")
        flags.append(f"--config.train.seq_len={imported.max_seq_len}")
    if problems:
        raise ValueError(f"the run's config does not fit the imported Hugging Face model ({'; '.join(problems)}). "
                         f"Pass these overrides to match it: {' '.join(flags)}")
