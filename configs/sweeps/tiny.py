"""A seconds-long sweep of configs/tiny.py (the tests use it): the base against attention-only blocks.

    python sweep.py --sweep configs/sweeps/tiny.py --workdir runs/sweeps/tiny
"""


def get_config():
    return dict(
        base="tiny",
        overrides={"train.steps": 8, "train.log_every": 2, "train.eval_every": 4, "train.checkpoint_every": 4,
                   "train.sample_tokens": 0, "optim.warmup_steps": 2},
        variants={
            "baseline": {},
            "attention_only": {"model.mlp_dim": 0},
        },
    )
