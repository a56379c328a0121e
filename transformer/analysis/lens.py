"""Reading the residual stream through the model's own head: the logit lens and direct logit attribution.

    lens = logit_lens(params, cfg, tokens)                  # [L + 1, B, T, V]: after the embedding, each layer
    dla = direct_logit_attribution(params, cfg, tokens, targets)   # each head's and MLP's share of a logit

Attribution reads each part of x_final = embed + sum_l (sum_h head_out[l, h] + b_o[l] + mlp.out[l])
through the head with the final norm's scale frozen and no soft-cap, so the parts add up to the logit.
"""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from transformer.analysis.capture import capture
from transformer.model import ops
from transformer.model.config import ModelConfig
from transformer.model.edits import Edit
from transformer.model.norm import config_norm
from transformer.model.positions import scheme

Array = jax.Array


def unembedding(params: Any, cfg: ModelConfig) -> Array:
    """W_U [V, D]: the rows the last hidden state is dotted with (E when tied, else W_head)."""
    return params["embed"]["embedding"] if cfg.tie_embeddings else params["head"]["kernel"]


def head(params: Any, cfg: ModelConfig, x: Array) -> Array:
    """The model's head on residual streams x [..., T, D] -> logits [..., T, V] float32, as the Decoder's."""
    if cfg.prenorm:
        x = config_norm(cfg, "final_norm").apply({"params": params["final_norm"]}, x)
    logits = jnp.einsum("...d,vd->...v", x, unembedding(params, cfg).astype(cfg.dtype)).astype(jnp.float32)
    return ops.softcap(logits, cfg.logit_softcap) if cfg.logit_softcap else logits


def logit_lens(params: Any, cfg: ModelConfig, tokens: Array, edits: list[Edit] = ()) -> Array:
    """The head on the residual stream entering layer 0 and leaving each layer: [L + 1, B, T, V] float32."""
    names = ["blocks.0.resid_pre", "blocks.*.resid_post"]
    _, _, got = capture(params, cfg, tokens, names, edits=edits)
    streams = jnp.concatenate([got[names[0]][None], got[names[1]]])  # [L + 1, B, T, D]
    return head(params, cfg, streams)


@flax.struct.dataclass
class Attribution:
    """Each part's direct contribution to a logit (or a logit difference), float32: embed [B, T] (with
    positions), heads [L, H, B, T], attn_bias [L, B, T], mlp [L, B, T], norm_bias [B, T]; logit [B, T]."""

    embed: Array
    heads: Array
    attn_bias: Array
    mlp: Array
    norm_bias: Array
    logit: Array

    def total(self) -> Array:
        """The sum of the parts [B, T]: equals `logit`."""
        return self.embed + self.heads.sum((0, 1)) + self.attn_bias.sum(0) + self.mlp.sum(0) + self.norm_bias


def direct_logit_attribution(params: Any, cfg: ModelConfig, tokens: Array, targets: Array,
                             against: Array | None = None) -> Attribution:
    """Attribution of logit[targets] (- logit[against]) [B, T] at each position of `tokens` [B, T] (pre-norm)."""
    if not cfg.prenorm:
        raise ValueError("direct logit attribution needs a pre-norm model: a post-norm model normalises the "
                         "residual stream inside each layer, so its output is no sum of the heads' and MLPs' parts")
    last = f"blocks.{cfg.num_layers - 1}.resid_post"
    names = ["embed", "blocks.*.attn.head_out", "blocks.*.attn.out", last]
    names += ["pos_embed"] if scheme(cfg).embed is not None else []
    names += ["blocks.*.mlp.out"] if cfg.mlp_dim else []
    _, _, got = capture(params, cfg, tokens, names)
    w_u = unembedding(params, cfg).astype(jnp.float32)
    direction = w_u[targets] if against is None else w_u[targets] - w_u[against]  # [B, T, D]
    x = got[last].astype(jnp.float32)  # [B, T, D]: the final residual stream
    norm = params.get("final_norm", {})
    scale = norm.get("scale", jnp.ones(cfg.d_model)).astype(jnp.float32)
    # A layer norm removes each part's mean; RMSNorm does not.
    centre = (lambda v: v - v.mean(-1, keepdims=True)) if cfg.norm == "layernorm" else (lambda v: v)
    inverse = jax.lax.rsqrt(jnp.square(centre(x)).mean(-1, keepdims=True) + cfg.norm_eps)  # [B, T, 1], frozen

    def read(part: Array) -> Array:  # [..., B, T, D] -> [..., B, T]: through the frozen norm and W_U
        return jnp.einsum("...btd,btd->...bt", centre(part.astype(jnp.float32)) * inverse * scale, direction)

    heads = read(jnp.moveaxis(got["blocks.*.attn.head_out"], 3, 1))  # [L, B, T, H, D] -> [L, H, B, T]
    embed = read(got["embed"] + got.get("pos_embed", 0.0))
    # What W_o adds besides the heads: its bias (attn.out = the heads' sum + b_o).
    attn_bias = read(got["blocks.*.attn.out"] - got["blocks.*.attn.head_out"].sum(3))
    mlp = read(got["blocks.*.mlp.out"]) if cfg.mlp_dim else jnp.zeros_like(attn_bias)
    bias = norm.get("bias", jnp.zeros(cfg.d_model)).astype(jnp.float32)
    norm_bias = jnp.einsum("d,btd->bt", bias, direction)
    final = config_norm(cfg, "final_norm").apply({"params": norm}, got[last]).astype(jnp.float32)
    logit = jnp.einsum("btd,btd->bt", final, direction)  # before the soft-cap
    return Attribution(embed=embed, heads=heads, attn_bias=attn_bias, mlp=mlp, norm_bias=norm_bias, logit=logit)
