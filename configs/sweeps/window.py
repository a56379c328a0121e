"""What a sliding window costs in loss: the default model (configs/modern_b32.py, context 128) with every
layer attending to its last W tokens, against full attention.

    make sweep SWEEP=configs/sweeps/window.py       # = python sweep.py --sweep configs/sweeps/window.py
                                                    #            --workdir runs/sweeps/window

Every run is `make train`'s as it was when this ran (configs/modern_b32.py): the recipe's model and optimizer, the same seed and data order, 400 steps
of 32 x 128 bytes, evaluated every 100 steps, no sample at the end. Only model.attention_window
changes (Mistral's convention: a query sees itself and the W - 1 tokens before it); the parameters are
the same, so a variant that ends worse than `full` says the bytes more than W back help. `local_global`
keeps every second layer global (model.global_every = 2), as Gemma 2 does.
"""


def get_config():
    return dict(
        base="modern_b32",
        overrides={
            "train.eval_every": 100,
            "train.checkpoint_every": 400,
            "train.sample_tokens": 0,
        },
        variants={
            "full": {},
            "window_64": {"model.attention_window": 64},
            "window_16": {"model.attention_window": 16},
            "window_4": {"model.attention_window": 4},
            "local_global_16": {"model.attention_window": 16, "model.global_every": 2},
        },
    )
