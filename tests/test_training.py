"""Tests for transformer/training/steps.py: gradient accumulation, the train step, FLOPs per token."""

import jax
import numpy as np
import pytest

from transformer import training
from transformer.model.config import ModelConfig
from transformer.training.optimizer import make_optimizer
from transformer.training.sharding import make_mesh

OPTIM = dict(learning_rate=1e-3, warmup_steps=10, min_lr_ratio=0.1, b1=0.9, b2=0.99, eps=1e-8,
             weight_decay=0.1, decay_embeddings=False, grad_clip=1.0)
CFG = ModelConfig(vocab_size=64, max_seq_len=16, d_model=32, num_layers=2, num_heads=4)


@pytest.mark.slow  # make test-all only (the default set's time: docs/performance.md)
def test_grad_accumulation_equals_one_big_batch():
    mesh = make_mesh(devices=jax.devices()[:1])
    tx, schedule = make_optimizer(OPTIM, 10)
    x = np.random.default_rng(0).integers(0, 64, (8, 16)).astype(np.int32)
    y = np.roll(x, -1, 1)
    results = []
    for accum in (1, 4):
        state = training.create_state(CFG, tx, 0, mesh)
        step = training.make_train_step(CFG, tx, schedule, mesh, state, grad_accum=accum)
        for _ in range(3):
            state, metrics = step(state, x, y)
        results.append((float(metrics["loss"]), state.params))
    assert results[0][0] == pytest.approx(results[1][0], rel=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=2e-6), results[0][1], results[1][1])


def test_train_step_reduces_loss_and_donates_state():
    mesh = make_mesh(devices=jax.devices()[:1])
    tx, schedule = make_optimizer(dict(OPTIM, warmup_steps=0, learning_rate=1e-2), 30)
    state = training.create_state(CFG, tx, 0, mesh)
    step = training.make_train_step(CFG, tx, schedule, mesh, state)
    x = np.tile(np.arange(16, dtype=np.int32), (4, 1))  # a pattern the model can learn
    first = None
    for _ in range(30):
        old = state
        state, metrics = step(state, x, np.roll(x, -1, 1))
        first = float(metrics["loss"]) if first is None else first
    assert float(metrics["loss"]) < 0.5 * first
    assert old.params["embed"]["embedding"].is_deleted()  # donated: buffers reused in place
    assert int(state.step) == 30


def test_flops_per_token_formula():
    n = 1_000_000
    assert training.flops_per_token(CFG, n, 16) == 6 * (n - 16 * 32) + 12 * 2 * 16 * 32
