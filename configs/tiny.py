"""A seconds-long smoke test of the whole pipeline (the tests and notebooks use it)."""

from configs.common import base_config


def get_config():
    c = base_config(
        dict(vocab_size=256, max_seq_len=64, d_model=64, num_layers=2, num_heads=4, mlp_dim=128)
    )
    c.train.steps = 40
    c.train.batch_size = 8
    c.train.seq_len = 32
    c.train.log_every = 5
    c.train.eval_every = 20
    c.train.eval_batches = 2
    c.train.checkpoint_every = 20
    c.train.sample_tokens = 32
    c.optim.warmup_steps = 1  # no longer than the tests' and the README's runs of 1 to 4 steps (make_optimizer)
    c.optim.learning_rate = 3e-3
    return c
