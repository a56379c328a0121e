"""Run in its own process with 8 simulated CPU devices: losses of 1-device, data-parallel and FSDP runs.

Prints one JSON line {"1": [...], "dp8": [...], "dp4_fsdp2": [...]}.
"""

import json
import os

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"

import jax  # noqa: E402
import numpy as np  # noqa: E402

from transformer import training  # noqa: E402
from transformer.config import ModelConfig  # noqa: E402
from transformer.optim import make_optimizer  # noqa: E402
from transformer.sharding import batch_sharding, make_mesh  # noqa: E402

OPTIM = dict(learning_rate=3e-3, warmup_steps=2, min_lr_ratio=0.1, b1=0.9, b2=0.99, eps=1e-8,
             weight_decay=0.1, decay_embeddings=False, grad_clip=1.0)


def losses(mesh, steps=5):
    cfg = ModelConfig(vocab_size=64, max_seq_len=16, d_model=64, num_layers=2, num_heads=4, mlp_dim=128)
    tx, schedule = make_optimizer(OPTIM, steps)
    state = training.create_state(cfg, tx, 0, mesh)
    step = training.make_train_step(cfg, tx, schedule, mesh, state)
    sharding = batch_sharding(mesh)
    rng = np.random.default_rng(0)
    out = []
    for _ in range(steps):
        x = rng.integers(0, 64, (16, 16)).astype(np.int32)
        state, m = step(state, jax.device_put(x, sharding), jax.device_put(np.roll(x, -1, 1), sharding))
        out.append(float(m["loss"]))
    # FSDP really shards: the embedding (64 x 64 = 4096 < 2**14 stays whole) vs the MLP kernels.
    specs = {str(leaf.sharding.spec) for leaf in jax.tree.leaves(state.params)}
    return out, sorted(specs)


assert jax.device_count() == 8, jax.devices()
one, _ = losses(make_mesh(devices=jax.devices()[:1]))
dp8, _ = losses(make_mesh(data=8, fsdp=1))
fsdp, specs = losses(make_mesh(data=4, fsdp=2))
print(json.dumps({"1": one, "dp8": dp8, "dp4_fsdp2": fsdp, "fsdp_specs": specs}))
