"""The optimizer: AdamW, or Muon on the layers' matrices with AdamW on the rest; a warm-up + cosine
or warm-up / stable / decay learning-rate schedule; global-norm clipping.

    tx, schedule = make_optimizer(config.optim, steps)   # an optax transformation, step -> lr
    lr = schedule(step)                                   # float32 scalar (optim.learning_rate's)
    rates = learning_rates(config.optim, steps)           # {metric name: schedule}, for the log

optim.name = 'adamw': AdamW on every parameter. Weight decay applies to the projection matrices only
(`decay_mask`: a pytree of bools shaped like the params), not to norm gains, biases or (unless asked)
embeddings.

optim.name = 'muon': Muon (optax.contrib's scale_by_muon: Nesterov momentum orthogonalised by
Newton-Schulz iterations; then `scale_by_width`) on every projection matrix inside the layers, and the same
AdamW as above on the rest (embeddings, positions, an untied head, norms, biases, registers, sinks);
`muon_dimension_numbers` routes each parameter by its path. Each matrix is orthogonalised as the one
linear map it is: a per-head kernel W_q [H, K, D] as the [H*K, D] matrix, W_o [D, H, K] as [D, H*K]
(as modded-nanogpt treats its whole q/k/v/o matrices: the update's spectral norm is that of the map
the layer applies, not of each head's slice). A scanned stack's leading L axis is a batch axis: each
layer's matrix is orthogonalised on its own. Scale: optax's default, Keller Jordan's
sqrt(max(1, out / in)) on the orthogonalised update (so optim.muon_learning_rate ~0.02 as in
modded-nanogpt, not an AdamW-matched rate). Both parts follow one schedule shape, each from its own
peak (optim.learning_rate for AdamW, optim.muon_learning_rate for Muon).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

import jax
import optax
from optax.contrib import MuonDimensionNumbers, scale_by_muon

OPTIMIZERS = ("adamw", "muon")
SCHEDULES = ("cosine", "wsd")
# The projection matrices, by parameter name: Linear's `kernel` and MLA's W_UK, W_UV.
MATRICES = ("kernel", "k_up", "v_up")
# How many trailing axes of a matrix are its input (Linear's in_axes): W_o [D, H, Kv] reads [H, Kv];
# every other matrix reads its last axis (W_UK [H, K, C] and W_UV read the latent C).
IN_AXES = {"o": 2}


def decay_mask(params: Any, decay_embeddings: bool = False) -> Any:
    """True for the weights AdamW decays: projection matrices (and embeddings if asked).

    Norm gains and biases are never decayed; matching by name, not by ndim, because scanned
    layers give every bias a leading layer axis.
    """

    def decays(path, _) -> bool:
        name = path[-1].key
        if name in ("embedding", "pos_embed"):
            return decay_embeddings
        return name in MATRICES

    return jax.tree_util.tree_map_with_path(decays, params)


def muon_dimension_numbers(params: Any) -> Any:
    """For each parameter, how Muon reads it as a matrix, or None for a parameter AdamW updates.

    Every matrix inside the layers (under `layers`, scanned, or `layers_i`) gets MuonDimensionNumbers
    with its input axes (IN_AXES) as the reduction axes and the axes before them as the output axes,
    counted from the end so that a scanned stack's leading L axis is a batch axis. The token
    embedding, position table, untied head, norms, biases, registers and sinks get None.
    `params` may be any tree shaped like the parameters (also optax's masked trees).
    """
    return jax.tree_util.tree_map_with_path(_dimension_numbers, params)


def muon_labels(params: Any) -> Any:
    """'muon' for each parameter `muon_dimension_numbers` gives a matrix reading, else 'adamw'."""
    return jax.tree_util.tree_map_with_path(
        lambda path, x: "adamw" if _dimension_numbers(path, x) is None else "muon", params
    )


def scale_by_width() -> optax.GradientTransformation:
    """Muon's shape scale (optax.contrib.muon's default, from Keller Jordan's Muon): each matrix's
    orthogonalised update x sqrt(max(1, out / in)), its output and input sizes as
    `muon_dimension_numbers` reads them (W_fc_in [F, D]: x sqrt(F / D); W_fc_out [D, F]: x 1).
    optax.contrib.muon applies the same factor but does not export its transformation."""

    def scale(path, u):
        numbers = _dimension_numbers(path, u)
        fan_in = math.prod(u.shape[a] for a in numbers.reduction_axis)
        fan_out = math.prod(u.shape[a] for a in numbers.output_axis)
        return u * math.sqrt(max(1.0, fan_out / fan_in))

    def update(updates, state, params=None):
        del params
        return jax.tree_util.tree_map_with_path(scale, updates), state

    return optax.GradientTransformation(optax.init_empty_state, update)


def _dimension_numbers(path, x) -> MuonDimensionNumbers | None:
    """`muon_dimension_numbers` of one parameter, from its path and number of axes."""
    names = [str(getattr(k, "key", k)) for k in path]
    in_layers = any(n == "layers" or re.fullmatch(r"layers_\d+", n) for n in names)
    if not (in_layers and names[-1] in MATRICES):
        return None
    n_in = IN_AXES.get(names[-2], 1) if names[-1] == "kernel" else 1
    n_out = x.ndim - n_in - (1 if "layers" in names else 0)  # the rest: a scanned stack's L is a batch axis
    return MuonDimensionNumbers(reduction_axis=tuple(range(-n_in, 0)),
                                output_axis=tuple(range(-n_in - n_out, -n_in)))


def make_schedule(optim: Mapping[str, Any], steps: int, peak: float | None = None) -> optax.Schedule:
    """The learning rate at each step, rising from 0 to `peak` (default optim.learning_rate) over
    optim.warmup_steps and ending at min_lr_ratio x the peak after `optim.decay_steps` steps
    (0: all `steps`), then constant at that final rate. In between, by optim.schedule:

    'cosine' (the default): a cosine decay from the end of the warm-up to the end.
    'wsd': constant at the peak, then a linear decay over the last optim.decay_fraction of the steps.

    A run extended past its decay (train.steps raised, decay_steps kept) continues at the final rate.
    A warm-up as long as the decay ends one step early, so that the last step reaches the peak; a
    longer one is cut the same way here (the schedules of runs saved before `check_warmup`), but
    `make_optimizer` refuses it.
    """
    shape = schedule_name(optim)
    peak = optim["learning_rate"] if peak is None else peak
    end = peak * optim["min_lr_ratio"]
    decay_steps = optim.get("decay_steps", 0) or steps
    warmup = min(optim["warmup_steps"], max(decay_steps - 1, 0))
    if shape == "cosine":
        return optax.warmup_cosine_decay_schedule(
            init_value=0.0, peak_value=peak, warmup_steps=warmup, decay_steps=max(decay_steps, warmup + 1),
            end_value=end,
        )
    decay_start = max(decay_steps - round(optim["decay_fraction"] * decay_steps), warmup)
    return optax.join_schedules(
        [optax.linear_schedule(0.0, peak, warmup), optax.constant_schedule(peak),
         optax.linear_schedule(peak, end, decay_steps - decay_start)],
        boundaries=[warmup, decay_start],
    )


def learning_rates(optim: Mapping[str, Any], steps: int) -> dict[str, optax.Schedule]:
    """The schedules a run logs, by metric name: 'learning_rate' (optim.learning_rate's: every
    parameter with AdamW, the non-matrices with Muon) and, with Muon, 'muon_learning_rate'."""
    rates = {"learning_rate": make_schedule(optim, steps)}
    if optimizer_name(optim) == "muon":
        rates["muon_learning_rate"] = make_schedule(optim, steps, peak=optim["muon_learning_rate"])
    return rates


def make_optimizer(optim: Mapping[str, Any], steps: int, rates: Mapping[str, optax.Schedule] | None = None
                   ) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """Global-norm clipping, then AdamW on `make_schedule`'s learning rate with a weight-decay mask,
    or (optim.name='muon') Muon on the layers' matrices and that AdamW on the other parameters.

    optim: the config's `optim` fields (name, schedule, learning_rate, warmup_steps, decay_steps,
    decay_fraction, min_lr_ratio, b1, b2, eps, weight_decay, decay_embeddings, grad_clip, and for
    Muon muon_learning_rate, muon_momentum, muon_weight_decay). rates: `learning_rates(optim, steps)`
    when the caller has them already (built once, they are also logged). Returns the transformation
    and the schedule of optim.learning_rate.
    """
    check_warmup(optim, steps)
    rates = learning_rates(optim, steps) if rates is None else rates
    adamw = optax.adamw(
        rates["learning_rate"], b1=optim["b1"], b2=optim["b2"], eps=optim["eps"],
        weight_decay=optim["weight_decay"],
        mask=lambda p: decay_mask(p, optim["decay_embeddings"]),
    )
    if optimizer_name(optim) == "muon":
        muon = optax.chain(
            scale_by_muon(beta=optim["muon_momentum"], nesterov=True, weight_dimension_numbers=muon_dimension_numbers),
            scale_by_width(),
            optax.add_decayed_weights(optim["muon_weight_decay"]),  # then x the rate, as AdamW's
            optax.scale_by_learning_rate(rates["muon_learning_rate"]),
        )
        update = optax.partition({"muon": muon, "adamw": adamw}, muon_labels)
    else:
        update = adamw
    clip = optax.clip_by_global_norm(optim["grad_clip"]) if optim["grad_clip"] > 0 else optax.identity()
    return optax.chain(clip, update), rates["learning_rate"]


def check_warmup(optim: Mapping[str, Any], steps: int) -> None:
    """Raises ValueError when optim.warmup_steps is longer than the schedule's decay (optim.decay_steps,
    0: all `steps` = train.steps): the learning rate could not warm up for as long as asked."""
    warmup, decay_steps = optim["warmup_steps"], optim.get("decay_steps", 0) or steps
    if warmup <= decay_steps:
        return
    if optim.get("decay_steps", 0):
        span, fix = f"optim.decay_steps={decay_steps} (train.steps={steps})", "optim.decay_steps"
    else:
        span, fix = f"train.steps={steps}", "train.steps"
    raise ValueError(
        f"optim.warmup_steps={warmup} is longer than {span}: the warm-up would end early, at step "
        f"{max(decay_steps - 1, 0)}; set --config.optim.warmup_steps={decay_steps} or fewer, or "
        f"--config.{fix}={warmup} or more"
    )


def optimizer_name(optim: Mapping[str, Any]) -> str:
    """optim.name ('adamw' for a config saved before the field existed), checked."""
    name = optim.get("name", "adamw")
    if name not in OPTIMIZERS:
        raise ValueError(f"optim.name={name!r} is not known; use one of {list(OPTIMIZERS)}")
    return name


def schedule_name(optim: Mapping[str, Any]) -> str:
    """optim.schedule ('cosine' for a config saved before the field existed), checked."""
    shape = optim.get("schedule", "cosine")
    if shape not in SCHEDULES:
        raise ValueError(f"optim.schedule={shape!r} is not known; use one of {list(SCHEDULES)}")
    return shape
