"""Contacts predicted from attention and from the classical coevolution statistics, and how they score.

    scores = apc(symmetrise(m))                         # [L, L]: a map's average-product-corrected score
    precision(scores, contacts, k)                      # share of the top k pairs (|i - j| >= 6) in contact
    mutual_information(x)                               # [L, L] between columns of an alignment x [N, L]
    pseudolikelihood_couplings(x)                       # [L, L]: a Potts fit's coupling norms (plmDCA-like)
    attention_contacts(maps)                            # [H, L, L] per head from causal maps [H, L, L]

Rao et al. 2020 ("Transformer protein language models are unsupervised structure learners") read
contacts from attention so: symmetrise each head's map, correct it with APC (Dunn et al. 2008), then a
logistic regression over the heads; MI with APC and plmDCA (Ekeberg et al. 2013) are the baselines."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from transformer.analysis.capture import attention_maps
from transformer.experiments.proteins.families import rows
from transformer.experiments.proteins.fold import MIN_SEPARATION, separation_mask
from transformer.experiments.proteins.potts import Q, pair_frequencies
from transformer.model.config import ModelConfig


def symmetrise(m: np.ndarray) -> np.ndarray:
    """[..., L, L] -> m + m^T (a causal map holds each pair once, below the diagonal)."""
    return m + np.swapaxes(m, -1, -2)


def apc(s: np.ndarray) -> np.ndarray:
    """[..., L, L] -> s_ij - s_i. s_.j / s_.. (the average product correction, sums over the whole map)."""
    rows, cols = s.sum(-1, keepdims=True), s.sum(-2, keepdims=True)
    return s - rows * cols / s.sum((-1, -2), keepdims=True)


def precision(scores: np.ndarray, contacts: np.ndarray, k: int, min_separation: int = MIN_SEPARATION) -> float:
    """The share of contacts among the k highest-scoring pairs i < j with j - i >= min_separation.
    scores [L, L] (symmetric), contacts bool [L, L]."""
    i, j = np.nonzero(np.triu(separation_mask(len(scores), min_separation)))
    top = np.argsort(-scores[i, j], kind="stable")[:k]
    return float(contacts[i[top], j[top]].mean())


def mutual_information(x: np.ndarray, pseudocount: float = 1e-3) -> np.ndarray:
    """int [N, L] -> [L, L]: the mutual information of every two columns (nats; zero diagonal)."""
    f = pair_frequencies(x) + pseudocount / Q**2  # [L, L, Q, Q]
    f /= f.sum((-1, -2), keepdims=True)
    fi, fj = f.sum(-1, keepdims=True), f.sum(-2, keepdims=True)
    mi = (f * np.log(f / (fi * fj))).sum((-1, -2))
    np.fill_diagonal(mi, 0.0)
    return mi


def pseudolikelihood_couplings(x: np.ndarray, steps: int = 200, learning_rate: float = 0.1,
                               l2: float = 1e-2, batch: int = 2000, seed: int = 0) -> np.ndarray:
    """int [N, L] -> [L, L]: the Frobenius norms of the couplings J_ij (zero-sum gauge) of a Potts model
    fitted by maximising the pseudo-likelihood sum_i log p(x_i | x_-i) (Adam on mini-batches, an L2
    penalty l2 x ||J||^2 per sequence); symmetric, zero diagonal. Minutes at L = 64 on a CPU."""
    n, length = x.shape
    onehot = jnp.asarray(np.eye(Q, dtype=np.float32)[x].reshape(n, length * Q))
    not_self = jnp.asarray(1.0 - np.kron(np.eye(length), np.ones((Q, Q))), jnp.float32)  # no J_ii

    def loss(params, rows):
        w = params["w"] * not_self
        logits = (rows @ (w + w.T) / 2 + params["h"]).reshape(-1, length, Q)  # [B, L, Q]
        observed = rows.reshape(-1, length, Q)
        return -(jax.nn.log_softmax(logits) * observed).sum((1, 2)).mean() + l2 * (w ** 2).sum()

    optimiser = optax.adam(learning_rate)

    @jax.jit
    def step(params, state, rows):
        grads = jax.grad(loss)(params, rows)
        updates, state = optimiser.update(grads, state)
        return optax.apply_updates(params, updates), state

    params = {"w": jnp.zeros((length * Q, length * Q)), "h": jnp.zeros(length * Q)}
    state, rng = optimiser.init(params), np.random.default_rng(seed)
    for _ in range(steps):
        params, state = step(params, state, onehot[rng.choice(n, min(batch, n), replace=False)])
    w = np.asarray(params["w"] * not_self)
    couplings = ((w + w.T) / 2).reshape(length, Q, length, Q).transpose(0, 2, 1, 3)  # [L, L, Q, Q]
    centred = (couplings - couplings.mean(-1, keepdims=True) - couplings.mean(-2, keepdims=True)
               + couplings.mean((-1, -2), keepdims=True))
    return np.sqrt((centred ** 2).sum((-1, -2)))


def attention_contacts(maps: np.ndarray) -> np.ndarray:
    """Causal attention [..., T = L, T] over inputs (start, x_0 .. x_{L-2}) -> scores [..., L, L].

    The query at position p predicts x_p and the key at position s holds x_{s-1}, so the weight of
    (p, s) is read as the pair (p, s - 1); then symmetrised and APC-corrected per map."""
    pairs = np.zeros(maps.shape, np.float64)
    pairs[..., :, :-1] = maps[..., :, 1:]  # pairs[p, i] = maps[p, i + 1], i < p
    return apc(symmetrise(pairs))


def family_attention(params: Any, cfg: ModelConfig, sequences: np.ndarray, chunk: int = 100) -> np.ndarray:
    """A family's sequences int [N, L] -> every head's contact scores [layers x heads, L, L]: the causal
    maps averaged over the sequences, then `attention_contacts`."""
    inputs = rows(list(sequences), sequences.shape[1])[0]  # [N, L]: START, x_0 .. x_{L-2}
    total = sum(np.asarray(attention_maps(params, cfg, inputs[s: s + chunk])).sum(axis=1)  # [layers, H, L, L]
                for s in range(0, len(inputs), chunk))
    return attention_contacts(total.reshape(-1, *total.shape[-2:]) / len(inputs))


def pairs(scores: np.ndarray) -> np.ndarray:
    """[..., L, L] -> [P, ...]: the values at the pairs i < j with j - i >= MIN_SEPARATION."""
    i, j = np.nonzero(np.triu(separation_mask(scores.shape[-1])))
    return np.moveaxis(scores[..., i, j], -1, 0)


def unpair(values: np.ndarray, length: int) -> np.ndarray:
    """[P] values at `pairs`' pairs -> a symmetric [L, L] map, zero elsewhere."""
    scores = np.zeros((length, length))
    scores[np.nonzero(np.triu(separation_mask(length)))] = values
    return symmetrise(scores)


def best_head(head_scores: list[np.ndarray], contacts: list[np.ndarray]) -> int:
    """The head whose scores [H, L, L] give the highest mean precision@L/5 over the (training) families."""
    return int(np.argmax(np.mean([[precision(s, c, len(c) // 5) for s in scores]
                                  for scores, c in zip(head_scores, contacts)], axis=0)))


def head_regression(head_scores: list[np.ndarray], contacts: list[np.ndarray]) -> Any:
    """scikit-learn's logistic regression (L1, as Rao et al.) of contact on every head's score at each pair
    (each head's scores standardised), fitted on the given (training) families."""
    from sklearn.linear_model import LogisticRegression  # the dev and notebooks extras
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    x = np.concatenate([pairs(s) for s in head_scores])
    y = np.concatenate([pairs(c) for c in contacts])
    return make_pipeline(StandardScaler(), LogisticRegression(C=0.15, l1_ratio=1.0, solver="liblinear")).fit(x, y)


def regression_scores(model: Any, head_scores: np.ndarray) -> np.ndarray:
    """A fitted `head_regression` applied to one family's scores [H, L, L] -> contact probabilities [L, L]."""
    return unpair(model.predict_proba(pairs(head_scores))[:, 1], head_scores.shape[-1])
