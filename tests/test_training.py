"""The training library: loss, optimizer, weight-decay mask, accumulation, sharding."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer import training
from transformer.config import ModelConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OPTIM = dict(learning_rate=1e-3, warmup_steps=10, min_lr_ratio=0.1, b1=0.9, b2=0.99, eps=1e-8,
             weight_decay=0.1, decay_embeddings=False, grad_clip=1.0)
CFG = ModelConfig(vocab_size=64, max_seq_len=16, d_model=32, num_layers=2, num_heads=4)


def test_cross_entropy_matches_numpy():
    logits = jax.random.normal(jax.random.key(0), (2, 3, 5), jnp.bfloat16)
    targets = jnp.array([[0, 1, 4], [2, 3, 3]])
    lg = np.asarray(logits, np.float32)
    logp = lg - np.log(np.exp(lg).sum(-1, keepdims=True))
    expected = -np.take_along_axis(logp, np.asarray(targets)[..., None], -1).mean()
    got = training.cross_entropy(logits, targets)
    assert got.dtype == jnp.float32
    np.testing.assert_allclose(got, expected, rtol=1e-5)


def test_decay_mask_spares_norms_biases_and_embeddings():
    params = training.init_params(CFG, jax.random.key(0))
    mask = training.decay_mask(params)
    flat = {jax.tree_util.keystr(p): m for p, m in jax.tree_util.tree_flatten_with_path(mask)[0]}
    assert flat["['layers']['attn']['q']['kernel']"] and flat["['layers']['mlp']['fc_in']['kernel']"]
    assert not flat["['layers']['attn']['q']['bias']"]  # [L, H, K]: 2-D yet a bias
    assert not flat["['layers']['attn_norm']['scale']"] and not flat["['final_norm']['bias']"]
    assert not flat["['embed']['embedding']"] and not flat["['pos_embed']"]
    with_emb = training.decay_mask(params, decay_embeddings=True)
    assert with_emb["embed"]["embedding"] and with_emb["pos_embed"]


def test_schedule_warms_up_then_decays_to_min():
    _, schedule = training.make_optimizer(OPTIM, steps=100)
    assert float(schedule(0)) == 0.0
    assert float(schedule(10)) == pytest.approx(1e-3)
    assert float(schedule(5)) == pytest.approx(5e-4)
    assert float(schedule(100)) == pytest.approx(1e-4)
    assert float(schedule(50)) < 1e-3


def test_grad_accumulation_equals_one_big_batch():
    mesh = training.make_mesh(devices=jax.devices()[:1])
    tx, schedule = training.make_optimizer(OPTIM, 10)
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
    mesh = training.make_mesh(devices=jax.devices()[:1])
    tx, schedule = training.make_optimizer(dict(OPTIM, warmup_steps=0, learning_rate=1e-2), 30)
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


def test_mesh_errors_name_the_fix():
    with pytest.raises(ValueError, match="mesh.fsdp=3"):
        training.make_mesh(fsdp=3, devices=jax.devices()[:1] * 2)
    with pytest.raises(ValueError, match="mesh.data=-1"):
        training.make_mesh(data=2, devices=jax.devices()[:1])


def test_flops_per_token_formula():
    n = 1_000_000
    assert training.flops_per_token(CFG, n, 16) == 6 * (n - 16 * 32) + 12 * 2 * 16 * 32


@pytest.mark.slow
def test_sharded_training_equals_one_device():
    """8 simulated CPU devices (own process): data-parallel and FSDP losses equal the 1-device run's."""
    env = dict(os.environ, PYTHONPATH=ROOT, XLA_FLAGS="--xla_force_host_platform_device_count=8")
    out = subprocess.run([sys.executable, os.path.join(ROOT, "tests/helpers/sharded_losses.py")],
                         capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    # Equal up to float32 reduction order (the gradient all-reduce sums in another order).
    np.testing.assert_allclose(result["dp8"], result["1"], rtol=2e-5)
    np.testing.assert_allclose(result["dp4_fsdp2"], result["1"], rtol=2e-5)
    assert result["1"][-1] < result["1"][0]
    assert any("fsdp" in s for s in result["fsdp_specs"]), result["fsdp_specs"]
