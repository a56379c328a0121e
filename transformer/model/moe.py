"""A mixture-of-experts MLP (Mixtral, Qwen3-MoE): E SwiGLU experts and a router that sends each token
to k of them, in place of the block's MLP when cfg.num_experts = E > 0.

    p = softmax(W_r x)                               router probabilities [B, T, E]
    w_e = p_e if e is among the k largest, else 0    (renormalize_top_k: / the k chosen's sum, Mixtral)
    y = sum_e w_e W_out,e (silu(W_gate,e x) * W_up,e x)

Dispatch: a dense einsum over all E experts, then the weights w zero the unchosen. It computes E / k
times the active FLOPs, but it is one batched matmul per projection (no gather, no capacity, no token
dropped), exactly the routed function, differentiable everywhere, and it shards over an `experts` axis
like any other dimension; for the few experts of a model trained here that is the fast form on a CPU.
A capacity-based gather would pay off with many experts on an accelerator.

Balance: each call sows, under ROUTER_STATS, the load f_e (the share of tokens sent to expert e; the
f_e sum to k) and the Switch / Mixtral balancing loss E sum_e f_e P_e (P_e: the mean of p_e), which
training.loss adds to the loss (cfg.load_balance_coef). The DeepSeek-V3 form (shared experts, sigmoid
scores, bias balancing) is not implemented.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer.model.config import ModelConfig
from transformer.model.linear import Linear, dense, dense_init
from transformer.model.points import point

Array = jax.Array
ROUTER_STATS = "router_stats"  # the collection of each MoE layer's load [E] and balancing loss


def routing_weights(logits: Array, k: int, renormalize: bool) -> Array:
    """Router logits [B, T, E] -> weights [B, T, E] float32: the softmax's k largest probabilities,
    0 for the other experts; `renormalize`: divided by their sum (a softmax over the chosen)."""
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    _, chosen = jax.lax.top_k(probs, k)  # [B, T, k]
    weights = probs * jnp.sum(jax.nn.one_hot(chosen, probs.shape[-1], dtype=probs.dtype), axis=-2)
    return weights / jnp.sum(weights, axis=-1, keepdims=True) if renormalize else weights


class MoE(nn.Module):
    """x [B, T, D] -> [B, T, D]: the weighted sum of the experts each token is routed to (see above)."""

    cfg: ModelConfig

    @nn.compact
    def __call__(self, x: Array) -> Array:
        cfg = self.cfg
        e, f = cfg.num_experts, cfg.mlp_dim
        logits = point(self, "router_logits", dense(cfg, e, "router", use_bias=False)(x).astype(jnp.float32))
        weights = point(self, "expert_weights", routing_weights(logits, cfg.experts_per_token, cfg.renormalize_top_k))
        gate = dense(cfg, (e, f), "expert_gate", use_bias=False)(x)  # [B, T, E, F]
        h = nn.silu(gate) * dense(cfg, (e, f), "expert_up", use_bias=False)(x)
        h = nn.with_logical_constraint(h, ("batch", "length", "experts", "mlp"))
        h = h * weights[..., None].astype(h.dtype)  # the unchosen experts' rows are 0
        out = Linear(cfg.d_model, in_axes=2, use_bias=False, dtype=cfg.dtype, kernel_init=dense_init(cfg, True),
                     name="expert_out")(h)  # W_out [D, E, F]: the sum over experts and F in one product
        chosen = (weights > 0).astype(jnp.float32)
        load = jnp.mean(chosen, axis=(0, 1))  # f_e [E]
        self.sow(ROUTER_STATS, "load", load)
        self.sow(ROUTER_STATS, "balance", e * jnp.sum(load * jnp.mean(jax.nn.softmax(logits), axis=(0, 1))))
        return point(self, "output", out)  # mlp.out [B, T, D]


def router_stats(stats: dict, num_layers: int) -> tuple[Array, Array]:
    """The ROUTER_STATS collection of a forward pass -> (load [L, E], the balancing loss averaged over
    the L layers), from either layer layout (a scanned stack sows [L, ...] once)."""
    layers = [stats["layers"]] if "layers" in stats else [stats[f"layers_{i}"] for i in range(num_layers)]
    load = jnp.concatenate([layer["mlp"]["load"][0].reshape(-1, layer["mlp"]["load"][0].shape[-1]) for layer in layers])
    return load, jnp.mean(jnp.concatenate([jnp.reshape(layer["mlp"]["balance"][0], -1) for layer in layers]))
