"""The default: a modern recipe for the byte-level GPT on the bundled Shakespeare plays, sized for a 2-core CPU.

`make train` runs it. The same shape as the lecture's GPT (configs/shakespeare.py: 4 layers, 128 wide,
4 heads, vocabulary 256 bytes, sequences of 128) with the pieces that reach a given loss in fewer steps
since GPT-2, as in the speed-run recipes (modded-nanogpt): rotary positions, RMSNorm, no biases, QK-norm,
a squared-ReLU MLP, output projections and an untied head that start at zero, logits soft-capped at 30,
Muon on the layers' matrices with AdamW on the rest, and a warm-up / stable / decay schedule. Each
piece is measured against the lecture's choice by configs/sweeps/recipe.py; the README's "Time to
quality" compares the whole run with the lecture GPT and with PyTorch.

It trains for 560 steps of 16 x 128 bytes, 0.28 of the lecture GPT's bytes (1000 x 32 x 128): over
seeds 0-2 that ends no differently from 400 steps of 32 (10/7 the bytes; the default until 2026-12-05,
now configs/modern_b32.py), in less wall time (docs/experiments/fewer_tokens.md, "Fewer bytes still").

Where a field differs from the lecture GPT's (configs/shakespeare.py), the comment says so.
"""

from configs.common import base_config


def get_config():
    c = base_config(
        dict(
            vocab_size=256,  # bytes
            max_seq_len=128,  # = train.seq_len
            d_model=128,
            num_layers=4,
            num_heads=4,  # d_h = 32
            position="rope",  # lecture: learned
            norm="rmsnorm",  # lecture: layer norm with gain and bias
            norm_bias=False,  # (RMSNorm has none; stated so the config reads as the model)
            use_bias=False,  # lecture: biases in every projection
            qk_norm=True,  # lecture: none; RMSNorm of each head's q and k before RoPE
            activation="relu2",  # lecture: exact GELU
            zero_init_out=True,  # lecture: W_o and the MLP's output start at normal(0.02 / sqrt(2L))
            tie_embeddings=False,  # lecture: tied
            zero_init_head=True,  # the untied head starts at zero: uniform first predictions
            logit_softcap=30.0,  # lecture: none; logits = 30 tanh(logits / 30)
            dropout=0.0,  # under one epoch of data: nothing to regularise
            scan_layers=False,  # a Python loop over 4 layers trains faster than nn.scan on CPU
        )
    )
    c.train.steps = 560  # lecture: 1000
    c.train.batch_size = 16  # lecture: 32
    c.train.seq_len = 128
    c.train.log_every = 25
    c.train.eval_every = 100
    c.train.checkpoint_every = 280
    c.train.sample_tokens = 120  # prompt + sample fit in the 128-byte context
    c.optim.name = "muon"  # lecture: AdamW everywhere
    c.optim.muon_learning_rate = 0.02  # Muon's peak rate, on the layers' matrices
    c.optim.learning_rate = 4e-3  # AdamW's peak rate, on embeddings, the head and norm gains (lecture: 2e-3)
    c.optim.schedule = "wsd"  # lecture: warm-up then cosine decay
    c.optim.warmup_steps = 50  # lecture: 100
    c.optim.decay_fraction = 0.5  # the last half of the steps decay linearly to min_lr_ratio x the peak
    c.optim.muon_momentum = 0.9  # Nesterov momentum of Muon (configs/common.py: 0.95)
    return c
