"""Training: the step (state, loss, optimizer, jitted train and eval steps, sharding), the set-up
(check, then build) and the loop. The steps' names are re-exported: `from transformer import training`."""

from transformer.training.steps import TrainState, create_state, flops_per_token, init_params, make_eval_step, make_train_step

__all__ = ["TrainState", "init_params", "create_state", "make_train_step", "make_eval_step", "flops_per_token"]
