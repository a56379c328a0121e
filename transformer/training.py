"""Training: the loss, the optimizer, the device mesh and the jitted train and eval steps.

    state = create_state(cfg, optim, steps, seed, mesh)       # params + AdamW state, sharded
    step_fn = make_train_step(cfg, tx, mesh, grad_accum)      # jit, donated state
    state, metrics = step_fn(state, inputs [B, T], targets [B, T])

Parameters and optimizer state are placed by `state_sharding`: replicated for pure data
parallelism, or each array split over the 'fsdp' mesh axis (FSDP). The batch is split over both
axes. Everything is `jax.jit` with shardings; XLA inserts the collectives.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from transformer.config import ModelConfig
from transformer.model import Decoder

Array = jax.Array
BATCH_AXES = ("data", "fsdp")  # the batch is split over every device


@flax.struct.dataclass
class TrainState:
    """Everything a resumed run needs: step, params, optimizer state and the base PRNG key."""

    step: Array  # int32 scalar: optimizer steps taken
    params: Any
    opt_state: Any
    rng: Array  # uint32 [2]: raw base key; dropout at step s uses fold_in(rng, s)


# --- the loss --------------------------------------------------------------------------------


def cross_entropy(logits: Array, targets: Array) -> Array:
    """Mean next-token cross-entropy in nats, in float32. logits [B, T, V], targets [B, T]."""
    return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), targets).mean()


def loss_fn(params: Any, cfg: ModelConfig, inputs: Array, targets: Array, dropout_key: Array | None) -> Array:
    """The training objective: cross-entropy of the decoder's logits on [B, T] token windows."""
    deterministic = dropout_key is None or cfg.dropout == 0.0
    rngs = None if deterministic else {"dropout": dropout_key}
    logits, _ = Decoder(cfg).apply({"params": params}, inputs, deterministic=deterministic, rngs=rngs)
    return cross_entropy(logits, targets)


# --- the optimizer ---------------------------------------------------------------------------


def decay_mask(params: Any, decay_embeddings: bool = False) -> Any:
    """True for the weights AdamW decays: projection matrices (and embeddings if asked).

    Norm gains and biases are never decayed; matching by name, not by ndim, because scanned
    layers give every bias a leading layer axis.
    """

    def decays(path, _) -> bool:
        name = path[-1].key
        if name in ("embedding", "pos_embed"):
            return decay_embeddings
        return name in ("kernel", "k_up", "v_up")

    return jax.tree_util.tree_map_with_path(decays, params)


def make_schedule(optim: Mapping[str, Any], steps: int) -> optax.Schedule:
    """The learning rate at each step: linear warm-up from 0, cosine decay to min_lr_ratio x the peak
    over `optim.decay_steps` steps (0: all `steps`), then constant at that final rate.

    A run extended past its decay (train.steps raised, decay_steps kept) continues at the final rate.
    """
    decay_steps = optim.get("decay_steps", 0) or steps
    warmup = min(optim["warmup_steps"], max(decay_steps - 1, 0))
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=optim["learning_rate"],
        warmup_steps=warmup,
        decay_steps=max(decay_steps, warmup + 1),
        end_value=optim["learning_rate"] * optim["min_lr_ratio"],
    )


def make_optimizer(optim: Mapping[str, Any], steps: int) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """AdamW on `make_schedule`'s learning rate, with global-norm clipping and a weight-decay mask.

    optim: the config's `optim` fields (learning_rate, warmup_steps, decay_steps, min_lr_ratio, b1,
    b2, eps, weight_decay, decay_embeddings, grad_clip).
    """
    schedule = make_schedule(optim, steps)
    tx = optax.chain(
        optax.clip_by_global_norm(optim["grad_clip"]) if optim["grad_clip"] > 0 else optax.identity(),
        optax.adamw(
            schedule, b1=optim["b1"], b2=optim["b2"], eps=optim["eps"],
            weight_decay=optim["weight_decay"],
            mask=lambda p: decay_mask(p, optim["decay_embeddings"]),
        ),
    )
    return tx, schedule


# --- devices ---------------------------------------------------------------------------------


def make_mesh(data: int = -1, fsdp: int = 1, devices: list | None = None) -> Mesh:
    """A 2-D device mesh with axes ('data', 'fsdp'); data=-1 takes all remaining devices."""
    devices = jax.devices() if devices is None else devices
    n = len(devices)
    if fsdp < 1 or n % fsdp:
        raise ValueError(f"mesh.fsdp={fsdp} must divide the {n} available devices")
    if data == -1:
        data = n // fsdp
    if data * fsdp != n:
        raise ValueError(
            f"mesh.data={data} x mesh.fsdp={fsdp} = {data * fsdp} devices, but {n} are available; "
            "set mesh.data=-1 to use them all"
        )
    return Mesh(np.asarray(devices).reshape(data, fsdp), ("data", "fsdp"))


def _leaf_spec(x: Any, fsdp: int) -> P:
    """FSDP placement of one array: split its largest axis that the fsdp size divides."""
    shape = getattr(x, "shape", ())
    if fsdp == 1 or not shape or math.prod(shape) < 2**14:  # small arrays: not worth a collective
        return P()
    for axis in sorted(range(len(shape)), key=lambda a: -shape[a]):
        if shape[axis] % fsdp == 0:
            spec = [None] * len(shape)
            spec[axis] = "fsdp"
            return P(*spec)
    return P()


def state_sharding(state: Any, mesh: Mesh) -> Any:
    """NamedShardings for a state pytree: replicated, or FSDP-split over the 'fsdp' axis."""
    fsdp = mesh.shape["fsdp"]
    return jax.tree.map(lambda x: NamedSharding(mesh, _leaf_spec(x, fsdp)), state)


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """[B, T] batches: rows split over every device of the mesh."""
    return NamedSharding(mesh, P(BATCH_AXES))


# --- state and steps -------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnums=0)  # eager Flax init is slow; cfg is hashable
def init_params(cfg: ModelConfig, key: Array) -> Any:
    """Fresh float32 parameters for `cfg`."""
    return Decoder(cfg).init(key, jnp.zeros((1, min(8, cfg.max_seq_len)), jnp.int32))["params"]


def create_state(
    cfg: ModelConfig, tx: optax.GradientTransformation, seed: int, mesh: Mesh, params: Any | None = None
) -> TrainState:
    """A TrainState at step 0, created directly on the mesh with its shardings.

    params: start from these (e.g. imported weights) instead of a random init.
    """
    key = jax.random.key(seed)

    def build(params):
        params = init_params(cfg, jax.random.fold_in(key, 0)) if params is None else params
        return TrainState(
            step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
            rng=jax.random.key_data(jax.random.fold_in(key, 1)),
        )

    shardings = state_sharding(jax.eval_shape(build, params), mesh)
    return jax.jit(build, out_shardings=shardings)(params)


def make_train_step(cfg: ModelConfig, tx: optax.GradientTransformation, schedule: optax.Schedule,
                    mesh: Mesh, state: TrainState, grad_accum: int = 1):
    """The jitted step: (state, inputs [B, T], targets [B, T]) -> (state, metrics).

    With grad_accum = A, the batch is split into A micro-batches whose gradients are averaged
    (a lax.scan, so memory holds one micro-batch's activations). The state is donated: its
    buffers are reused for the new state.
    """

    def step(state: TrainState, inputs: Array, targets: Array):
        dropout_key = jax.random.fold_in(jax.random.wrap_key_data(state.rng), state.step)
        grad_fn = jax.value_and_grad(loss_fn)
        if grad_accum == 1:
            loss, grads = grad_fn(state.params, cfg, inputs, targets, dropout_key)
        else:
            micro = lambda x: x.reshape(grad_accum, -1, *x.shape[1:])  # noqa: E731

            def accumulate(carry, batch):
                i, (x, y) = batch
                loss, grads = grad_fn(state.params, cfg, x, y, jax.random.fold_in(dropout_key, i))
                return jax.tree.map(jnp.add, carry, (loss, grads)), None

            zeros = (jnp.zeros(()), jax.tree.map(jnp.zeros_like, state.params))
            (loss, grads), _ = jax.lax.scan(
                accumulate, zeros, (jnp.arange(grad_accum), (micro(inputs), micro(targets)))
            )
            loss, grads = jax.tree.map(lambda a: a / grad_accum, (loss, grads))
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics = {
            "loss": loss,
            "grad_norm": optax.tree.norm(grads),
            "param_norm": optax.tree.norm(params),  # a NaN here is caught before any save
            "learning_rate": schedule(state.step),
        }
        return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics

    shardings = state_sharding(state, mesh)
    data = batch_sharding(mesh)
    return jax.jit(step, in_shardings=(shardings, data, data), out_shardings=(shardings, None),
                   donate_argnums=0)


def make_eval_step(cfg: ModelConfig, mesh: Mesh, state: TrainState):
    """The jitted eval step: (params, inputs, targets) -> mean cross-entropy (no dropout)."""
    data = batch_sharding(mesh)
    return jax.jit(
        lambda params, x, y: loss_fn(params, cfg, x, y, None),
        in_shardings=(state_sharding(state.params, mesh), data, data),
    )


def flops_per_token(cfg: ModelConfig, num_params: int, seq_len: int) -> float:
    """Training FLOPs per token, 6N + 12 L T d (forward + backward; N without position tables).

    6N counts the matrix multiplies of every weight (2 FLOPs per multiply-add, x3 for backward);
    12 L T d counts the attention scores and weighted sums.
    """
    n = num_params - (cfg.max_seq_len * cfg.d_model if cfg.position == "learned" else 0)
    return 6 * n + 12 * cfg.num_layers * seq_len * cfg.d_model
