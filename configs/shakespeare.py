"""The default: a byte-level GPT on the bundled Shakespeare plays, sized for a 2-core CPU.

`make train` runs it; see the README for the loss it reaches and how long it takes.
"""

from configs.common import base_config


def get_config():
    c = base_config(
        dict(
            vocab_size=256,  # bytes
            max_seq_len=256,  # longest context the model can see
            d_model=192,
            num_layers=4,
            num_heads=6,
            position="learned",
            activation="gelu",
            norm="layernorm",
            dropout=0.0,
            scan_layers=False,  # a Python loop over 4 layers runs ~10% faster than nn.scan on CPU
        )
    )
    c.train.steps = 2000
    c.train.batch_size = 32
    c.train.seq_len = 128
    c.optim.learning_rate = 2e-3
    return c
