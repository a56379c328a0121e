"""A protein family: a Potts model over the 20 amino acids with couplings on a fold's contacts, and its
sequences drawn by Gibbs sampling.

    potts = draw_potts(rng, contacts)                     # fields h [L, Q], couplings J [L, L, Q, Q]
    x = gibbs(potts, key, num_chains=20_000, sweeps=50)   # int32 [N, L]: one sequence per chain
    f = pair_frequencies(x)                               # [L, L, Q, Q]
    p = exact_pair_frequencies(potts)                     # the same, by enumerating all Q^L sequences (tiny L)

p(x) is proportional to exp(sum_i h_i(x_i) + sum_{i<j} J_ij(x_i, x_j)), with J_ij = 0 off the contacts:
residues in contact mutate together across the family (coevolution), which is what a language model
trained on its sequences and the classical contact predictors (contacts.py) pick up."""

from __future__ import annotations

import itertools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

Q = 20  # amino acids
COUPLING = 0.5  # standard deviation of a contact's coupling J_ij(a, b)
FIELD = 1.0  # standard deviation of the fields h_i(a): conserved sites, which tell the families apart


class Potts(NamedTuple):
    fields: jax.Array  # h [L, Q]
    couplings: jax.Array  # J [L, L, Q, Q], J[i, j] = J[j, i].T, zero unless i, j are in contact
    neighbours: jax.Array  # int [L, K]: site i's contacts, padded with i itself (J[i, i] = 0)


def draw_potts(rng: np.random.Generator, contacts: np.ndarray, coupling: float = COUPLING,
               field: float = FIELD) -> Potts:
    """Random Gaussian fields and couplings on the contacts (bool [L, L], symmetric)."""
    length = len(contacts)
    upper = rng.normal(0.0, coupling, (length, length, Q, Q)) * np.triu(contacts, 1)[:, :, None, None]
    couplings = upper + upper.transpose(1, 0, 3, 2)
    degree = max(1, int(contacts.sum(axis=1).max()))
    neighbours = [np.pad(np.flatnonzero(row), (0, degree - row.sum()), constant_values=i) for i, row in enumerate(contacts)]
    return Potts(jnp.asarray(rng.normal(0.0, field, (length, Q)), jnp.float32), jnp.asarray(couplings, jnp.float32),
                 jnp.asarray(np.stack(neighbours), jnp.int32))


def site_logits(potts: Potts, x: jax.Array, i: jax.Array) -> jax.Array:
    """x int [N, L] -> [N, Q]: the log-probabilities of residue i's amino acids given the others, unnormalised."""
    near = potts.neighbours[i]  # [K]
    to_a = potts.couplings[i, near].transpose(0, 2, 1)  # [K, Q (x_j), Q (a)]
    return potts.fields[i] + to_a[jnp.arange(len(near)), x[:, near]].sum(axis=1)  # sum_j J_ij(a, x_j): [N, Q]


def gibbs_sweeps(potts: Potts, key: jax.Array, x: jax.Array, sweeps: int) -> jax.Array:
    """x int [N, L] after `sweeps` systematic-scan sweeps (sites 0..L-1 in turn, every chain at once)."""
    length = x.shape[1]

    def site(i, carry):
        x, key = carry
        key, sub = jax.random.split(key)
        return x.at[:, i].set(jax.random.categorical(sub, site_logits(potts, x, i))), key

    return jax.lax.fori_loop(0, sweeps * length, lambda t, c: site(t % length, c), (x, key))[0]


_gibbs_sweeps = jax.jit(gibbs_sweeps, static_argnums=3)


def gibbs(potts: Potts, key: jax.Array, num_chains: int, sweeps: int, start: jax.Array | None = None) -> np.ndarray:
    """int32 [num_chains, L]: independent chains from `start` (default uniformly random), their last states."""
    init, run = jax.random.split(key)
    if start is None:
        start = jax.random.randint(init, (num_chains, potts.fields.shape[0]), 0, Q)
    return np.asarray(_gibbs_sweeps(potts, run, jnp.asarray(start, jnp.int32), sweeps))


def pair_frequencies(x: np.ndarray) -> np.ndarray:
    """int [N, L] -> f [L, L, Q, Q]: the share of sequences with amino acid a at i and b at j."""
    onehot = np.eye(Q, dtype=np.float32)[x].reshape(len(x), -1)  # [N, L Q]
    length = x.shape[1]
    return (onehot.T @ onehot / len(x)).reshape(length, Q, length, Q).transpose(0, 2, 1, 3)


def exact_pair_frequencies(potts: Potts) -> np.ndarray:
    """[L, L, Q, Q]: the Potts distribution's pair marginals, summed over all Q^L sequences (L <= 4 or so)."""
    h, couplings = np.asarray(potts.fields, np.float64), np.asarray(potts.couplings, np.float64)
    length = h.shape[0]
    x = np.array(list(itertools.product(range(Q), repeat=length)))  # [Q^L, L]
    energy = h[np.arange(length), x].sum(axis=1)
    for i, j in itertools.combinations(range(length), 2):
        energy += couplings[i, j, x[:, i], x[:, j]]
    p = np.exp(energy - energy.max())
    onehot = np.eye(Q)[x].reshape(len(x), -1)
    return ((onehot * (p / p.sum())[:, None]).T @ onehot).reshape(length, Q, length, Q).transpose(0, 2, 1, 3)
