"""A sparse autoencoder: f = sigma(W_enc^T (x - b_dec) + b_enc), x_hat = W_dec^T f + b_dec.

    sae = init(key, point="blocks.1.resid_post", width=128, features=1024, architecture="topk", k=16)
    f = sae.encode(x)        # [..., D] -> [..., N] sparse, non-negative
    x_hat = sae.decode(f)    # [..., N] -> [..., D]

sigma is TopK (keep the k largest pre-activations, ReLU them; Gao et al. 2024) or JumpReLU (z where
z > threshold, else 0; Rajamanoharan et al. 2024, Gemma Scope), whose threshold learns through the
straight-through estimator below. The keys and shapes are SAELens's (W_enc [D, N], W_dec [N, D]), so
the published layouts (layouts.py) load without transposes.
"""

from __future__ import annotations

from functools import partial

import flax.struct
import jax
import jax.numpy as jnp

Array = jax.Array
ARCHITECTURES = ("topk", "jumprelu")


@flax.struct.dataclass
class SAE:
    """The parameters (float32) and the static choices of one SAE on point `point` of width D."""

    W_enc: Array  # [D, N]  # noqa: N815 (the published layouts' names)
    b_enc: Array  # [N]
    W_dec: Array  # [N, D]  # noqa: N815
    b_dec: Array  # [D]
    threshold: Array  # [N]: JumpReLU's; unused by TopK
    point: str = flax.struct.field(pytree_node=False, default="")
    architecture: str = flax.struct.field(pytree_node=False, default="topk")
    k: int = flax.struct.field(pytree_node=False, default=0)
    subtract_b_dec: bool = flax.struct.field(pytree_node=False, default=True)  # SAELens's apply_b_dec_to_input
    bandwidth: float = flax.struct.field(pytree_node=False, default=1e-3)  # JumpReLU's epsilon (training)

    @property
    def width(self) -> int:
        """D, the point's last axis."""
        return self.W_enc.shape[0]

    @property
    def num_features(self) -> int:
        """N, the dictionary's size."""
        return self.W_enc.shape[1]

    def pre_activations(self, x: Array) -> Array:
        """z = (x - b_dec) W_enc + b_enc: [..., D] -> [..., N] float32 (x - 0 when not subtract_b_dec)."""
        x = jnp.asarray(x, jnp.float32)
        return (x - self.b_dec * self.subtract_b_dec) @ self.W_enc + self.b_enc

    def encode(self, x: Array) -> Array:
        """The feature activations f [..., N] of activations x [..., D]."""
        z = self.pre_activations(x)
        if self.architecture == "topk":
            return top_k(z, self.k)
        return jump_relu(z, self.threshold, self.bandwidth)

    def decode(self, f: Array) -> Array:
        """x_hat = f W_dec + b_dec: [..., N] -> [..., D] float32."""
        return f @ self.W_dec + self.b_dec


def init(key: Array, *, point: str, width: int, features: int, architecture: str = "topk", k: int = 16,
         threshold: float = 1e-3, bandwidth: float = 1e-3) -> SAE:
    """A fresh SAE: W_dec's rows random unit vectors and W_enc = W_dec^T (Gao et al. 2024's tied start,
    which leaves fewer features dead), zero biases, a JumpReLU threshold of `threshold`."""
    if architecture not in ARCHITECTURES:
        raise ValueError(f"sae.architecture={architecture!r}; use one of {ARCHITECTURES}")
    w_dec = jax.random.normal(key, (features, width), jnp.float32)
    w_dec = w_dec / jnp.linalg.norm(w_dec, axis=-1, keepdims=True)
    threshold = threshold if architecture == "jumprelu" else 0.0
    return SAE(w_dec.T, jnp.zeros(features), w_dec, jnp.zeros(width), jnp.full(features, threshold, jnp.float32),
               point=point, architecture=architecture, k=k if architecture == "topk" else 0, bandwidth=bandwidth)


def top_k(z: Array, k: int) -> Array:
    """ReLU of the k largest entries of z [..., N] along N, zero elsewhere (SAELens's TopK)."""
    values, indices = jax.lax.top_k(z, k)
    rows = jnp.indices(indices.shape)[:-1]
    return jnp.zeros_like(z).at[(*rows, indices)].set(jax.nn.relu(values))


def _rectangle(u: Array) -> Array:
    """The kernel K(u) = 1 for |u| < 1/2, else 0: the pseudo-derivative's window."""
    return (jnp.abs(u) < 0.5).astype(u.dtype)


def _to_threshold_shape(g: Array, threshold: Array) -> Array:
    """A gradient [..., N] summed over the leading axes to the threshold's [N]."""
    return g.reshape(-1, threshold.shape[-1]).sum(0)


@partial(jax.custom_vjp, nondiff_argnums=(2,))
def jump_relu(z: Array, threshold: Array, bandwidth: float) -> Array:
    """z H(z - threshold): z where it exceeds the threshold [N], else 0. Its gradient: H(z - threshold)
    for z; for the threshold the pseudo-derivative -(threshold / eps) K((z - threshold) / eps)
    (Rajamanoharan et al. 2024, eq. 11; SAELens's JumpReLU), eps = bandwidth."""
    return z * (z > threshold)


def _jump_relu_forward(z, threshold, bandwidth):
    return jump_relu(z, threshold, bandwidth), (z, threshold)


def _jump_relu_backward(bandwidth, saved, g):
    z, threshold = saved
    near = _rectangle((z - threshold) / bandwidth)
    return g * (z > threshold), _to_threshold_shape(-(threshold / bandwidth) * near * g, threshold)


jump_relu.defvjp(_jump_relu_forward, _jump_relu_backward)


@partial(jax.custom_vjp, nondiff_argnums=(2,))
def step(z: Array, threshold: Array, bandwidth: float) -> Array:
    """H(z - threshold), 1 or 0, whose sum over N is the L0 the JumpReLU loss penalises; no gradient for
    z, and -(1 / eps) K((z - threshold) / eps) for the threshold (Rajamanoharan et al. 2024, eq. 12)."""
    return (z > threshold).astype(z.dtype)


def _step_forward(z, threshold, bandwidth):
    return step(z, threshold, bandwidth), (z, threshold)


def _step_backward(bandwidth, saved, g):
    z, threshold = saved
    near = _rectangle((z - threshold) / bandwidth)
    return jnp.zeros_like(z), _to_threshold_shape(-near * g / bandwidth, threshold)


step.defvjp(_step_forward, _step_backward)
