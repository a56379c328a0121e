"""The lecture's GPT: a byte-level GPT on the bundled Shakespeare plays, sized for a 2-core CPU.

Learned positions, layer norm with gain and bias, biases in every projection, exact GELU, a tied
head, AdamW with warm-up and cosine decay: 1000 steps of 32 x 128 bytes (4.1M tokens, ~0.8 epochs)
through a 0.84M parameter model. `make train` runs the modern recipe of the same shape instead
(configs/modern.py); the README's "Time to quality" compares the two and PyTorch.
"""

from configs.common import base_config


def get_config():
    c = base_config(
        dict(
            vocab_size=256,  # bytes
            max_seq_len=128,  # = train.seq_len: learned positions past the training length stay untrained
            d_model=128,
            num_layers=4,
            num_heads=4,  # d_h = 32
            position="learned",
            activation="gelu",
            norm="layernorm",
            dropout=0.0,  # under one epoch of data: nothing to regularise
            scan_layers=False,  # a Python loop over 4 layers trains faster than nn.scan on CPU
            # (see configs/baby_gpt.py for why) and compiles about as fast at this depth
        )
    )
    c.train.steps = 1000
    c.train.batch_size = 32
    c.train.seq_len = 128
    c.train.log_every = 25
    c.train.eval_every = 250
    c.train.checkpoint_every = 250
    c.train.sample_tokens = 120  # prompt + sample fit in the 128-byte context
    c.optim.learning_rate = 2e-3  # small models take a high rate
    c.optim.warmup_steps = 100
    return c
