"""An SAE on disk: our layout (SAELens's, read back bitwise), SAELens's, and Gemma Scope's params.npz.

    save(sae, "runs/sae/sae")                     # folder: cfg.json + sae_weights.safetensors
    sae = load("runs/sae/sae", cfg)               # ours or SAELens's, checked against the model
    sae = load_gemma_scope("params.npz", "blocks.20.resid_post", cfg)

SAELens (github.com/jbloomAus/SAELens, sae_lens/saes/sae.py, jumprelu_sae.py, topk_sae.py, v6): a
folder of `cfg.json` (architecture "jumprelu" | "topk" | "standard", d_in, d_sae, k, apply_b_dec_to_input,
normalize_activations, dtype; the hook in meta.hook_name, or hook_name in older files) and
`sae_weights.safetensors` with W_enc [d_in, d_sae], W_dec [d_sae, d_in], b_enc [d_sae], b_dec [d_in]
and, for JumpReLU, threshold [d_sae]. Its encode is z = (x - b_dec * apply_b_dec_to_input) W_enc + b_enc,
then ReLU(z) where z > threshold (JumpReLU) or ReLU of the k largest z (TopK); decode f W_dec + b_dec.
Gemma Scope (huggingface.co/google/gemma-scope, "Tutorial: Gemma Scope from Scratch"): params.npz
with the same five keys and shapes, encode ReLU(x W_enc + b_enc) where x W_enc + b_enc > threshold
(no b_dec subtracted). A hook name is TransformerLens's, ours with `hook_` before the last part.
Our files add `point`, our name, and `jumprelu_bandwidth`; SAELens ignores both.
"""

from __future__ import annotations

import json
import os
from typing import Any

import jax.numpy as jnp
import numpy as np
from safetensors.numpy import load_file, save_file

from transformer.analysis.capture import check_name
from transformer.analysis.sae.autoencoder import SAE
from transformer.model.config import ModelConfig
from transformer.model.points import point_axes, point_names

CONFIG, WEIGHTS = "cfg.json", "sae_weights.safetensors"  # SAELens's file names
KEYS = ("W_enc", "b_enc", "W_dec", "b_dec", "threshold")


def save(sae: SAE, folder: str) -> None:
    """`sae` as SAELens's folder layout (float32), with our point name beside the hook name."""
    os.makedirs(folder, exist_ok=True)
    arrays = {key: np.asarray(getattr(sae, key), np.float32) for key in KEYS}
    if sae.architecture == "topk":  # SAELens's TopK has no threshold
        del arrays["threshold"]
    save_file(arrays, os.path.join(folder, WEIGHTS))
    fields = {"architecture": sae.architecture, "d_in": sae.width, "d_sae": sae.num_features, "dtype": "float32",
              "apply_b_dec_to_input": sae.subtract_b_dec, "normalize_activations": "none",
              "meta": {"hook_name": hook_name(sae.point)}, "point": sae.point, "jumprelu_bandwidth": sae.bandwidth}
    with open(os.path.join(folder, CONFIG), "w") as f:
        json.dump(fields | ({"k": sae.k} if sae.architecture == "topk" else {}), f, indent=2)


def load(folder: str, cfg: ModelConfig | None = None) -> SAE:
    """The SAE in a SAELens folder (ours included), checked against a model of `cfg` if given."""
    with open(os.path.join(folder, CONFIG)) as f:
        fields = json.load(f)
    where = os.path.join(folder, CONFIG)
    if fields.get("normalize_activations", "none") != "none" or fields.get("reshape_activations", "none") != "none":
        raise ValueError(f"{where}: normalize_activations / reshape_activations other than 'none' are not read; fold "
                         "the scaling into the weights first (SAELens's fold_activation_norm_scaling_factor)")
    architecture = {"standard": "jumprelu"}.get(fields["architecture"], fields["architecture"])  # ReLU: threshold 0
    if architecture not in ("topk", "jumprelu"):
        raise ValueError(f"{where}: architecture {fields['architecture']!r} is not read; jumprelu, topk, standard are")
    hook = fields.get("hook_name") or fields.get("meta", {}).get("hook_name", "")
    arrays = load_file(os.path.join(folder, WEIGHTS))
    arrays.setdefault("threshold", np.zeros(fields["d_sae"], np.float32))
    sae = from_arrays(arrays, where, point=fields.get("point") or point_name(hook), architecture=architecture,
                      k=fields.get("k", 0) if architecture == "topk" else 0,
                      subtract_b_dec=fields.get("apply_b_dec_to_input", True),
                      bandwidth=fields.get("jumprelu_bandwidth", 1e-3))
    if (sae.width, sae.num_features) != (fields["d_in"], fields["d_sae"]):
        raise ValueError(f"{where}: d_in={fields['d_in']}, d_sae={fields['d_sae']} but W_enc is {sae.W_enc.shape}")
    if cfg is not None:
        check_fits(sae, cfg)
    return sae


def load_gemma_scope(path: str, point: str, cfg: ModelConfig | None = None) -> SAE:
    """Gemma Scope's params.npz (a JumpReLU SAE) read at our point `point`, checked against `cfg` if given."""
    with np.load(path) as npz:
        sae = from_arrays(dict(npz), path, point=point, architecture="jumprelu", subtract_b_dec=False)
    if cfg is not None:
        check_fits(sae, cfg)
    return sae


def from_arrays(arrays: dict[str, np.ndarray], where: str, **static: Any) -> SAE:
    """An SAE from the five published keys, their shapes checked: one line naming the file and key."""
    missing = [key for key in KEYS if key not in arrays]
    if missing:
        raise ValueError(f"{where} has no {', '.join(missing)}; an SAE file holds {', '.join(KEYS)}")
    d, n = arrays["W_enc"].shape
    shapes = {"W_enc": (d, n), "b_enc": (n,), "W_dec": (n, d), "b_dec": (d,), "threshold": (n,)}
    for key, shape in shapes.items():
        if arrays[key].shape != shape:
            raise ValueError(f"{where}: {key} has shape {arrays[key].shape}; with W_enc [d_in, d_sae] = {(d, n)} it "
                             f"should be {shape}")
    return SAE(*(jnp.asarray(arrays[key], jnp.float32) for key in KEYS), **static)


def check_fits(sae: SAE, cfg: ModelConfig) -> None:
    """Raises ValueError, in one line, for an SAE whose point the model lacks or whose width is not the point's."""
    width = point_width(cfg, sae.point)
    if sae.width != width:
        raise ValueError(f"the SAE reads vectors of width {sae.width} but {sae.point!r} of this model has width "
                         f"{width}; load an SAE trained on this model's point")


def point_width(cfg: ModelConfig, point: str) -> int:
    """The width of point `point` [B, T, width] of a model of `cfg`; ValueError for another point or shape."""
    check_name(point, cfg, point_names(cfg))
    axes = point_axes(cfg, point)
    widths = {"d": cfg.d_model, "f": cfg.mlp_dim, "v": cfg.vocab_size}
    if len(axes) != 3 or axes[-1] not in widths:
        raise ValueError(f"an SAE reads a point of shape [B, T, width]; {point!r} is [{', '.join(axes.upper())}]")
    return widths[axes[-1]]


def hook_name(point: str) -> str:
    """Our point name as TransformerLens's hook name: blocks.1.resid_post -> blocks.1.hook_resid_post."""
    *parts, last = point.split(".")
    return ".".join([*parts, "hook_" + last])


def point_name(hook: str) -> str:
    """A TransformerLens hook name as ours: blocks.8.hook_resid_pre -> blocks.8.resid_pre."""
    return ".".join(part.removeprefix("hook_") for part in hook.split("."))
