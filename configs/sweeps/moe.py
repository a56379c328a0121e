"""Mixture of experts against a dense MLP at equal active parameters (docs/experiments/moe.md).

    python sweep.py --sweep configs/sweeps/moe.py --workdir runs/sweeps/moe --jobs 1
    python scripts/moe_experiment.py runs/sweeps/moe          # writes docs/experiments/moe.json

configs/moe.py's model (2 layers, d_model 64, top-2 of 4 SwiGLU experts of width 64) and the same
model with one dense SwiGLU MLP of width 128: per token both apply 2 x 64 = 128 MLP units. Five seeds
each (init and data order), 400 steps of 32 x 64 bytes, evaluated every 50 steps.
"""


def get_config():
    return dict(
        base="moe",
        overrides={
            "train.steps": 400,
            "train.batch_size": 32,
            "train.eval_every": 50,
            "train.eval_batches": 8,
            "train.log_every": 20,
            "train.checkpoint_every": 400,
            "train.sample_tokens": 0,
            "optim.warmup_steps": 40,
        },
        variants={
            "moe": {},
            "dense": {"model.num_experts": 0, "model.mlp_dim": 128},  # = experts_per_token x the expert width
        },
        seeds=[0, 1, 2, 3, 4],
    )
