"""Tests of the attention-sink options and their measurement: the sink logit (ops and model), register
tokens (shapes, loss, cache), cached decoding == forward for each option, the captured pattern, head ablation,
scanned == unscanned, config errors, transformer/experiments/sinks/sinks.py, and training one from the command line.
"""

from __future__ import annotations

import json
import os

import chex
import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import tiny
from tests.helpers.cli import run as run_train
from tests.helpers.decoder import PREFILL, TOL, T, build, jit, max_diff, segment_masks
from tests.helpers.marks import first_fast
from tests.test_model import check_cached_decoding_equals_forward, check_causality, check_ragged_batch_equals_rows_alone
from transformer import ModelConfig, init_cache
from transformer.experiments.sinks import sinks
from transformer.analysis.capture import attention_maps, capture
from transformer.model import edits, kv_cache, ops
from transformer.model.execution import resolve_auto
from transformer.data.batches import with_start_token
from transformer.training.loss import cross_entropy, loss_fn
from transformer.run.metrics import read_metrics
from transformer.model.param_tree import unstack_layers
from transformer.training.setup import check_train_config

R = 3  # registers in the tests' models
OPTIONS = {"sink": dict(attention_sink=True), "registers": dict(num_registers=R),
           "both": dict(attention_sink=True, num_registers=2)}


def scores_and_qkv(seed=0, b=2, t=5, h=4, g=2, k=8):
    rng = np.random.default_rng(seed)
    q = jnp.asarray(rng.standard_normal((b, t, h, k)), jnp.float32)
    keys = jnp.asarray(rng.standard_normal((b, t, g, k)), jnp.float32)
    v = jnp.asarray(rng.standard_normal((b, t, g, k)), jnp.float32)
    mask = ops.causal_mask(*(jnp.broadcast_to(jnp.arange(t), (b, t)),) * 2)
    return q, keys, v, mask


# ----------------------------------------------------------------------------- the sink in ops


@pytest.mark.parametrize("g", [4, 2, 1], ids=["mha", "gqa", "mqa"])
def test_a_very_negative_sink_is_no_sink(g):
    q, k, v, mask = scores_and_qkv(g=g)
    plain, w_plain = ops.dot_product_attention(q, k, v, mask)
    out, w = ops.dot_product_attention(q, k, v, mask, sink=jnp.full((4,), -1e9))
    np.testing.assert_allclose(out, plain, rtol=0, atol=1e-6)
    np.testing.assert_allclose(w[..., :-1], w_plain, rtol=0, atol=1e-7)
    assert np.all(np.asarray(w[..., -1]) == 0.0)


@pytest.mark.parametrize("g", [4, 2], ids=["mha", "gqa"])
def test_the_sink_only_renormalises(g):
    """A sink logit s_h takes share p = e^s / (e^s + sum_j e^{score_j}) of each row and meets no value:
    the keys' weights are the plain ones times (1 - p), and so is the output."""
    q, k, v, mask = scores_and_qkv(g=g)
    sink = jnp.array([-1.0, 0.0, 1.0, 2.5])
    plain, w_plain = ops.dot_product_attention(q, k, v, mask)
    out, w = ops.dot_product_attention(q, k, v, mask, sink=sink)
    seen = {}
    ops.dot_product_attention(q, k, v, mask, at=lambda name, x: seen.setdefault(name, x))
    logits = seen["scores"]  # [B, H, T, S]: the pre-softmax logits, as the point attn.scores sees them
    p = jax.nn.sigmoid(sink[:, None] - jax.nn.logsumexp(logits, axis=-1))  # [B, H, T]
    chex.assert_shape(w, (2, 4, 5, 6))
    np.testing.assert_allclose(w[..., -1], p, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(w[..., :-1], w_plain * (1 - p)[..., None], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(out, plain * np.moveaxis(np.asarray(1 - p), 1, 2)[..., None], rtol=1e-5, atol=1e-6)
    assert np.all(np.asarray(w[..., :-1].sum(-1)) < 1.0)
    np.testing.assert_allclose(w.sum(-1), 1.0, rtol=1e-6)


def test_the_sink_with_cache_segments_equals_one_segment():
    q, k, v, mask = scores_and_qkv(g=2)
    sink = jnp.array([0.5, -0.5, 1.0, 0.0])
    whole = ops.dot_product_attention(q, k, v, mask, sink=sink)
    split = ops.dot_product_attention(q, [k[:, :2], k[:, 2:]], [v[:, :2], v[:, 2:]],
                                      [mask[..., :2], mask[..., 2:]], sink=sink)
    for a, b in zip(whole, split):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def test_fused_attention_refuses_a_sink():
    q, k, v, mask = scores_and_qkv(g=4)
    with pytest.raises(ValueError, match="has no sink logit.*implementation='reference'"):
        ops.dot_product_attention(q, k, v, mask, implementation="xla", sink=jnp.zeros(4))


# ----------------------------------------------------------------------------- config


@pytest.mark.parametrize("fields, message", [
    (dict(attention_sink=True, attention_impl="xla"), "attention_sink=True needs attention_impl='reference'"),
    (dict(attention_sink=1), "attention_sink must be True or False"),
    (dict(num_registers=-1), "num_registers must be an integer >= 0"),
    (dict(num_registers=True), "num_registers must be an integer >= 0"),
    (dict(num_registers=1.5), "num_registers must be an integer >= 0"),
])
def test_bad_sink_options_are_named(fields, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig(vocab_size=8, max_seq_len=8, d_model=8, num_layers=1, num_heads=2, **fields)


@pytest.mark.parametrize("backend", ["gpu", "tpu", "cpu"])
def test_auto_attention_is_the_reference_one_for_a_sink(backend):
    cfg = ModelConfig(vocab_size=8, max_seq_len=8, d_model=16, num_layers=1, num_heads=2, attention_sink=True,
                      dtype="auto", attention_impl="auto")  # head width 8: cuDNN could run it
    resolved = resolve_auto(cfg, backend)
    assert resolved.cfg.attention_impl == "reference"
    assert resolve_auto(cfg.replace(attention_sink=False, num_registers=2), backend).cfg.attention_impl == (
        {"gpu": "cudnn", "tpu": "xla", "cpu": "reference"}[backend])  # registers are tokens: any path


def test_the_options_are_off_by_default_and_registers_work_with_fused_attention():
    cfg = ModelConfig(vocab_size=8, max_seq_len=8, d_model=8, num_layers=1, num_heads=2)
    assert (cfg.attention_sink, cfg.num_registers) == (False, 0)
    ModelConfig(**{**cfg.to_dict(), "num_registers": 2, "attention_impl": "xla"})  # registers are tokens


# ----------------------------------------------------------------------------- the model


def without(params, name):
    """params with every entry `name` removed (the plain model's tree)."""
    if isinstance(params, dict):
        return {k: without(v, name) for k, v in params.items() if k != name}
    return params


@pytest.mark.parametrize("attention", ["mha", "gqa", "mla_q_rope"])
def test_a_model_with_a_very_negative_sink_is_the_plain_model(attention):
    m, plain = build(attention, "rope", attention_sink=True), build(attention, "rope")
    params = flax.core.unfreeze(m.params)
    params["layers"]["attn"]["sink"] = jnp.full_like(params["layers"]["attn"]["sink"], -1e9)
    np.testing.assert_allclose(m.forward(params, m.tokens), plain.forward(without(params, "sink"), m.tokens),
                               rtol=0, atol=1e-5)
    assert max_diff(m.forward(m.params, m.tokens), plain.forward(without(m.params, "sink"), m.tokens)) > 1e-3


@pytest.mark.parametrize("attention", ["mha", "gqa", "mla_q_rope"])
@pytest.mark.parametrize("option", ["sink", "registers"])
def test_cached_decoding_equals_forward(attention, option):
    """Prefill + one-token decoding == the forward, a ragged batch == rows alone, causality; post-norm
    for GQA."""
    m = build(attention, "rope", attention != "gqa", **OPTIONS[option])
    check_causality(m)
    check_cached_decoding_equals_forward(m)
    check_ragged_batch_equals_rows_alone(m)


def test_registers_keep_the_logits_shape_and_the_loss_token_count():
    m = build("gqa", "learned", num_registers=R)
    logits = m.forward(m.params, m.tokens)
    chex.assert_shape(logits, (2, T, m.cfg.vocab_size))
    targets = np.roll(m.tokens, -1, axis=1)
    per_token = -jax.nn.log_softmax(logits)[np.arange(2)[:, None], np.arange(T), targets]  # [B, T]
    loss = loss_fn(m.params, m.cfg, m.tokens, targets, None)
    np.testing.assert_allclose(loss, per_token.mean(), rtol=1e-6)
    np.testing.assert_allclose(loss, cross_entropy(logits, targets), rtol=1e-6)
    registers = m.params["registers"]
    chex.assert_shape(registers, (R, m.cfg.d_model))
    # The registers are seen: other registers give other logits.
    other = {**m.params, "registers": registers[::-1]}
    assert max_diff(m.forward(other, m.tokens), logits) > 1e-3


def test_registers_fill_the_leading_slots_of_the_cache_once():
    m = build("gqa", "rope", num_registers=R)
    cache = init_cache(m.cfg, 2, T)
    assert kv_cache.max_len(cache) == T and cache[0].k.shape[2] == R + T and not cache[0].registers_written
    positions = np.broadcast_to(np.arange(PREFILL), (2, PREFILL))
    _, cache = m.step(m.params, m.tokens[:, :PREFILL], positions, cache)
    assert cache[0].registers_written
    k = np.asarray(cache[0].k)  # [B, G, R + S, K]
    assert np.abs(k[:, :, :R]).min() > 0 and np.all(k[:, :, R + PREFILL:] == 0)
    np.testing.assert_array_equal(k[0, :, :R], k[1, :, :R])  # the same registers in every row
    _, after = m.step(m.params, m.tokens[:, PREFILL:PREFILL + 1], np.full((2, 1), PREFILL), cache)
    np.testing.assert_array_equal(np.asarray(after[0].k)[:, :, :R + PREFILL], k[:, :, :R + PREFILL])


def test_segment_masks_show_written_registers_to_every_query():
    cached, _ = segment_masks(jnp.array([[2, 3]]), 4, registers=2)  # slots: 2 registers, then 4 tokens
    np.testing.assert_array_equal(np.asarray(cached)[0, 0] == 0, [[1, 1, 1, 1, 0, 0]] * 2)
    cached, _ = segment_masks(jnp.array([[-2, -1, 0]]), 4, registers=2)  # the prefill writes them
    assert not (np.asarray(cached) == 0).any()


@pytest.mark.parametrize("option", list(OPTIONS))
def test_the_captured_pattern_shows_registers_first_and_the_sink_last(option):
    m = build("gqa", "rope", **OPTIONS[option])
    cfg = m.cfg
    r, extra = cfg.num_registers, int(cfg.attention_sink)
    names = ["blocks.*.attn.pattern", "blocks.*.attn.scores"]
    logits, _, got = jit(lambda p, x: capture(p, cfg, x, names))(m.params, m.tokens)
    w = got["blocks.*.attn.pattern"]
    chex.assert_shape(w, (cfg.num_layers, 2, cfg.num_heads, T, r + T + extra))
    np.testing.assert_allclose(logits, m.forward(m.params, m.tokens), **TOL)
    np.testing.assert_allclose(w.sum(-1), 1.0, rtol=1e-5)
    w = np.asarray(w)
    tokens = w[..., r : r + T]
    assert np.all(tokens[..., np.triu_indices(T, 1)[0], np.triu_indices(T, 1)[1]] == 0), "not causal"
    if r:
        assert w[..., :r].min() > 0, "every token sees every register"
    if extra:
        assert w[..., -1].min() > 0
    pre = got["blocks.*.attn.scores"]
    chex.assert_shape(pre, w.shape)
    np.testing.assert_allclose(jax.nn.softmax(pre, axis=-1), w, rtol=1e-5, atol=1e-7)


def test_the_plain_attention_shape_is_unchanged():
    m = build("gqa", "rope")
    w = attention_maps(m.params, m.cfg, m.tokens)
    chex.assert_shape(w, (m.cfg.num_layers, 2, m.cfg.num_heads, T, T))


@pytest.mark.parametrize("option", ["sink", "registers"])
def test_ablating_heads_equals_zeroing_output_projection_rows(option):
    m = build("gqa", "rope", **OPTIONS[option])
    L, H = m.cfg.num_layers, m.cfg.num_heads
    run = jit(lambda p, tokens, head_mask: edits.run(p, m.cfg, tokens, [edits.ablate_heads(m.cfg, head_mask)])[0])
    plain = np.asarray(m.forward(m.params, m.tokens))
    np.testing.assert_allclose(run(m.params, m.tokens, jnp.ones((L, H))), plain, rtol=0, atol=1e-6)
    head_mask = np.ones((L, H), np.float32)
    params = flax.core.unfreeze(jax.tree.map(np.array, m.params))
    for layer, head in [(0, 1), (1, 3)]:
        head_mask[layer, head] = 0.0
        params["layers"]["attn"]["o"]["kernel"][layer, :, head] = 0.0
    masked = np.asarray(run(m.params, m.tokens, head_mask))
    np.testing.assert_allclose(masked, m.forward(jax.tree.map(jnp.asarray, params), m.tokens), **TOL)
    assert max_diff(masked, plain) > 1e-3


@pytest.mark.parametrize("attention", first_fast(["gqa", "mla_q_rope"]))
def test_scanned_and_unscanned_stacks_agree(attention):
    m = build(attention, "rope", **OPTIONS["both"])
    unscanned = build(attention, "rope", **OPTIONS["both"], scan_layers=False)
    params = unstack_layers(m.params, m.cfg.num_layers)
    np.testing.assert_allclose(unscanned.forward(params, m.tokens), m.forward(m.params, m.tokens), **TOL)
    check_cached_decoding_equals_forward(unscanned)


# ----------------------------------------------------------------------------- sinks.py


def test_shares_of_uniform_attention_are_the_uniform_shares():
    """With zero query weights every logit is 0: each row spreads evenly over what it sees (its
    tokens, the registers, the sink), which `uniform_first_token_share` computes by hand."""
    m = build("gqa", "learned", num_registers=2, attention_sink=True)
    params = flax.core.unfreeze(jax.tree.map(np.array, m.params))
    params["layers"]["attn"]["q"] = jax.tree.map(np.zeros_like, params["layers"]["attn"]["q"])
    params["layers"]["attn"]["sink"][:] = 0.0
    shares = sinks.attention_shares(params, m.cfg, m.tokens)
    t = np.arange(1, T)
    np.testing.assert_allclose(shares.first_token, (1 / (t + 3 + 1)).mean(), rtol=1e-5)
    np.testing.assert_allclose(shares.first_token, sinks.uniform_first_token_share(T, 2, True), rtol=1e-5)
    np.testing.assert_allclose(shares.registers, (2 / (t + 3 + 1)).mean(), rtol=1e-5)
    np.testing.assert_allclose(shares.sink, (1 / (t + 3 + 1)).mean(), rtol=1e-5)
    metrics = sinks.share_metrics(m.cfg, shares)
    assert set(metrics) == {"first_token_share", "first_token_share_layer0", "first_token_share_layer1",
                            "register_share", "sink_share"}


def test_shares_are_read_from_the_right_columns():
    cfg = ModelConfig(vocab_size=8, max_seq_len=8, d_model=8, num_layers=1, num_heads=2, num_registers=1,
                      attention_sink=True)
    w = np.zeros((1, 1, 2, 3, 1 + 3 + 1), np.float32)  # [L, B, H, T, R + T + 1]
    w[..., 0], w[..., 1], w[..., -1] = 0.2, 0.3, 0.4  # register, first token, sink
    w[:, :, :, 0, 1] = 1.0  # row 0 is left out
    shares = sinks.shares_from_weights(cfg, jnp.asarray(w))
    np.testing.assert_allclose(shares.registers, [[0.2, 0.2]])
    np.testing.assert_allclose(shares.first_token, [[0.3, 0.3]])
    np.testing.assert_allclose(shares.sink, [[0.4, 0.4]])
    plain = sinks.shares_from_weights(cfg.replace(num_registers=0, attention_sink=False), jnp.asarray(w[..., 1:-1]))
    np.testing.assert_allclose(plain.first_token, [[0.3, 0.3]])
    np.testing.assert_array_equal(plain.registers, 0.0)
    np.testing.assert_array_equal(plain.sink, 0.0)


@pytest.mark.parametrize("option", ["plain", "registers"])
def test_mean_logit_map_is_what_the_softmax_takes(option):
    m = build("gqa", "rope", **({} if option == "plain" else OPTIONS["registers"]))
    logits = sinks.mean_logit_map(m.params, m.cfg, m.tokens[:1])  # one row: the mean is that row's
    chex.assert_shape(logits, (m.cfg.num_layers, m.cfg.num_heads, T, T))
    above = np.triu_indices(T, 1)
    assert np.isnan(logits[:, :, above[0], above[1]]).all() and not np.isnan(np.tril(logits)).any()
    w = attention_maps(m.params, m.cfg, m.tokens[:1])
    r = m.cfg.num_registers
    for t in (1, 6, T - 1):
        row = jax.nn.softmax(logits[:, :, t, : t + 1], axis=-1)  # over the tokens it sees
        seen = np.asarray(w)[:, 0, :, t, r : r + t + 1]
        np.testing.assert_allclose(row, seen / seen.sum(-1, keepdims=True), rtol=1e-5, atol=1e-7)


def test_a_model_on_a_fused_attention_path_is_measured_with_the_reference_one():
    m = build("gqa", "rope", num_registers=2)
    fused = sinks.attention_shares(m.params, m.cfg.replace(attention_impl="xla"), m.tokens)
    reference = sinks.attention_shares(m.params, m.cfg, m.tokens)
    np.testing.assert_allclose(fused.registers, reference.registers, rtol=1e-6)
    np.testing.assert_allclose(fused.first_token, reference.first_token, rtol=1e-6)


def test_measurement_needs_two_tokens():
    m = build("gqa", "rope")
    with pytest.raises(ValueError, match=r"tokens must be \[B, T\] with T >= 2"):
        sinks.attention_shares(m.params, m.cfg, m.tokens[:, :1])


# ----------------------------------------------------------------------------- a fixed start token


def test_with_start_token_begins_every_window_with_it():
    inputs = np.array([[5, 6, 7, 8], [1, 2, 3, 4]], np.int32)
    targets = np.array([[6, 7, 8, 9], [2, 3, 4, 5]], np.int32)
    x, y = with_start_token((inputs, targets), 0)
    np.testing.assert_array_equal(x, [[0, 5, 6, 7], [0, 1, 2, 3]])
    np.testing.assert_array_equal(y, inputs)  # each target is still the token after its input
    assert x.dtype == np.int32
    assert with_start_token((inputs, targets), -1) == (inputs, targets)


def test_with_start_token_keeps_a_needle_rows_ungraded_targets_ungraded():
    """A needle row grades its answer only: begun by a start token, the same answer digits are graded,
    each still the token after its input, and nothing else."""
    from transformer.experiments.recall import needle
    from transformer.data.batches import IGNORED

    filler = np.frombuffer(b"the quick brown fox jumps over the lazy dog; " * 100, np.uint8).astype(np.int32)
    task = needle.NeedleTask(min_length=80, max_length=90, digits=3)
    inputs, targets = needle.batch_at(filler, seed=0, step=1, batch_size=4, seq_len=100, task=task)
    x, y = with_start_token((inputs, targets), 0)
    for b in range(4):
        before, after = np.flatnonzero(targets[b] != IGNORED), np.flatnonzero(y[b] != IGNORED)
        np.testing.assert_array_equal(after, before + 1)
        np.testing.assert_array_equal(y[b, after], targets[b, before])
        np.testing.assert_array_equal(x[b, after], inputs[b, before])


@pytest.mark.parametrize("start", [256, -2])
def test_a_start_token_outside_the_vocabulary_is_named(start):
    config = tiny.get_config()
    config.data.start_token = start
    with pytest.raises(ValueError, match=r"data.start_token=.* must be a token id in \[0, 256\) or -1"):
        check_train_config(config)


# ----------------------------------------------------------------------------- the command line


@pytest.mark.slow
def test_train_from_the_command_line_with_a_sink_and_registers(tmp_path):
    workdir = tmp_path / "run"
    done = run_train(workdir, "--config.model.attention_sink=True", "--config.model.num_registers=2",
                     "--config.model.position=rope", "--config.train.steps=4", "--config.train.eval_every=2",
                     "--config.train.checkpoint_every=4", "--config.train.sample_tokens=8",
                     "--config.train.eval_attention_shares=True", "--config.data.start_token=0")
    assert done.returncode == 0, done.stderr
    evals = [r for r in read_metrics(os.path.join(workdir, "metrics.jsonl")) if "val_loss" in r]
    assert [r["step"] for r in evals] == [2, 4]
    for r in evals:
        assert 0 < r["first_token_share"] < 1 and 0 < r["register_share"] < 1 and 0 < r["sink_share"] < 1
        assert r["first_token_share_layer0"] > 0 and "first_token_share_layer1" in r
    with open(workdir / "config.json") as f:
        model = json.load(f)["model"]
    assert model["attention_sink"] is True and model["num_registers"] == 2
    assert "--- sample ---" in done.stdout  # generate ran: prefill writes the registers, decoding reads them


@pytest.mark.slow
def test_a_default_run_logs_no_shares(tmp_path):
    done = run_train(tmp_path / "run", "--config.train.steps=2", "--config.train.eval_every=2",
                     "--config.train.sample_tokens=0")
    assert done.returncode == 0, done.stderr
    evals = [r for r in read_metrics(os.path.join(tmp_path, "run", "metrics.jsonl")) if "val_loss" in r]
    assert evals and not any("first_token_share" in r for r in evals)
