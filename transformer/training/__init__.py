"""Training: loss, optimizer, sharding, the jitted steps, checkpoints, run checks and metrics.
The steps' names (steps.py) are re-exported here: `from transformer import training`."""

from transformer.training.steps import (
    TrainState,
    init_params,
    create_state,
    make_train_step,
    make_eval_step,
    flops_per_token,
)

__all__ = [
    "TrainState",
    "init_params",
    "create_state",
    "make_train_step",
    "make_eval_step",
    "flops_per_token",
]
