"""Tests for transformer/optim.py: the weight-decay mask and the learning-rate schedule."""

import jax
import pytest

from transformer import training
from transformer.config import ModelConfig
from transformer.optim import decay_mask, make_optimizer

OPTIM = dict(learning_rate=1e-3, warmup_steps=10, min_lr_ratio=0.1, b1=0.9, b2=0.99, eps=1e-8,
             weight_decay=0.1, decay_embeddings=False, grad_clip=1.0)
CFG = ModelConfig(vocab_size=64, max_seq_len=16, d_model=32, num_layers=2, num_heads=4)


def test_decay_mask_spares_norms_biases_and_embeddings():
    params = training.init_params(CFG, jax.random.key(0))
    mask = decay_mask(params)
    flat = {jax.tree_util.keystr(p): m for p, m in jax.tree_util.tree_flatten_with_path(mask)[0]}
    assert flat["['layers']['attn']['q']['kernel']"] and flat["['layers']['mlp']['fc_in']['kernel']"]
    assert not flat["['layers']['attn']['q']['bias']"]  # [L, H, K]: 2-D yet a bias
    assert not flat["['layers']['attn_norm']['scale']"] and not flat["['final_norm']['bias']"]
    assert not flat["['embed']['embedding']"] and not flat["['pos_embed']"]
    with_emb = decay_mask(params, decay_embeddings=True)
    assert with_emb["embed"]["embedding"] and with_emb["pos_embed"]


def test_schedule_warms_up_then_decays_to_min():
    _, schedule = make_optimizer(OPTIM, steps=100)
    assert float(schedule(0)) == 0.0
    assert float(schedule(10)) == pytest.approx(1e-3)
    assert float(schedule(5)) == pytest.approx(5e-4)
    assert float(schedule(100)) == pytest.approx(1e-4)
    assert float(schedule(50)) < 1e-3
