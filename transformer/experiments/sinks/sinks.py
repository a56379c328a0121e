"""Attention sinks, measured: a head with nothing to attend to parks on the first token (a parking spot,
not importance), unless a sink logit or registers give it somewhere else. For text tokens [B, T]:

    shares = attention_shares(params, cfg, tokens)       # [L, H] each: first token, registers, sink
    logits = mean_logit_map(params, cfg, tokens)         # [L, H, T, T], NaN above the diagonal

Shares are means over the batch and the rows t >= 1 (row 0 sees nothing but the first token)."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from transformer.analysis.attention_shares import AttentionShares, shares_from_weights
from transformer.analysis.capture import attention_maps
from transformer.model.config import ModelConfig
from transformer.model.edits import ablate_heads
from transformer.training.eval_metrics import EvalMetric

Array = jax.Array


def attention_shares(params: Any, cfg: ModelConfig, tokens: Array, head_mask: Array | None = None) -> AttentionShares:
    """The mean shares [L, H] on the first token of tokens [B, T >= 2], the registers and the sink, the
    heads of head_mask [L, H] switched off (0) first."""
    _check_tokens(tokens)
    edits = [] if head_mask is None else [ablate_heads(cfg, head_mask)]
    return jax.tree.map(np.asarray, shares_from_weights(cfg, _maps(params, cfg, tokens, edits)))


def mean_logit_map(params: Any, cfg: ModelConfig, tokens: Array) -> np.ndarray:
    """The pre-softmax logit q_t . k_s / sqrt(d_h) between the real tokens of tokens [B, T], averaged over
    the batch: float32 [L, H, T, T], NaN above the diagonal (keys a query cannot see)."""
    _check_tokens(tokens)
    logits = _maps(params, cfg, tokens, scores=True)  # [L, B, H, T, R + T (+1)]
    t, r = tokens.shape[1], cfg.num_registers
    mean = np.asarray(logits[..., r: r + t].mean(axis=1))  # [L, H, T, T]
    return np.where(np.tril(np.ones((t, t), bool)), mean, np.nan)


def uniform_first_token_share(seq_len: int, num_registers: int = 0, attention_sink: bool = False) -> float:
    """The first-token share of a head attending uniformly to what it sees (tokens, registers, sink) over
    rows t >= 1: the mean of 1 / (t + 1 + R (+ 1)). A share well above it favours the first token."""
    t = np.arange(1, seq_len)
    return float((1.0 / (t + 1 + num_registers + attention_sink)).mean())


def share_metrics(cfg: ModelConfig, shares: AttentionShares) -> dict[str, float]:
    """Metric row entries: first_token_share (the mean over heads), first_token_share_layer<l>, and the
    registers' and sink's mean shares when the model has them."""
    first = np.asarray(shares.first_token)  # [L, H]
    row = {"first_token_share": float(first.mean())}
    row.update({f"first_token_share_layer{i}": float(v) for i, v in enumerate(first.mean(axis=1))})
    if cfg.num_registers:
        row["register_share"] = float(np.mean(shares.registers))
    if cfg.attention_sink:
        row["sink_share"] = float(np.mean(shares.sink))
    return row


_maps = jax.jit(attention_maps, static_argnames=("cfg", "scores"))  # [L, B, H, T, S_total] weights (or logits)


def _check_tokens(tokens: Array) -> None:
    if np.ndim(tokens) != 2 or np.shape(tokens)[1] < 2:
        raise ValueError(f"tokens must be [B, T] with T >= 2 (rows t >= 1 are measured), got shape "
                         f"{np.shape(tokens)}; pass a batch of windows of text")


def shares_measure(cfg: ModelConfig, inputs: Array):
    """The loop's measure: (params, inputs [B, T], targets) -> AttentionShares [L, H] of one forward pass."""
    return lambda params, x, y: shares_from_weights(cfg, attention_maps(params, cfg, x))


# train.eval_attention_shares=True: the shares of the first validation batch
ATTENTION_SHARES = EvalMetric("attention_shares", shares_measure, lambda cfg, shares: share_metrics(cfg, shares[0]),
                              first_batch=True)
