"""Training: the step (state, loss, optimizer, the jitted train and eval steps), sharding, the
loop and its set-up. The steps' names (steps.py) are re-exported here: `from transformer import training`."""

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
