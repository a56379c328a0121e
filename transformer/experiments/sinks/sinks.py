"""Attention sinks, measured: where each head's attention goes beyond the text, and its mean logits.

Every softmax row hands out all of its attention, and every row can see the first token, so a head
with nothing to attend to can park its attention there: an *attention sink* (a big a_t0 is a
parking spot, not importance). The model's options give that attention somewhere else to go: a
learned sink logit (cfg.attention_sink, a column that meets no value) or register tokens
(cfg.num_registers). For a batch of text:

    shares = attention_shares(params, cfg, tokens)       # [L, H] each: first token, registers, sink
    logits = mean_logit_map(params, cfg, tokens)         # [L, H, T, T], NaN above the diagonal

Shares are means over the batch and over the query rows t >= 1: row 0 sees only the first token
(and the registers and the sink), so its share there says nothing about a sink.

ATTENTION_SHARES is the training loop's evaluation metric 'attention_shares', which a run enables with
train.eval_attention_shares=True (on the first validation batch).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import numpy as np

from transformer.analysis.capture import attention_maps
from transformer.model.config import ModelConfig
from transformer.model.edits import ablate_heads
from transformer.analysis.attention_shares import AttentionShares, shares_from_weights
from transformer.training.eval_metrics import EvalMetric

Array = jax.Array


def attention_shares(params: Any, cfg: ModelConfig, tokens: Array, head_mask: Array | None = None) -> AttentionShares:
    """Each layer's and head's mean attention share on the first token, the registers and the sink.

    Args:
      params: the Decoder's parameters. tokens: [B, T] int (T >= 2), each row a window of text whose
        first token is the one measured. head_mask: optional [L, H], heads to switch off (0) first
        (`edits.ablate_heads`).
    Returns:
      AttentionShares of NumPy arrays [L, H].
    """
    _check_tokens(tokens)
    weights = _maps(params, cfg, tokens, head_mask, False)
    return AttentionShares(**{k: np.asarray(v) for k, v in dataclasses.asdict(shares_from_weights(cfg, weights)).items()})


def mean_logit_map(params: Any, cfg: ModelConfig, tokens: Array) -> np.ndarray:
    """The mean pre-softmax attention logit q_t . k_s / sqrt(d_h) between real tokens, per layer and head.

    Args:
      params: the Decoder's parameters. tokens: [B, T] int.
    Returns:
      [L, H, T, T] float32, the mean over the batch; NaN above the diagonal (keys a query cannot see).
    """
    _check_tokens(tokens)
    logits = _maps(params, cfg, tokens, None, True)  # [L, B, H, T, R + T (+1)]
    t, r = tokens.shape[1], cfg.num_registers
    mean = np.asarray(logits[..., r : r + t].mean(axis=1))  # [L, H, T, T]
    return np.where(np.tril(np.ones((t, t), bool)), mean, np.nan)


def uniform_first_token_share(seq_len: int, num_registers: int = 0, attention_sink: bool = False) -> float:
    """The first-token share of a head that attends uniformly to what it sees (its tokens, the R
    registers, the sink), over rows t >= 1: the mean of 1 / (t + 1 + R (+ 1)). A measured share well
    above it is a head that favours the first token."""
    t = np.arange(1, seq_len)
    return float((1.0 / (t + 1 + num_registers + attention_sink)).mean())


def share_metrics(cfg: ModelConfig, shares: AttentionShares) -> dict[str, float]:
    """Shares as metric rows hold them: the first-token share averaged over heads, overall
    (first_token_share) and per layer (first_token_share_layer<l>), and the registers' and the
    sink's shares averaged over layers and heads when the model has them."""
    first = np.asarray(shares.first_token)  # [L, H]
    row = {"first_token_share": float(first.mean())}
    row.update({f"first_token_share_layer{i}": float(v) for i, v in enumerate(first.mean(axis=1))})
    if cfg.num_registers:
        row["register_share"] = float(np.mean(shares.registers))
    if cfg.attention_sink:
        row["sink_share"] = float(np.mean(shares.sink))
    return row


@functools.partial(jax.jit, static_argnames=("cfg", "scores"))
def _maps(params: Any, cfg: ModelConfig, tokens: Array, head_mask: Array | None, scores: bool) -> Array:
    """Every layer's attention weights (or, with `scores`, pre-softmax logits) [L, B, H, T, S_total],
    with the heads of `head_mask` switched off."""
    edits = [] if head_mask is None else [ablate_heads(cfg, head_mask)]
    return attention_maps(params, cfg, tokens, edits, scores=scores)


def _check_tokens(tokens: Array) -> None:
    if np.ndim(tokens) != 2 or np.shape(tokens)[1] < 2:
        raise ValueError(
            f"tokens must be [B, T] with T >= 2 (rows t >= 1 are measured), got shape {np.shape(tokens)}; "
            "pass a batch of windows of text"
        )


def shares_measure(cfg: ModelConfig, inputs: Array):
    """The loop's measure: (params, inputs [B, T], targets) -> AttentionShares of [L, H] arrays (first
    token, registers, sink): one forward pass with the weights."""
    return lambda params, x, y: shares_from_weights(cfg, attention_maps(params, cfg, x))


ATTENTION_SHARES = EvalMetric("attention_shares", shares_measure, lambda cfg, shares: share_metrics(cfg, shares[0]),
                              first_batch=True)
