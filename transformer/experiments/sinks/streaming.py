"""Reading past the context: the loss of a long text through a rolling KV cache (StreamingLLM).

A model trained on windows of C = max_seq_len tokens reads on at constant memory through a rolling cache
(`kv_cache.init_rolling_cache`): the first S tokens (sinks) and the last C - S. Xiao et al. (2023): a pure
window (S = 0) fails once the first tokens leave, S = 4 is enough (models park attention on them).

    nll = rolling_nll(params, cfg, tokens, sinks=4)   # tokens [B, N], N may be >> C -> nll [B, N - 1]

nll[:, t] = -log p(tokens[:, t + 1] | tokens 0..t through the rolling cache): the plain forward's for
t < C; past it, what the model makes of the sinks and the last C - S tokens (registers stay for good)."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from transformer.model.config import ModelConfig
from transformer.model.decoder import Decoder
from transformer.model.kv_cache import init_rolling_cache
from transformer.model.param_tree import unrolled

Array = jax.Array


@functools.partial(jax.jit, static_argnames=("cfg", "sinks"))
def rolling_nll(params: Any, cfg: ModelConfig, tokens: Array, sinks: int) -> Array:
    """[B, N] int32 tokens -> [B, N - 1] float32 nats: each next token's loss read through a rolling
    cache that keeps the first `sinks` tokens. The first min(N, C) tokens go in as one call (the
    plain forward), the rest one token per `lax.scan` step, as a decoder would read them."""
    params, cfg = unrolled(params, cfg)  # a ring per layer: the stack does not scan
    model = Decoder(cfg)
    batch, n = tokens.shape
    first = min(n, cfg.max_seq_len)
    positions = jnp.broadcast_to(jnp.arange(first, dtype=jnp.int32), (batch, first))
    cache = init_rolling_cache(cfg, batch, sinks)
    logits, cache = model.apply({"params": params}, tokens[:, :first], positions, cache)  # [B, C, V]
    log_probs = [jax.nn.log_softmax(logits[:, :-1] if first == n else logits)]

    def step(cache, t):  # reads token t at position t: the log-probabilities of token t + 1
        token = jax.lax.dynamic_slice_in_dim(tokens, t, 1, axis=1)  # [B, 1]
        logits, cache = model.apply({"params": params}, token, jnp.full((batch, 1), t, jnp.int32), cache)
        return cache, jax.nn.log_softmax(logits[:, 0])  # [B, V]

    if n - 1 > first:  # tokens past the first call's
        _, later = jax.lax.scan(step, cache, jnp.arange(first, n - 1, dtype=jnp.int32))  # [N - 1 - C, B, V]
        log_probs.append(jnp.moveaxis(later, 0, 1))
    log_probs = jnp.concatenate(log_probs, axis=1)  # [B, N - 1, V]
    return -jnp.take_along_axis(log_probs, tokens[:, 1:, None], axis=2)[..., 0]
