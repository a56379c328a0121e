"""The attention-sink experiment's model: a small byte-level GPT with RoPE on the bundled plays.

configs/sweeps/sinks.py trains it three ways (plain, a learned sink logit per head, four register
tokens) and notebooks/attention_sinks.ipynb compares them. Every evaluation also logs the
first-token attention share (train.eval_attention_shares): does a sink form while it trains?
RoPE gives no token an absolute position of its own, so the first token of a window stands out only
by what it can see (itself alone): the setting in which language models grow their sinks.
"""

from configs.common import base_config


def get_config():
    c = base_config(
        dict(
            vocab_size=256,  # bytes
            max_seq_len=128,
            d_model=128,
            num_layers=4,
            num_heads=4,  # d_h = 32
            position="rope",
            scan_layers=False,  # a Python loop over 4 layers trains faster than nn.scan on CPU
        )
    )
    c.train.steps = 700
    c.train.batch_size = 16
    c.train.seq_len = 128
    c.train.log_every = 25
    c.train.eval_every = 50  # a point of the first-token share curve every 50 steps
    c.train.eval_batches = 2
    c.train.checkpoint_every = 350
    c.train.sample_tokens = 0
    c.train.eval_attention_shares = True
    c.optim.learning_rate = 3e-3
    c.optim.warmup_steps = 50
    return c
