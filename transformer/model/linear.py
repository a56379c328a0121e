"""Linear maps y = W x + b, with W stored [out, in] as the lecture writes it (q_i = W_q h_i), not
nn.Dense's [in, out]: decoding's matrix-vector products read [out, in] weights faster on XLA:CPU
(docs/performance.md), and it is PyTorch's layout, so Hugging Face checkpoints load without transposes.
"""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer.model.config import ModelConfig

Array = jax.Array


FEW_ROWS = 64  # products of at most this many rows (a decoding step's batch) go weight-major on a CPU


def times_transpose(x: Array, w: Array) -> Array:
    """x [..., in] . W [out, in]^T -> [..., out]. With 2..FEW_ROWS rows of x on a CPU (a decoding step
    at batch > 1) it is computed as (W x^T)^T: XLA:CPU then streams W once past the few columns of
    x^T, where its row-major product of a skinny x is several times slower (docs/performance.md). The
    barriers keep XLA from folding the two small transposes back into the product."""
    lead = x.shape[:-1]
    rows = math.prod(lead)
    if not 1 < rows <= FEW_ROWS or jax.default_backend() != "cpu":
        return jnp.einsum("...i,oi->...o", x, w)
    x_t = jax.lax.optimization_barrier(x.reshape(rows, x.shape[-1]).T)  # [in, M]
    y_t = jax.lax.optimization_barrier(jnp.einsum("oi,im->om", w, x_t))  # [out, M]
    return y_t.T.reshape(*lead, w.shape[0])


class Linear(nn.Module):
    """x [..., *in_shape] -> y [..., *features] = W x + b over the last `in_axes` axes of x (2 for W_o,
    which reads [H, K]). W [*features, *in_shape] and b [*features] float32, cast to `dtype` per use."""

    features: int | tuple[int, ...]
    in_axes: int = 1
    use_bias: bool = True
    dtype: Any = jnp.float32
    kernel_init: nn.initializers.Initializer = nn.initializers.normal(0.02)

    @nn.compact
    def __call__(self, x: Array) -> Array:
        out = (self.features,) if isinstance(self.features, int) else tuple(self.features)
        in_shape = x.shape[x.ndim - self.in_axes:]
        w = self.param("kernel", self.kernel_init, out + in_shape, jnp.float32)
        # One 2-D product [..., in] x [out, in]^T: flattening is free (row-major), while a
        # dot_general over several axes makes XLA:CPU transpose the kernel on every call.
        n_out, n_in_flat = math.prod(out), math.prod(in_shape)
        x2 = x.reshape(*x.shape[: x.ndim - self.in_axes], n_in_flat).astype(self.dtype)
        y = times_transpose(x2, w.reshape(n_out, n_in_flat).astype(self.dtype))
        y = y.reshape(*y.shape[:-1], *out)
        if self.use_bias:
            y = y + self.param("bias", nn.initializers.zeros, out, jnp.float32).astype(self.dtype)
        return y


def dense_init(cfg: ModelConfig, output: bool = False) -> nn.initializers.Initializer:
    """Normal(0.02) as GPT-2; projections into the residual stream (`output`: W_o, the MLP's fc_out)
    are scaled by 1/sqrt(2L), or start at zero with cfg.zero_init_out (modded-nanogpt): then every
    block starts as the identity and the residual stream as the embedding; a block's inner weights
    get gradient once its W_o and fc_out have moved off zero."""
    if output and cfg.zero_init_out:
        return nn.initializers.zeros
    std = 0.02 / math.sqrt(2 * cfg.num_layers) if output else 0.02
    return nn.initializers.normal(std)


def dense(cfg: ModelConfig, features: int | tuple[int, ...], name: str, output: bool = False,
          use_bias: bool | None = None) -> Linear:
    """A projection W [*features, D_in] named `name`, with the config's bias (or `use_bias`), dtype and
    init (`output`: a projection into the residual stream)."""
    use_bias = cfg.use_bias if use_bias is None else use_bias
    return Linear(features, use_bias=use_bias, dtype=cfg.dtype, kernel_init=dense_init(cfg, output), name=name)
