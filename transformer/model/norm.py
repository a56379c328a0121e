"""Norm: the module around ops.layer_norm / ops.rms_norm, and the two ways a model builds one from its
config: `config_norm` (the blocks' and final norms) and `rms_norm_module` (qk_norm's and MLA's)."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer.model import ops
from transformer.model.config import ModelConfig
from transformer.model.points import point


class Norm(nn.Module):
    """Layer norm or RMSNorm (no bias) over the last axis, [..., D] -> [..., D], with optional gain and bias;
    offset: the gain is offset + w, w starting at 0 (Gemma's 1 + w, in float32 as Hugging Face's)."""

    kind: str = "layernorm"
    use_scale: bool = True
    use_bias: bool = True
    eps: float = 1e-5
    offset: float = 0.0

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        d = x.shape[-1]
        init = nn.initializers.zeros if self.offset else nn.initializers.ones
        scale = self.param("scale", init, (d,), jnp.float32) + self.offset if self.use_scale else None
        if self.kind == "rmsnorm":
            return point(self, "output", ops.rms_norm(x, scale, self.eps))  # the point NAME.out
        bias = self.param("bias", nn.initializers.zeros, (d,), jnp.float32) if self.use_bias else None
        return point(self, "output", ops.layer_norm(x, scale, bias, self.eps))


def config_norm(cfg: ModelConfig, name: str) -> Norm:
    return Norm(cfg.norm, cfg.norm_scale, cfg.norm_bias, cfg.norm_eps, float(cfg.norm_unit_offset), name=name)


def rms_norm_module(cfg: ModelConfig, name: str) -> Norm:
    """An RMSNorm over the last axis (no bias; a learned gain when cfg.norm_scale) as module `name`:
    MLA's latent norms and qk_norm's per-head norms of q and k, whatever cfg.norm is."""
    return Norm("rmsnorm", cfg.norm_scale, False, cfg.norm_eps, float(cfg.norm_unit_offset), name=name)
