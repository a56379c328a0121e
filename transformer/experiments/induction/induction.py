"""Induction and previous-token heads, scored on repeated random tokens (Olsson et al. 2022).

    tokens = repeated_tokens(jax.random.key(0), batch=16, n=32, vocab_size=cfg.vocab_size)   # [B, 2n]
    induction_scores(params, cfg, tokens)        # [L, H]
    previous_token_scores(params, cfg, tokens)   # [L, H]
    repeated_loss(params, cfg, tokens)           # mean loss on the first half and on the repeat

In the repeat the token at t also sat at t - n, and an induction head attends from t to t - n + 1,
whose value is the next token; random tokens carry nothing else to attend to. A model with induction
heads predicts the repeat: its loss there falls far below the first half's.
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
from transformer.training.eval_metrics import EvalMetric

Array = jax.Array


def repeated_tokens(key: Array, batch: int, n: int, vocab_size: int, first: int | None = None,
                    ids: Array | None = None) -> Array:
    """n random ids in [0, vocab_size) (or drawn from `ids`), then the same n again: int32 [B, 2n]; with
    `first` (e.g. the start token a model was trained with) that token before them: [B, 2n + 1]."""
    if ids is None:
        half = jax.random.randint(key, (batch, n), 0, vocab_size, dtype=jnp.int32)
    else:
        half = jax.random.choice(key, jnp.asarray(ids, jnp.int32), (batch, n))
    tokens = jnp.concatenate([half, half], axis=1)
    return tokens if first is None else jnp.concatenate([jnp.full((batch, 1), first, jnp.int32), tokens], axis=1)


def induction_score(pattern: Array, n: int, registers: int = 0) -> Array:
    """Each head's mean weight [L, H] from the repeat's queries t to t - n + 1, from pattern [L, B, H, T, S]
    (S: the R registers, the T tokens, perhaps a sink) of tokens ending in n tokens repeated."""
    t = pattern.shape[3]
    queries = np.arange(t - n, t)  # the repeat
    return pattern[:, :, :, queries, registers + queries - n + 1].mean(axis=(1, 3))


def previous_token_score(pattern: Array, registers: int = 0) -> Array:
    """Each head's mean weight from query t to key t - 1 over t >= 1 -> [L, H] (pattern as above)."""
    queries = np.arange(1, pattern.shape[3])
    return pattern[:, :, :, queries, registers + queries - 1].mean(axis=(1, 3))


def uniform_score(queries: np.ndarray, extra_keys: int = 0) -> float:
    """The score of a head attending uniformly over what it sees: the mean of 1 / (q + 1 + extra_keys) over
    the queries q scored (extra: registers and sink; induction on a repeat of n: np.arange(T - n, T))."""
    return float(np.mean(1.0 / (np.asarray(queries) + 1 + extra_keys)))


def induction_scores(params: Any, cfg: ModelConfig, tokens: Array, edits: list[Edit] = ()) -> Array:
    """Every head's induction score on `tokens` [B, (1 +) 2n] from `repeated_tokens` -> [L, H]."""
    n = tokens.shape[1] // 2
    return induction_score(attention_maps(params, cfg, tokens, edits), n, cfg.num_registers)


def previous_token_scores(params: Any, cfg: ModelConfig, tokens: Array, edits: list[Edit] = ()) -> Array:
    """Every head's previous-token score on `tokens` [B, T] -> [L, H]."""
    return previous_token_score(attention_maps(params, cfg, tokens, edits), cfg.num_registers)


def repeated_loss(params: Any, cfg: ModelConfig, tokens: Array, edits: list[Edit] = ()) -> tuple[Array, Array]:
    """The mean next-token loss (nats) predicting tokens 1..n-1 of the first copy and of the repeat (the
    repeat's token 0 follows a random token: the first copy cannot give it away)."""
    logits, _ = run_edited(params, cfg, tokens[:, :-1], edits)
    loss = -jnp.take_along_axis(jax.nn.log_softmax(logits), tokens[:, 1:, None], axis=-1)[..., 0]  # [B, T - 1]
    n = tokens.shape[1] // 2
    start = tokens.shape[1] - 2 * n  # 1 with a leading fixed token
    first = loss[:, start: start + n - 1]  # predicting tokens 1..n-1 of the first copy
    repeat = loss[:, start + n:]  # predicting tokens 1..n-1 of the repeat
    return first.mean(), repeat.mean()


# --- The loop's metric (train.eval_induction=True) ------------------------------------------------

METRIC_BATCH, METRIC_N = 16, 32  # 16 sequences of 32 tokens, repeated


def induction_measure(cfg: ModelConfig, inputs: Array):
    """params -> {scores [L, H], first, repeat losses} on METRIC_BATCH sequences of min(METRIC_N, T / 2)
    tokens drawn once from the ids of `inputs` (the first validation batch: the corpus's alphabet)."""
    n = min(METRIC_N, cfg.max_seq_len // 2)
    tokens = repeated_tokens(jax.random.key(0), METRIC_BATCH, n, cfg.vocab_size, ids=np.unique(np.asarray(inputs)))

    def measure(params: Any, x: Array, y: Array) -> dict[str, Array]:
        first, repeat = repeated_loss(params, cfg, tokens)
        return {"scores": induction_scores(params, cfg, tokens), "first": first, "repeat": repeat}

    return measure


def induction_report(cfg: ModelConfig, measures: list[dict]) -> dict[str, float]:
    """{induction_score_max, induction_score_l{l}h{h}, ..., repeat_loss, first_half_loss}."""
    scores = np.asarray(measures[0]["scores"])
    row = {"induction_score_max": float(scores.max()), "first_half_loss": float(measures[0]["first"]),
           "repeat_loss": float(measures[0]["repeat"])}
    row.update({f"induction_score_l{l}h{h}": float(scores[l, h]) for l, h in np.ndindex(scores.shape)})
    return row


INDUCTION = EvalMetric("induction", induction_measure, induction_report, first_batch=True)
