"""The mixture-of-experts MLP (transformer/model/moe.py): routing against a per-token loop, the
balancing loss and the load in the training metrics, capture and switching experts off, the config's
checks and the expert axis's logical sharding."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer.analysis.capture import capture
from transformer.model.config import ModelConfig
from transformer.model.edits import run, switch_off_experts
from transformer.model.moe import router_stats, routing_weights
from transformer.model.param_tree import unstack_layers
from transformer.training.loss import forward, loss_fn, objective
from transformer.training.optimizer import make_optimizer
from transformer.training.sharding import make_mesh, make_rules, param_axes, state_sharding
from transformer.training.steps import init_params, train_step

E, K = 4, 2
BASE = dict(vocab_size=64, max_seq_len=16, d_model=32, num_layers=2, num_heads=4, mlp_dim=24, activation="swiglu",
            position="rope", norm="rmsnorm", norm_bias=False, use_bias=False, num_experts=E, experts_per_token=K)


@functools.cache
def model(renormalize=True, scan_layers=True):
    cfg = ModelConfig(**BASE, renormalize_top_k=renormalize, scan_layers=scan_layers)
    params = init_params(cfg, jax.random.key(0))
    params = jax.tree.map(lambda p: p * 5.0, params)  # routers far from uniform, experts far from zero
    return cfg, params


@functools.cache
def jitted(fn, cfg):
    """fn(params, cfg, x, x, None) of objective / loss_fn, jitted (eager Flax is slow)."""
    return jax.jit(lambda params, x: fn(params, cfg, x, x, None))


def tokens(b=2, t=12, seed=0):
    return jnp.asarray(np.random.RandomState(seed).randint(0, 64, (b, t)))


def reference_moe(x, params, k, renormalize, off=()):
    """One token at a time: the router's softmax, its k largest (experts in `off` never chosen), each a SwiGLU MLP."""
    x = np.asarray(x, np.float64)
    router = np.asarray(params["router"]["kernel"], np.float64)  # [E, D]
    gate, up = (np.asarray(params[n]["kernel"], np.float64) for n in ("expert_gate", "expert_up"))  # [E, F, D]
    out_w = np.asarray(params["expert_out"]["kernel"], np.float64)  # [D, E, F]
    y = np.zeros_like(x)
    for index in np.ndindex(*x.shape[:-1]):
        logits = router @ x[index]
        logits[list(off)] = -np.inf
        p = np.exp(logits - logits.max())
        p /= p.sum()
        chosen = np.argsort(-p, kind="stable")[:k]
        w = p[chosen] / (p[chosen].sum() if renormalize else 1.0)
        for e, w_e in zip(chosen, w):
            g, u = gate[e] @ x[index], up[e] @ x[index]
            y[index] += w_e * out_w[:, e] @ (g / (1 + np.exp(-g)) * u)
    return y


@pytest.mark.parametrize("renormalize", [True, False])
def test_the_layer_equals_a_per_token_loop_over_the_chosen_experts(renormalize):
    """mlp.out of layer 1, from its captured input (the MLP's norm), against the loop: top-k and the
    weights (softmax over the chosen, or the full softmax's) both matter."""
    cfg, params = model(renormalize)
    _, _, points = capture(params, cfg, tokens(), ["blocks.1.mlp_norm.out", "blocks.1.mlp.out"])
    layer = jax.tree.map(lambda a: a[1], params["layers"]["mlp"])
    want = reference_moe(points["blocks.1.mlp_norm.out"], layer, K, renormalize)
    np.testing.assert_allclose(np.asarray(points["blocks.1.mlp.out"]), want, atol=2e-5, rtol=2e-4)
    other, _ = model(not renormalize)
    assert np.abs(reference_moe(points["blocks.1.mlp_norm.out"], layer, K, not renormalize) - want).max() > 1e-2


def test_routing_weights_pick_k_experts():
    logits = jnp.array([[[2.0, 1.0, 0.0, -1.0], [0.0, 0.0, 3.0, 3.0]]])
    w = np.asarray(routing_weights(logits, 2, True))
    assert ((w > 0).sum(-1) == 2).all() and np.allclose(w.sum(-1), 1.0)
    p = np.asarray(jax.nn.softmax(logits))
    np.testing.assert_allclose(np.asarray(routing_weights(logits, 2, False))[0, 0], [p[0, 0, 0], p[0, 0, 1], 0, 0])


def test_scanned_and_unscanned_layers_agree():
    cfg, params = model()
    unscanned = cfg.replace(scan_layers=False)
    la, pa = jitted(objective, cfg)(params, tokens())
    lb, pb = jitted(objective, unscanned)(unstack_layers(params, cfg.num_layers), tokens())
    np.testing.assert_allclose(la, lb, rtol=1e-5)
    assert pa.keys() == pb.keys() and all(np.allclose(pa[k], pb[k], atol=1e-5) for k in pa)


def test_the_loss_adds_the_balancing_loss_and_the_step_logs_each_experts_load():
    cfg, params = model()
    x = tokens()
    loss, parts = jitted(objective, cfg)(params, x)
    assert np.isclose(loss, jitted(loss_fn, cfg)(params, x) + cfg.load_balance_coef * parts["balance_loss"])
    loads = np.array([[parts[f"load/{l}/{e}"] for e in range(E)] for l in range(cfg.num_layers)])
    np.testing.assert_allclose(loads.sum(1), K, rtol=1e-6)  # each token goes to K experts
    assert parts["balance_loss"] >= K - 1e-5  # Switch: E sum_e f_e P_e, at least k, k when balanced
    # The balancing loss alone moves the routers.
    grads = jax.jit(jax.grad(lambda p: router_stats(forward(p, cfg, x, None)[1], 2)[1]))(params)
    assert np.abs(grads["layers"]["mlp"]["router"]["kernel"]).max() > 1e-4
    tx, _ = make_optimizer(dict(learning_rate=1e-3, warmup_steps=1, min_lr_ratio=0.1, b1=0.9, b2=0.99, eps=1e-8,
                                weight_decay=0.1, decay_embeddings=False, grad_clip=1.0), 4)
    from transformer.training.steps import TrainState

    state = TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                       rng=jax.random.key_data(jax.random.key(0)))
    for accum in (2,):
        _, metrics = jax.jit(train_step(cfg, tx, {}, grad_accum=accum))(state, x, x)
        assert {f"load/{l}/{e}" for l in range(2) for e in range(E)} <= set(metrics) and "balance_loss" in metrics
        assert np.isclose(sum(float(metrics[f"load/1/{e}"]) for e in range(E)), K)


def test_capture_gives_the_router_logits_and_the_chosen_experts():
    cfg, params = model()
    _, _, points = capture(params, cfg, tokens(), ["blocks.*.mlp.router_logits", "blocks.*.mlp.expert_weights"])
    logits, weights = np.asarray(points["blocks.*.mlp.router_logits"]), np.asarray(points["blocks.*.mlp.expert_weights"])
    assert logits.shape == weights.shape == (2, 2, 12, E)
    assert ((weights > 0).sum(-1) == K).all() and np.allclose(weights.sum(-1), 1.0, atol=1e-6)
    top = np.argsort(-logits, -1)[..., :K]  # the chosen are the K largest logits
    assert (np.take_along_axis(weights, top, -1) > 0).all()


@pytest.mark.parametrize("renormalize", [True, False])
def test_switching_an_expert_off_routes_its_tokens_to_the_others(renormalize):
    """Expert 2 of layer 1 off: its weight is 0 everywhere, each token still has K experts, layer 1's
    output equals the loop without expert 2, and the logits change."""
    cfg, params = model(renormalize)
    mask = np.ones((2, E))
    mask[1, 2] = 0
    edit = switch_off_experts(cfg, mask)
    names = ["blocks.1.mlp_norm.out", "blocks.*.mlp.expert_weights", "blocks.1.mlp.out"]
    clean, _, before = capture(params, cfg, tokens(), names[1:2])
    logits, _, points = capture(params, cfg, tokens(), names, edits=[edit])
    weights = np.asarray(points["blocks.*.mlp.expert_weights"])
    assert (np.asarray(before["blocks.*.mlp.expert_weights"])[1, ..., 2] > 0).any()  # it was used
    assert (weights[1, ..., 2] == 0).all() and ((weights[1] > 0).sum(-1) == K).all()
    np.testing.assert_array_equal(weights[0], np.asarray(before["blocks.*.mlp.expert_weights"])[0])  # layer 0 kept
    layer = jax.tree.map(lambda a: a[1], params["layers"]["mlp"])
    want = reference_moe(points["blocks.1.mlp_norm.out"], layer, K, renormalize, off=[2])
    np.testing.assert_allclose(np.asarray(points["blocks.1.mlp.out"]), want, atol=2e-5, rtol=2e-4)
    assert np.abs(np.asarray(logits) - np.asarray(clean)).max() > 1e-3
    np.testing.assert_allclose(np.asarray(run(params, cfg, tokens(), [edit])[0]), np.asarray(logits), atol=1e-5)
    unscanned = run(unstack_layers(params, 2), cfg.replace(scan_layers=False), tokens(), [edit])[0]  # per-layer edits
    np.testing.assert_allclose(np.asarray(unscanned), np.asarray(logits), atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match=r"needs \[L, E\] = \(2, 4\)"):
        switch_off_experts(cfg, np.ones((2, 3)))


@pytest.mark.parametrize("change, message", [
    (dict(num_experts=1), "num_experts must be 0 .* or an integer >= 2"),
    (dict(experts_per_token=5), "experts_per_token=5 must be an integer in 1..num_experts=4"),
    (dict(activation="gelu"), "needs activation='swiglu'"),
    (dict(load_balance_coef=-1.0), "load_balance_coef must be a finite number >= 0"),
    (dict(renormalize_top_k=1), "renormalize_top_k must be True or False"),
])
def test_bad_expert_fields_are_refused_in_one_line(change, message):
    with pytest.raises(ValueError, match=message) as e:
        ModelConfig(**{**BASE, **change})
    assert "\n" not in str(e.value)


def test_the_balancing_coefficient_is_not_architecture():
    cfg, _ = model()
    assert cfg.architecture_differences(cfg.replace(load_balance_coef=0.5)) == []
    assert cfg.architecture_differences(cfg.replace(num_experts=8)) == ["num_experts"]


class FakeMesh:
    def __init__(self, **shape):
        self.shape = shape


def test_experts_shard_over_the_expert_axis():
    cfg, params = model()
    rules = dict(make_rules(cfg, FakeMesh(data=1, fsdp=2, tensor=2, expert=2)))
    assert rules["experts"] == "expert"
    assert param_axes(("layers", "mlp", "expert_gate", "kernel"), 4) == ("layers", "experts", "mlp", "embed")
    assert param_axes(("layers_0", "mlp", "expert_out", "kernel"), 3) == ("embed", "experts", "mlp")
    with pytest.raises(ValueError, match="model.num_experts.*mesh.rules.experts"):
        make_rules(cfg, FakeMesh(data=1, fsdp=1, tensor=1, expert=8))
    # A mesh without the expert axis (expert=1) replicates the experts.
    mesh = make_mesh(devices=jax.devices()[:1])
    assert "expert" not in mesh.shape and dict(make_rules(cfg, mesh))["experts"] is None
    specs = state_sharding(params, mesh, make_rules(cfg, mesh))
    assert specs["layers"]["mlp"]["expert_up"]["kernel"].spec == jax.sharding.PartitionSpec(None, None, "tensor", "fsdp")
    with pytest.raises(ValueError, match="mesh.expert=2"):
        make_mesh(expert=2, devices=jax.devices()[:1] * 3)
