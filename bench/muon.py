"""Muon's update on each matrix as it lies (transformer/training/muon.py) against optax's (issue 50).

    python bench/muon.py     # ~2 minutes

The train step of configs/modern_b32.py (batch 32) and of configs/modern.py (batch 16),
random batches, float32 on the CPU, compiled twice: with Muon's orthogonalisation as committed, and
with optax.contrib.scale_by_muon (which turns each matrix to [in, out] and back, batched by vmap).
The two steps alternate, round by round; each side's fastest round of STEPS steps. Prints a Markdown
table; compare ratios within one run.
"""

from __future__ import annotations

import optax

from bench import timing
from bench.train import Ours
from configs import modern, modern_b32
from transformer.training import optimizer

STEPS, ROUNDS = 15, 5


def optax_muon(beta: float, dimension_numbers):
    return optax.contrib.scale_by_muon(beta=beta, nesterov=True, weight_dimension_numbers=dimension_numbers)


def steps(config) -> dict[str, Ours]:
    """{'ours': the committed step, 'optax': the step with optax's Muon}, both compiled and warm."""
    ours = Ours(config)
    committed, optimizer.scale_by_muon = optimizer.scale_by_muon, optax_muon
    try:
        theirs = Ours(config)
    finally:
        optimizer.scale_by_muon = committed
    for side in (ours, theirs):
        side.run(3)
    return {"ours": ours, "optax": theirs}


def fastest(sides: dict[str, Ours]) -> dict[str, float]:
    """ms per step, each side's fastest of ROUNDS rounds of STEPS steps, the sides alternating."""
    timers = {name: lambda side=side: timing.seconds(lambda: side.run(STEPS)) for name, side in sides.items()}
    return {name: 1e3 * s / STEPS for name, s in timing.alternate(timers, ROUNDS).items()}


def main() -> None:
    print("| config | batch | optax's Muon (ms/step) | ours (ms/step) | optax / ours |")
    print("|---|---|---|---|---|")
    for name, module in (("modern_b32", modern_b32), ("modern", modern)):
        config = module.get_config()
        ms = fastest(steps(config))
        print(f"| {name} | {config.train.batch_size} | {ms['optax']:.1f} | {ms['ours']:.1f} | "
              f"{ms['optax'] / ms['ours']:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
