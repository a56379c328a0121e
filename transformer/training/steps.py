"""The train state, its creation on the mesh, and the jitted train and eval steps (`sharded_jit`:
XLA inserts the collectives).

    state = create_state(cfg, tx, seed, mesh, rules=rules)        # params + optimizer state, sharded
    step = make_train_step(cfg, tx, rates, mesh, state, rules=rules)   # jit, donated state
    state, metrics = step(state, inputs [B, T], targets [B, T])
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh

from transformer.model.config import ModelConfig
from transformer.training.loss import loss_fn, objective
from transformer.model.decoder import Decoder, example_input
from transformer.training.sharding import Rules, batch_sharding, make_rules, sharded_jit, state_sharding

Array = jax.Array


@flax.struct.dataclass
class TrainState:
    """Everything a resumed run needs: step, params, optimizer state and the base PRNG key."""

    step: Array  # int32 scalar: optimizer steps taken
    params: Any
    opt_state: Any
    rng: Array  # uint32 [2]: raw base key; dropout at step s uses fold_in(rng, s)


@functools.partial(jax.jit, static_argnums=0)  # eager Flax init is slow; cfg is hashable
def init_params(cfg: ModelConfig, key: Array) -> Any:
    """Fresh float32 parameters for `cfg`."""
    return Decoder(cfg).init(key, example_input(cfg, min(8, cfg.max_seq_len)))["params"]


def create_state(cfg: ModelConfig, tx: optax.GradientTransformation, seed: int, mesh: Mesh, params: Any | None = None,
                 rules: Rules | None = None) -> TrainState:
    """A TrainState at step 0, created on the mesh with its shardings; from `params` (imported
    weights) if given, else a random init."""
    key = jax.random.key(seed)

    def build(params):
        params = init_params(cfg, jax.random.fold_in(key, 0)) if params is None else params
        return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                          rng=jax.random.key_data(jax.random.fold_in(key, 1)))

    rules = make_rules(cfg, mesh) if rules is None else rules
    shardings = state_sharding(jax.eval_shape(build, params), mesh, rules)
    return jax.jit(build, out_shardings=shardings)(params)


def train_step(cfg: ModelConfig, tx: optax.GradientTransformation, rates: Mapping[str, optax.Schedule],
               grad_accum: int = 1):
    """The step, not yet compiled: (state, inputs [B, T], targets [B, T]) -> (state, metrics).
    rates: {metric name: schedule} (`learning_rates`), logged per step. grad_accum = A averages the
    gradients of A micro-batches in a lax.scan (one micro-batch's activations in memory)."""

    def step(state: TrainState, inputs: Array, targets: Array):
        dropout_key = jax.random.fold_in(jax.random.wrap_key_data(state.rng), state.step)
        grad_fn = jax.value_and_grad(objective, has_aux=True)  # ((loss, its parts: a MoE's load), grads)
        if grad_accum == 1:
            (loss, parts), grads = grad_fn(state.params, cfg, inputs, targets, dropout_key)
        else:
            micro = lambda x: x.reshape(grad_accum, -1, *x.shape[1:])  # noqa: E731

            def accumulate(carry, batch):
                i, (x, y) = batch
                out = grad_fn(state.params, cfg, x, y, jax.random.fold_in(dropout_key, i))
                return jax.tree.map(jnp.add, carry, out), None

            steps = (jnp.arange(grad_accum), (micro(inputs), micro(targets)))  # (i, micro-batch i) for each i
            shapes = jax.eval_shape(lambda: grad_fn(state.params, cfg, micro(inputs)[0], micro(targets)[0], dropout_key))
            zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)  # ((loss, parts), grads) of 0
            ((loss, parts), grads), _ = jax.lax.scan(accumulate, zeros, steps)
            loss, parts, grads = jax.tree.map(lambda a: a / grad_accum, (loss, parts, grads))
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics = {"loss": loss, "grad_norm": optax.tree.norm(grads),
                   "param_norm": optax.tree.norm(params),  # a NaN here is caught before any save
                   **parts, **{name: rate(state.step) for name, rate in rates.items()}}
        return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics

    return step


def eval_step(cfg: ModelConfig):
    """The eval step, not yet compiled: (params, inputs [B, T], targets [B, T]) -> mean cross-entropy (no dropout)."""
    return lambda params, inputs, targets: loss_fn(params, cfg, inputs, targets, None)


def make_train_step(cfg: ModelConfig, tx: optax.GradientTransformation,
                    schedule: optax.Schedule | Mapping[str, optax.Schedule], mesh: Mesh, state: TrainState,
                    grad_accum: int = 1, rules: Rules | None = None):
    """`train_step` jitted on the mesh, the state donated; schedule: the learning rate, or {metric name: schedule}."""
    rules = make_rules(cfg, mesh) if rules is None else rules
    rates = schedule if isinstance(schedule, Mapping) else {"learning_rate": schedule}
    shardings, data = state_sharding(state, mesh, rules), batch_sharding(mesh, rules)
    return sharded_jit(train_step(cfg, tx, rates, grad_accum), mesh, rules, (shardings, data, data), (shardings, None),
                       donate_argnums=(0,))


def make_eval_step(cfg: ModelConfig, mesh: Mesh, state: TrainState, rules: Rules | None = None):
    """`eval_step` jitted on the mesh."""
    rules = make_rules(cfg, mesh) if rules is None else rules
    data = batch_sharding(mesh, rules)
    return sharded_jit(eval_step(cfg), mesh, rules, (state_sharding(state.params, mesh, rules), data, data))


def flops_per_token(cfg: ModelConfig, num_params: int, seq_len: int) -> float:
    """Training FLOPs per token, 6N + 12 L T d: every weight's multiply-add (2 FLOPs, x3 with the
    backward pass; N without position tables), and the attention scores and weighted sums."""
    n = num_params - (cfg.max_seq_len * cfg.d_model if cfg.position == "learned" else 0)
    return 6 * n + 12 * cfg.num_layers * seq_len * cfg.d_model
