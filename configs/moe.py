"""A mixture-of-experts byte-level model on the bundled Shakespeare plays, small enough for a CPU.

Each layer's MLP is 4 SwiGLU experts of width 64, and each token goes to 2 of them (top-2, weights a
softmax over the chosen, as Mixtral): 2 x 64 = 128 active MLP units per token, the same as the dense
SwiGLU MLP of width 128 it is compared with (configs/sweeps/moe.py, docs/experiments/moe.md). The
loss adds 0.01 x the Switch balancing loss; metrics.jsonl logs each layer's expert load (load/{l}/{e}).

    python train.py --config configs/moe.py --workdir runs/moe
    --config.mesh.expert=2          # the experts split over 2 devices (model/moe.py, sharding.py)
"""

from configs.common import base_config


def get_config():
    c = base_config(
        dict(
            vocab_size=256,  # bytes
            max_seq_len=64,  # = train.seq_len
            d_model=64,
            num_layers=2,
            num_heads=4,  # d_h = 16
            position="rope",
            norm="rmsnorm",
            norm_bias=False,
            use_bias=False,
            activation="swiglu",  # each expert is a SwiGLU MLP
            mlp_dim=64,  # F of one expert
            num_experts=4,  # E
            experts_per_token=2,  # k
            renormalize_top_k=True,  # Mixtral's weights: a softmax over the k chosen
            load_balance_coef=0.01,  # Switch Transformer's coefficient
            tie_embeddings=False,
            scan_layers=False,  # a Python loop over 2 layers trains faster than nn.scan on CPU
        )
    )
    c.train.steps = 300
    c.train.batch_size = 16
    c.train.seq_len = 64
    c.train.log_every = 10
    c.train.eval_every = 50
    c.train.eval_batches = 4
    c.train.checkpoint_every = 150
    c.train.sample_tokens = 60
    c.optim.learning_rate = 3e-3
    c.optim.warmup_steps = 30
    return c
