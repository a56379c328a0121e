"""Tests for transformer/training/optimizer.py: the weight-decay mask, the learning-rate schedules, and Muon's
routing of parameters and its orthogonalised updates."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from transformer import training
from transformer.model.config import ModelConfig
from transformer.training.optimizer import decay_mask, learning_rates, make_optimizer, make_schedule, muon_dimension_numbers
from transformer.training.sharding import make_mesh

OPTIM = dict(learning_rate=1e-3, warmup_steps=10, min_lr_ratio=0.1, b1=0.9, b2=0.99, eps=1e-8,
             weight_decay=0.1, decay_embeddings=False, grad_clip=1.0)
MUON = dict(OPTIM, name="muon", muon_learning_rate=0.02, muon_momentum=0.95, muon_weight_decay=0.0)
CFG = ModelConfig(vocab_size=64, max_seq_len=16, d_model=32, num_layers=2, num_heads=4)
# Every attention and MLP variant, with an untied head, a sink, registers and QK-norm gains (AdamW keeps them).
VARIANTS = {
    "mha": dict(attention_sink=True, num_registers=2),
    "gqa": dict(num_kv_heads=2, position="rope", norm="rmsnorm", activation="swiglu", tie_embeddings=False,
                qk_norm=True),
    "mla": dict(attention="mla", kv_latent_dim=16, q_latent_dim=24, position="rope", rope_head_dim=4,
                tie_embeddings=False),
}


def flat(tree) -> dict:
    return {jax.tree_util.keystr(p): x for p, x in jax.tree_util.tree_leaves_with_path(
        tree, is_leaf=lambda x: x is None or isinstance(x, optax.contrib.MuonDimensionNumbers))}


def test_decay_mask_spares_norms_biases_and_embeddings():
    params = training.init_params(CFG, jax.random.key(0))
    mask = flat(decay_mask(params))
    assert mask["['layers']['attn']['q']['kernel']"] and mask["['layers']['mlp']['fc_in']['kernel']"]
    assert not mask["['layers']['attn']['q']['bias']"]  # [L, H, K]: 2-D yet a bias
    assert not mask["['layers']['attn_norm']['scale']"] and not mask["['final_norm']['bias']"]
    assert not mask["['embed']['embedding']"] and not mask["['pos_embed']"]
    with_emb = decay_mask(params, decay_embeddings=True)
    assert with_emb["embed"]["embedding"] and with_emb["pos_embed"]


def test_schedule_warms_up_then_decays_to_min():
    _, schedule = make_optimizer(OPTIM, steps=100)
    assert float(schedule(0)) == 0.0
    assert float(schedule(10)) == pytest.approx(1e-3)
    assert float(schedule(5)) == pytest.approx(5e-4)
    assert float(schedule(100)) == pytest.approx(1e-4)
    assert float(schedule(50)) < 1e-3


def test_wsd_warms_up_holds_the_peak_then_decays_linearly_over_the_last_fraction():
    wsd = make_schedule(dict(OPTIM, schedule="wsd", decay_fraction=0.3), steps=100)  # decays over steps 70-100
    expected = {0: 0.0, 5: 5e-4, 10: 1e-3, 40: 1e-3, 70: 1e-3, 85: 1e-3 - 0.5 * 0.9e-3, 100: 1e-4, 150: 1e-4}
    assert {s: float(wsd(s)) for s in expected} == pytest.approx(expected)
    # decay_steps spans the schedule: a run extended to 200 steps continues at the final rate
    extended = make_schedule(dict(OPTIM, schedule="wsd", decay_fraction=0.3, decay_steps=100), steps=200)
    assert [float(extended(s)) for s in (85, 150)] == pytest.approx([float(wsd(85)), 1e-4])
    # each part its own peak, the same shape
    muon = learning_rates(dict(MUON, schedule="wsd", decay_fraction=0.3), steps=100)["muon_learning_rate"]
    assert [float(muon(s)) for s in (5, 40, 85, 100)] == pytest.approx([20 * float(wsd(s)) for s in (5, 40, 85, 100)])


def test_unknown_optimizer_or_schedule_is_an_error_naming_the_field():
    with pytest.raises(ValueError, match=r"optim.name='sgd' is not known; use one of \['adamw', 'muon'\]"):
        make_optimizer(dict(OPTIM, name="sgd"), 10)
    with pytest.raises(ValueError, match=r"optim.schedule='linear' is not known"):
        make_optimizer(dict(OPTIM, schedule="linear"), 10)


def test_a_warm_up_longer_than_the_run_warns_and_runs_the_declared_ramp_longer_than_the_decay_is_an_error(capsys):
    """#31: warmup_steps=100 with train.steps=4 was cut to 3 steps without a word (make_schedule clamps).
    Issue 51: a short run of any config is never refused: one warning, the declared warm-up cut short."""
    _, ramp = make_optimizer(dict(OPTIM, warmup_steps=100), 4)
    assert capsys.readouterr().err == ("warning: train.steps=4 ends inside the warm-up of optim.warmup_steps=100: "
                                       "the learning rate rises to 4% of its peak and never decays (a short run)\n")
    assert [float(ramp(s)) for s in range(4)] == pytest.approx([0, 1e-5, 2e-5, 3e-5], rel=1e-5)  # peak 1e-3 over 100 steps
    with pytest.raises(ValueError, match=r"longer than optim.decay_steps=4 \(train.steps=8\).*optim.decay_steps=100"):
        make_optimizer(dict(MUON, warmup_steps=100, decay_steps=4), 8)
    _, schedule = make_optimizer(dict(OPTIM, warmup_steps=4), 4)  # as long as the run: warns (training/setup.py), runs
    assert [float(schedule(s)) for s in range(4)] == pytest.approx([0, 1e-3 / 3, 2e-3 / 3, 1e-3])
    make_schedule(dict(OPTIM, warmup_steps=100), 4)  # a saved run's schedule is still computed (resume checks)


def test_adamw_is_todays_clipped_masked_adamw():
    """optim.name='adamw' (given or absent) updates exactly as optax's clip + AdamW chain with the cosine."""
    params = training.init_params(CFG, jax.random.key(0))
    reference = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(
        optax.warmup_cosine_decay_schedule(0.0, 1e-3, 10, 100, 1e-4), b1=0.9, b2=0.99, eps=1e-8, weight_decay=0.1,
        mask=decay_mask))
    txs = [reference, make_optimizer(OPTIM, 100)[0], make_optimizer(dict(OPTIM, name="adamw"), 100)[0]]
    states = [tx.init(params) for tx in txs]
    for step in range(3):
        grads = jax.tree.map(lambda p: jax.random.normal(jax.random.key(step), p.shape), params)
        out = [jax.jit(tx.update)(grads, state, params) for tx, state in zip(txs, states)]
        states = [s for _, s in out]
        for updates, _ in out[1:]:
            jax.tree.map(np.testing.assert_array_equal, updates, out[0][0])


@pytest.mark.parametrize("scan_layers", [True, False])
@pytest.mark.parametrize("variant", VARIANTS)
def test_muon_takes_every_matrix_inside_the_layers_and_adamw_the_rest(variant, scan_layers):
    cfg = CFG.replace(scan_layers=scan_layers, **VARIANTS[variant])
    params = jax.eval_shape(training.init_params, cfg, jax.random.key(0))  # shapes are all it reads
    numbers = flat(muon_dimension_numbers(params))
    muon = {p for p, d in numbers.items() if d is not None}
    in_layers = {p for p in numbers if p.startswith("['layers")}
    assert muon == {p for p in in_layers if p.endswith(("['kernel']", "['k_up']", "['v_up']"))}
    layer = "['layers']" if scan_layers else "['layers_1']"
    wanted = {"mha": ("q", "k", "v", "o"), "gqa": ("q", "k", "v", "o"), "mla": ("q_down", "q_up", "kv_down", "o")}
    mlp = ("gate", "up", "fc_out") if variant == "gqa" else ("fc_in", "fc_out")
    assert {f"{layer}['attn']['{m}']['kernel']" for m in wanted[variant]} <= muon
    assert {f"{layer}['mlp']['{m}']['kernel']" for m in mlp} <= muon
    if variant == "mla":
        assert {f"{layer}['attn']['k_up']", f"{layer}['attn']['v_up']"} <= muon
    adamw = set(numbers) - muon
    assert "['embed']['embedding']" in adamw and f"{layer}['attn_norm']['scale']" in adamw
    assert {"mha": {"['pos_embed']", "['registers']", f"{layer}['attn']['sink']", f"{layer}['attn']['q']['bias']"},
            "gqa": {"['head']['kernel']", f"{layer}['attn']['q_norm']['scale']"},
            "mla": {"['head']['kernel']"}}[variant] <= adamw

    # how each matrix is read: input axes last, a scanned L axis left as a batch axis
    def at(path): return numbers[layer + path]
    assert at("['attn']['o']['kernel']") == ((-2, -1), (-3,))  # W_o [D, H, Kv] reads [H, Kv]
    assert at("['mlp']['fc_out']['kernel']") == ((-1,), (-2,))
    if variant == "mla":
        assert at("['attn']['k_up']") == ((-1,), (-3, -2))  # W_UK [H, K, C] reads C
    else:
        assert at("['attn']['q']['kernel']") == ((-1,), (-3, -2))  # W_q [H, K, D] read as [H*K, D]


def spread_matrix(rng, rows: int, cols: int, condition: float) -> np.ndarray:
    """A random [rows, cols] matrix whose singular values spread geometrically over `condition`."""
    u, _ = np.linalg.qr(rng.normal(size=(rows, rows)))
    v, _ = np.linalg.qr(rng.normal(size=(cols, cols)))
    s = np.geomspace(1 / condition, 1, min(rows, cols))
    return (u[:, : s.size] * s) @ v[: s.size]


def one_update(cfg, grads_at: dict) -> dict:
    """Muon's first update (no clipping, no warm-up) for gradients that are zero but at the given paths."""
    params = training.init_params(cfg, jax.random.key(0))
    grads = jax.tree.map(jnp.zeros_like, params)
    for path, g in grads_at.items():
        node = grads
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = jnp.asarray(g, jnp.float32)
    tx, _ = make_optimizer(dict(MUON, warmup_steps=0, grad_clip=0.0), 100)
    updates, _ = jax.jit(tx.update)(grads, tx.init(params), params)
    return updates


def singular_values(update, lr: float, rows: int) -> np.ndarray:
    return np.linalg.svd(np.asarray(update).reshape(rows, -1) / -lr, compute_uv=False)


def test_a_muon_update_of_a_matrix_is_orthogonalised():
    """A gradient with singular values over a factor 50 gives an update whose singular values are
    all near 1 (Newton-Schulz's ~0.7-1.2), times the learning rate; the rest of the step is untouched."""
    cfg = CFG.replace(scan_layers=False)
    g = spread_matrix(np.random.default_rng(0), 32, 32, condition=50).reshape(4, 8, 32)  # W_q [H, K, D]
    updates = one_update(cfg, {("layers_0", "attn", "q", "kernel"): g})
    s = singular_values(updates["layers_0"]["attn"]["q"]["kernel"], 0.02, 32)
    assert np.all((s > 0.6) & (s < 1.3)), s
    assert not np.any(updates["layers_1"]["attn"]["q"]["kernel"])  # zero gradient, zero momentum: no update


def test_muon_orthogonalises_each_layer_of_a_scanned_stack_on_its_own():
    """Scanned W_q [L, H, K, D]: layer 1's gradient 100 x layer 0's does not swamp layer 0's update;
    W_fc_in [F, D] (F = 4D) comes out x sqrt(F / D) = 2, Muon's shape scale."""
    rng = np.random.default_rng(0)
    q = np.stack([spread_matrix(rng, 32, 32, 50), 100 * spread_matrix(rng, 32, 32, 50)]).reshape(2, 4, 8, 32)
    fc_in = np.stack([spread_matrix(rng, 128, 32, 50) for _ in range(2)])
    updates = one_update(CFG, {("layers", "attn", "q", "kernel"): q, ("layers", "mlp", "fc_in", "kernel"): fc_in})
    for layer in range(2):
        s = singular_values(updates["layers"]["attn"]["q"]["kernel"][layer], 0.02, 32)
        assert np.all((s > 0.6) & (s < 1.3)), (layer, s)
        s = singular_values(updates["layers"]["mlp"]["fc_in"]["kernel"][layer], 0.02 * 2, 128)
        assert np.all((s > 0.6) & (s < 1.3)), (layer, s)


@pytest.mark.slow  # runs a benchmark or many training steps: make test-all
def test_a_short_muon_run_lowers_the_loss_and_logs_both_rates():
    mesh = make_mesh(devices=jax.devices()[:1])
    optim = dict(MUON, warmup_steps=0, learning_rate=1e-2)
    tx, _ = make_optimizer(optim, 30)
    state = training.create_state(CFG, tx, 0, mesh)
    step = training.make_train_step(CFG, tx, learning_rates(optim, 30), mesh, state)
    x = np.tile(np.arange(16, dtype=np.int32), (4, 1))  # a pattern the model can learn
    first = None
    for _ in range(30):
        state, metrics = step(state, x, np.roll(x, -1, 1))
        first = float(metrics["loss"]) if first is None else first
    assert float(metrics["loss"]) < 0.5 * first
    assert float(metrics["muon_learning_rate"]) / float(metrics["learning_rate"]) == pytest.approx(2.0)
