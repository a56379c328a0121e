"""Muon's update for the layers' matrices: Nesterov momentum, orthogonalised by a Newton-Schulz iteration,
then scaled by the matrix's shape.

    optax.chain(scale_by_muon(beta, dimension_numbers), scale_by_shape(dimension_numbers), ...)

The same numbers and state as optax.contrib.scale_by_muon (Frobenius normalisation, five quintic steps
with its coefficients) and optax.contrib.muon's shape scale, sqrt(max(1, out / in)), but each matrix is read
as it lies, [batch..., out, in] (a free reshape), and the Gram matrix is taken on its shorter side:
X X^T X = X (X^T X), so neither X nor the result is transposed. optax turns each matrix to [in, out] and
back, which on a CPU costs as much as the products (bench/results.md, "Muon's update").
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from optax.contrib import MuonDimensionNumbers, MuonState

# (a, b, c) of X <- a X + b (X X^T) X + c (X X^T)^2 X: optax's and modded-nanogpt's quintic step.
COEFFICIENTS = (3.4445, -4.7750, 2.0315)
STEPS = 5


def orthogonalize(x: jax.Array, eps: float = 1e-8) -> jax.Array:
    """[..., m, n] -> [..., m, n]: each matrix divided by its Frobenius norm, then STEPS quintic
    Newton-Schulz steps, which take its singular values near 1 (U S V^T -> about U V^T)."""
    x = x / (jnp.sqrt(jnp.sum(jnp.square(x), axis=(-2, -1), keepdims=True)) + eps)
    a, b, c = COEFFICIENTS
    wide = x.shape[-2] <= x.shape[-1]
    for _ in range(STEPS):
        if wide:  # A = X X^T [m, m]; X <- (a + b A + c A^2) X
            gram = jnp.einsum("...ik,...jk->...ij", x, x)
            x = a * x + (b * gram + c * gram @ gram) @ x
        else:  # A = X^T X [n, n]; X <- X (a + b A + c A^2)
            gram = jnp.einsum("...ki,...kj->...ij", x, x)
            x = a * x + x @ (b * gram + c * gram @ gram)
    return x


def fans(shape: tuple[int, ...], numbers: MuonDimensionNumbers) -> tuple[int, int]:
    """(out, in) of a parameter read as [batch..., out axes, in axes]: its input (reduction) axes last."""
    n_in, n_out = len(numbers.reduction_axis), len(numbers.output_axis)
    if tuple(numbers.reduction_axis) != tuple(range(-n_in, 0)) or \
            tuple(numbers.output_axis) != tuple(range(-n_in - n_out, -n_in)):
        raise ValueError(f"Muon reads a matrix as [..., out axes, in axes]; got {numbers}")
    return math.prod(shape[-n_in - n_out:-n_in]), math.prod(shape[-n_in:])


def per_matrix(f: Callable[[jax.Array, MuonDimensionNumbers], jax.Array], dimension_numbers: Callable[[Any], Any]
               ) -> Callable[[Any], Any]:
    """updates -> f(u, numbers) for each leaf that has dimension numbers (Muon's part of a partition)."""
    return lambda updates: jax.tree.map(f, updates, dimension_numbers(updates),
                                        is_leaf=lambda x: isinstance(x, MuonDimensionNumbers))


def scale_by_muon(beta: float, dimension_numbers: Callable[[Any], Any]) -> optax.GradientTransformation:
    """Nesterov momentum `beta` with optax's bias correction, each matrix's update orthogonalised as
    [batch..., out, in] (a free reshape). dimension_numbers(updates): a MuonDimensionNumbers per leaf."""

    def one(u, numbers):
        batch = u.shape[:-len(numbers.reduction_axis) - len(numbers.output_axis)]
        return orthogonalize(u.reshape(*batch, *fans(u.shape, numbers))).reshape(u.shape)

    orthogonalize_each = per_matrix(one, dimension_numbers)

    def init(params):
        return MuonState(count=jnp.zeros([], jnp.int32), mu=optax.tree.zeros_like(params),
                         ns_coeffs=jnp.asarray(COEFFICIENTS))

    def update(updates, state, params=None):
        del params
        mu = optax.tree.update_moment(updates, state.mu, beta, 1)
        count = optax.safe_increment(state.count)
        nesterov = jax.tree.map(lambda m, g: beta * m + (1 - beta) * g,
                                optax.tree.bias_correction(mu, beta, optax.safe_increment(count)),
                                optax.tree.bias_correction(updates, beta, count))
        return orthogonalize_each(nesterov), MuonState(count=count, mu=mu, ns_coeffs=state.ns_coeffs)

    return optax.GradientTransformation(init, update)


def scale_by_shape(dimension_numbers: Callable[[Any], Any]) -> optax.GradientTransformation:
    """Each orthogonalised update x sqrt(max(1, out / in)) (W_fc_in [F, D]: x sqrt(F / D)), as
    optax.contrib.muon scales it without exporting the step."""

    def one(u, numbers):
        fan_out, fan_in = fans(u.shape, numbers)
        return u * math.sqrt(max(1.0, fan_out / fan_in))

    scale = per_matrix(one, dimension_numbers)
    return optax.GradientTransformation(optax.init_empty_state, lambda updates, state, params=None: (scale(updates), state))
