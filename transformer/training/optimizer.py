"""The optimizer: AdamW, or Muon on the layers' matrices with AdamW on the rest; a warm-up + cosine
or warm-up / stable / decay schedule; global-norm clipping.

    rates = learning_rates(config.optim, steps)                 # {metric name: step -> learning rate}
    tx, schedule = make_optimizer(config.optim, steps, rates)   # an optax transformation

AdamW decays the projection matrices only (`decay_mask`). Muon orthogonalises each layer matrix as one
map (W_q [H, K, D] as [H*K, D], as modded-nanogpt), scaled by sqrt(max(1, out / in)); one schedule shape."""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
import optax
from optax.contrib import MuonDimensionNumbers

from transformer.run.checkpoint import CheckpointError
from transformer.training.muon import scale_by_muon, scale_by_shape

OPTIMIZERS = ("adamw", "muon")
SCHEDULES = ("cosine", "wsd")
# The projection matrices, by parameter name: Linear's `kernel` and MLA's W_UK, W_UV.
MATRICES = ("kernel", "k_up", "v_up")
# Trailing input axes of a matrix (Linear's in_axes): W_o [D, H, Kv] reads [H, Kv]; every other its last.
IN_AXES = {"o": 2}


def decay_mask(params: Any, decay_embeddings: bool = False) -> Any:
    """True for the weights AdamW decays: projection matrices (and embeddings if asked); by name,
    not ndim, since a scanned stack gives every bias a leading layer axis."""

    def decays(path, _) -> bool:
        name = path[-1].key
        if name in ("embedding", "pos_embed"):
            return decay_embeddings
        return name in MATRICES

    return jax.tree_util.tree_map_with_path(decays, params)


def muon_dimension_numbers(params: Any) -> Any:
    """For each parameter (of any tree shaped like them), how Muon reads it as a matrix: input
    axes (IN_AXES) as reduction axes, the axes before them as output axes, counted from the end; None
    for what AdamW updates (embeddings, positions, an untied head, norms, biases, registers, sinks)."""
    return jax.tree_util.tree_map_with_path(_dimension_numbers, params)


def muon_labels(params: Any) -> Any:
    """'muon' for each parameter `muon_dimension_numbers` gives a matrix reading, else 'adamw'."""
    return jax.tree_util.tree_map_with_path(
        lambda path, x: "adamw" if _dimension_numbers(path, x) is None else "muon", params
    )


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
    """The learning rate at each step: from 0 to `peak` (default optim.learning_rate) over
    optim.warmup_steps, then to min_lr_ratio x the peak at optim.decay_steps (0: `steps`) by a
    cosine ('cosine') or held, then linear over the last decay_fraction ('wsd'); constant after.
    A warm-up as long as the decay ends one step early, so that the last step reaches the peak; a
    run shorter than its warm-up (`check_warmup`) ends inside it."""
    shape = schedule_name(optim)
    peak = optim["learning_rate"] if peak is None else peak
    end = peak * optim["min_lr_ratio"]
    decay_steps = optim.get("decay_steps", 0) or steps
    warmup = optim["warmup_steps"]
    if warmup <= decay_steps:
        warmup = min(warmup, max(decay_steps - 1, 0))
    decay_steps = max(decay_steps, warmup + 1)
    if shape == "cosine":
        return optax.warmup_cosine_decay_schedule(
            init_value=0.0, peak_value=peak, warmup_steps=warmup, decay_steps=decay_steps,
            end_value=end,
        )
    decay_start = max(decay_steps - round(optim["decay_fraction"] * decay_steps), warmup)
    return optax.join_schedules(
        [optax.linear_schedule(0.0, peak, warmup), optax.constant_schedule(peak),
         optax.linear_schedule(peak, end, decay_steps - decay_start)],
        boundaries=[warmup, decay_start],
    )


def learning_rates(optim: Mapping[str, Any], steps: int) -> dict[str, optax.Schedule]:
    """The schedules by metric name: 'learning_rate' (AdamW's) and, with Muon, 'muon_learning_rate'."""
    rates = {"learning_rate": make_schedule(optim, steps)}
    if optimizer_name(optim) == "muon":
        rates["muon_learning_rate"] = make_schedule(optim, steps, peak=optim["muon_learning_rate"])
    return rates


def make_optimizer(optim: Mapping[str, Any], steps: int, rates: Mapping[str, optax.Schedule] | None = None
                   ) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """Global-norm clipping, then AdamW with its weight-decay mask, or (optim.name='muon') Muon on
    the layers' matrices and AdamW on the rest. rates: `learning_rates(optim, steps)`, when the
    caller has them. Returns the transformation and optim.learning_rate's schedule."""
    check_warmup(optim, steps)
    rates = learning_rates(optim, steps) if rates is None else rates
    adamw = optax.adamw(
        rates["learning_rate"], b1=optim["b1"], b2=optim["b2"], eps=optim["eps"],
        weight_decay=optim["weight_decay"],
        mask=lambda p: decay_mask(p, optim["decay_embeddings"]),
    )
    if optimizer_name(optim) == "muon":
        muon = optax.chain(
            scale_by_muon(optim["muon_momentum"], muon_dimension_numbers),
            scale_by_shape(muon_dimension_numbers),
            optax.add_decayed_weights(optim["muon_weight_decay"]),  # then x the rate, as AdamW's
            optax.scale_by_learning_rate(rates["muon_learning_rate"]),
        )
        update = optax.partition({"muon": muon, "adamw": adamw}, muon_labels)
    else:
        update = adamw
    clip = optax.clip_by_global_norm(optim["grad_clip"]) if optim["grad_clip"] > 0 else optax.identity()
    return optax.chain(clip, update), rates["learning_rate"]


def check_warmup(optim: Mapping[str, Any], steps: int) -> None:
    """ValueError when optim.warmup_steps is longer than optim.decay_steps; a warning line when it is
    longer than train.steps (a short run, e.g. a smoke test: the declared schedule, cut short)."""
    warmup, decay_steps = optim["warmup_steps"], optim.get("decay_steps", 0)
    if decay_steps and warmup > decay_steps:
        raise ValueError(f"optim.warmup_steps={warmup} is longer than optim.decay_steps={decay_steps} (train.steps="
                         f"{steps}): the warm-up would end early; set --config.optim.warmup_steps={decay_steps} or "
                         f"fewer, or --config.optim.decay_steps={warmup} or more")
    if not decay_steps and warmup > steps:
        print(f"warning: train.steps={steps} ends inside the warm-up of optim.warmup_steps={warmup}: the learning "
              f"rate rises to {steps / warmup:.0%} of its peak and never decays (a short run)", file=sys.stderr)


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


RATE_NAMES = {"learning_rate": "learning rate", "muon_learning_rate": "Muon learning rate"}


def check_optimizer_kept(saved: dict, optim: Mapping[str, Any], rates: Mapping[str, optax.Schedule],
                         workdir: str) -> str | None:
    """Resuming the latest checkpoint's config `saved` (with its "step") with `optim` and its `rates`:
    raises CheckpointError for another optimizer, whose state cannot continue; returns a warning when the
    learning rate of a step already taken differs (e.g. a cosine re-spanned: training would continue on
    another curve), else None."""
    before, now = optimizer_name(saved["optim"]), optimizer_name(optim)
    if before != now:
        raise CheckpointError(
            f"the checkpoints in {workdir} were trained with optim.name={before!r}, whose optimizer state "
            f"optim.name={now!r} cannot continue; resume with --config.optim.name={before}, or start a new --workdir"
        )
    then, steps = learning_rates(saved["optim"], saved["train"]["steps"]), np.arange(saved["step"])
    for name in then.keys() & rates.keys():
        moved = np.flatnonzero(~np.isclose(np.asarray(then[name](steps)), np.asarray(rates[name](steps)),
                                           rtol=1e-5, atol=0))
        if moved.size:
            s = int(moved[-1])
            old_decay = saved["optim"].get("decay_steps", 0) or saved["train"]["steps"]
            return (f"this resume changes the {RATE_NAMES[name]} schedule of the steps already taken (step {s}: "
                    f"{float(then[name](s)):.2e} then, {float(rates[name](s)):.2e} now), so training continues on "
                    f"another curve. To extend the finished schedule at its final rate, add "
                    f"--config.optim.decay_steps={old_decay}")
    return None
