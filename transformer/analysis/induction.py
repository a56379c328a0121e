"""Induction and previous-token heads, scored on repeated random tokens (Olsson et al. 2022).

    tokens = repeated_tokens(jax.random.key(0), batch=16, n=32, vocab_size=cfg.vocab_size)   # [B, 2n]
    induction_scores(params, cfg, tokens)        # [L, H]
    previous_token_scores(params, cfg, tokens)   # [L, H]
    repeated_loss(params, cfg, tokens)           # mean loss on the first half and on the repeat

A sequence of n random tokens followed by the same n again: in the repeat, the token at t also sat at
t - n, and an induction head attends from t to the token after that earlier copy, t - n + 1 (whose
value is the next token: it predicts it). The induction score of a head is its mean attention weight
on t - n + 1 over the repeat's queries; the previous-token score its mean weight on t - 1 over all
queries t >= 1. A head that attends uniformly scores about the mean of 1 / (t + 1) over those
queries (`uniform_score`), the chance line; random tokens carry no other structure to attend to.
A model that has induction heads predicts the repeat: its loss there falls far below the first half's.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from transformer.analysis.capture import attention_maps
from transformer.model.config import ModelConfig
from transformer.model.edits import Edit
from transformer.model.edits import run as run_edited

Array = jax.Array


def repeated_tokens(key: Array, batch: int, n: int, vocab_size: int, first: int | None = None) -> Array:
    """[B, 2n] int32: n random ids in [0, vocab_size), then the same n again; with `first`, a fixed
    token before them ([B, 2n + 1]; e.g. the start token a model was trained with)."""
    half = jax.random.randint(key, (batch, n), 0, vocab_size, dtype=jnp.int32)
    tokens = jnp.concatenate([half, half], axis=1)
    return tokens if first is None else jnp.concatenate([jnp.full((batch, 1), first, jnp.int32), tokens], axis=1)


def induction_score(pattern: Array, n: int, registers: int = 0) -> Array:
    """From attention weights [L, B, H, T, S] (S: R registers first, then the T tokens, then perhaps a
    sink) over a sequence whose last 2n tokens are n tokens repeated: each head's mean weight from the
    repeat's queries t to t - n + 1 -> [L, H]."""
    t = pattern.shape[3]
    queries = np.arange(t - n, t)  # the repeat
    return pattern[:, :, :, queries, registers + queries - n + 1].mean(axis=(1, 3))


def previous_token_score(pattern: Array, registers: int = 0) -> Array:
    """Each head's mean weight from query t to key t - 1 over t >= 1 -> [L, H] (pattern as above)."""
    queries = np.arange(1, pattern.shape[3])
    return pattern[:, :, :, queries, registers + queries - 1].mean(axis=(1, 3))


def uniform_score(queries: np.ndarray, extra_keys: int = 0) -> float:
    """A head's score if it attended uniformly over the keys it sees: the mean of 1 / (q + 1 + extra)
    over the query positions q scored (extra: the registers and the sink, also seen by every query).
    For the induction score of T tokens ending in a repeat of n: queries = np.arange(T - n, T)."""
    return float(np.mean(1.0 / (np.asarray(queries) + 1 + extra_keys)))


def induction_scores(params: Any, cfg: ModelConfig, tokens: Array, edits: list[Edit] = ()) -> Array:
    """Every head's induction score on `tokens` [B, (1 +) 2n] from `repeated_tokens` -> [L, H]."""
    n = tokens.shape[1] // 2
    return induction_score(attention_maps(params, cfg, tokens, edits), n, cfg.num_registers)


def previous_token_scores(params: Any, cfg: ModelConfig, tokens: Array, edits: list[Edit] = ()) -> Array:
    """Every head's previous-token score on `tokens` [B, T] -> [L, H]."""
    return previous_token_score(attention_maps(params, cfg, tokens, edits), cfg.num_registers)


def repeated_loss(params: Any, cfg: ModelConfig, tokens: Array, edits: list[Edit] = ()) -> tuple[Array, Array]:
    """The mean next-token loss (nats) on the first half of the repeated tokens and on the repeat:
    predictions of tokens 1..n-1 of the first copy, and of the n - 1 tokens of the repeat after its
    first (which the first copy cannot give away: it follows a random token)."""
    logits, _ = run_edited(params, cfg, tokens[:, :-1], edits)
    loss = -jnp.take_along_axis(jax.nn.log_softmax(logits), tokens[:, 1:, None], axis=-1)[..., 0]  # [B, T - 1]
    n = tokens.shape[1] // 2
    start = tokens.shape[1] - 2 * n  # 1 with a leading fixed token
    first = loss[:, start: start + n - 1]  # predicting tokens 1..n-1 of the first copy
    repeat = loss[:, start + n:]  # predicting tokens 1..n-1 of the repeat
    return first.mean(), repeat.mean()
