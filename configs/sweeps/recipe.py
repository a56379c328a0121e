"""The modern recipe with one piece taken out at a time: which pieces help here.

    make sweep SWEEP=configs/sweeps/recipe.py       # = python sweep.py --sweep configs/sweeps/recipe.py
                                                    #            --workdir runs/sweeps/recipe

Every run: the recipe's model and optimizer (configs/modern_b32.py, the default when this ran), the same seed and data order, 200 steps of 32 x 128 bytes
(the recipe's warm-up / stable / decay schedule spans the 200), evaluated every 50 steps, no sample at
the end. Each variant changes one thing back to the lecture GPT's choice (configs/shakespeare.py), so
a variant that ends *worse* than `recipe` says the piece helps. `batch_16` halves the batch and doubles
the steps (the same tokens): compare its wall time too. The README's "Time to quality" gives the
results as measured.
"""


def get_config():
    return dict(
        base="modern_b32",
        overrides={
            "train.steps": 200,
            "train.eval_every": 50,
            "train.checkpoint_every": 200,
            "train.sample_tokens": 0,
        },
        variants={
            "recipe": {},
            "adamw": {"optim.name": "adamw", "optim.learning_rate": 2e-3},  # AdamW everywhere, the lecture's rate
            "cosine": {"optim.schedule": "cosine"},  # warm-up + cosine decay instead of warm-up / stable / decay
            "learned_positions": {"model.position": "learned"},  # instead of RoPE
            "layernorm": {"model.norm": "layernorm", "model.norm_bias": True},  # instead of RMSNorm
            "biases": {"model.use_bias": True},  # biases in every projection
            "gelu": {"model.activation": "gelu"},  # instead of squared ReLU
            "swiglu": {"model.activation": "swiglu", "model.mlp_dim": 352},  # gated, ~the same parameters
            "no_qk_norm": {"model.qk_norm": False},
            "no_zero_init": {"model.zero_init_out": False, "model.zero_init_head": False},
            "tied_head": {"model.tie_embeddings": True, "model.zero_init_head": False},
            "no_softcap": {"model.logit_softcap": 0.0},
            "batch_16": {"train.batch_size": 16, "train.steps": 400, "train.checkpoint_every": 400},
        },
    )
