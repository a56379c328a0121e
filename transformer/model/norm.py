"""Norm: the Flax module around ops.layer_norm / ops.rms_norm, with optional gain and bias."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer.model import ops


class Norm(nn.Module):
    """Layer norm or RMSNorm over the last axis, with an optional learned gain ('scale') and bias.

    kind: 'layernorm' or 'rmsnorm' (RMSNorm never has a bias). Maps [..., D] -> [..., D].
    """

    kind: str = "layernorm"
    use_scale: bool = True
    use_bias: bool = True
    eps: float = 1e-5

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        d = x.shape[-1]
        scale = self.param("scale", nn.initializers.ones, (d,), jnp.float32) if self.use_scale else None
        if self.kind == "rmsnorm":
            return ops.rms_norm(x, scale, self.eps)
        bias = self.param("bias", nn.initializers.zeros, (d,), jnp.float32) if self.use_bias else None
        return ops.layer_norm(x, scale, bias, self.eps)
