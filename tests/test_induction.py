"""Tests of transformer/experiments/induction/induction.py: repeated random tokens; the induction and previous-token
scores of hand-made attention patterns (an induction head, a previous-token head, a uniform head; with
registers in front and a sink behind); the repeated-sequence loss against a NumPy computation; the
training loop's 'induction' metric."""

from __future__ import annotations

import types

import jax
import numpy as np
import pytest

from tests.test_capture import model
from transformer.experiments.induction import induction
from transformer.analysis.capture import attention_maps
from transformer.model.decoder import Decoder


def test_repeated_tokens_repeat():
    x = np.asarray(induction.repeated_tokens(jax.random.key(0), 3, 5, 50))
    assert x.shape == (3, 10) and x.dtype == np.int32 and (x < 50).all()
    np.testing.assert_array_equal(x[:, :5], x[:, 5:])
    assert len(np.unique(x)) > 5
    y = np.asarray(induction.repeated_tokens(jax.random.key(0), 3, 5, 50, first=7))
    np.testing.assert_array_equal(y[:, 0], 7)
    np.testing.assert_array_equal(y[:, 1:], x)


def hand_patterns(t: int, n: int, registers: int, sink: bool) -> np.ndarray:
    """[L=1, B=1, H=3, T, R + T (+1)]: head 0 attends to t - n + 1 in the repeat (else to token 0), head
    1 to t - 1 (token 0 from t = 0), head 2 uniformly over the tokens it sees."""
    s = registers + t + int(sink)
    w = np.zeros((1, 1, 3, t, s))
    for q in range(t):
        w[0, 0, 0, q, registers + (q - n + 1 if q >= t - n else 0)] = 1.0
        w[0, 0, 1, q, registers + max(q - 1, 0)] = 1.0
        w[0, 0, 2, q, registers: registers + q + 1] = 1.0 / (q + 1)
    return w


def test_the_scores_of_an_induction_a_previous_token_and_a_uniform_head():
    n, t = 6, 13  # a leading token, then 6 tokens repeated
    for registers, sink in [(0, False), (2, True)]:
        w = hand_patterns(t, n, registers, sink)
        ind = np.asarray(induction.induction_score(w, n, registers))[0]
        prev = np.asarray(induction.previous_token_score(w, registers))[0]
        np.testing.assert_allclose(ind[0], 1.0)
        np.testing.assert_allclose(prev[1], 1.0)
        assert ind[1] == 0.0 and prev[0] < 0.6  # each kind of head scores low on the other score
        np.testing.assert_allclose(ind[2], induction.uniform_score(np.arange(t - n, t)))
        np.testing.assert_allclose(prev[2], induction.uniform_score(np.arange(1, t)))


def test_the_model_scores_read_the_models_attention_and_the_repeat_loss_is_the_cross_entropy():
    cfg, params = model("sink_registers")
    x = induction.repeated_tokens(jax.random.key(1), 2, 4, cfg.vocab_size, first=0)  # [2, 9]
    w = attention_maps(params, cfg, x)
    np.testing.assert_array_equal(induction.induction_scores(params, cfg, x),
                                  induction.induction_score(w, 4, cfg.num_registers))
    first, repeat = induction.repeated_loss(params, cfg, x)
    logits, _ = Decoder(cfg).apply({"params": params}, x[:, :-1])
    logp = np.asarray(jax.nn.log_softmax(logits), np.float64)
    loss = -np.take_along_axis(logp, np.asarray(x)[:, 1:, None], -1)[..., 0]  # [2, 8]: predicting tokens 1..8
    np.testing.assert_allclose(first, loss[:, 1:4].mean(), rtol=1e-5)  # tokens 2..4: the first copy after its first
    np.testing.assert_allclose(repeat, loss[:, 5:].mean(), rtol=1e-5)  # tokens 6..8: the repeat after its first


@pytest.mark.slow  # make test-all only (the default set's time: docs/performance.md)
def test_the_loops_induction_metric_is_the_scores_and_losses_of_repeated_validation_tokens():
    """The 'induction' evaluation metric, compiled as the loop compiles it, on the mesh: its row holds
    every head's score, their maximum and the two losses of `induction_scores` / `repeated_loss` on
    16 sequences of 32 tokens drawn from the validation batch's ids; a config turns it on."""
    from configs import tiny
    from transformer.experiments.catalog import eval_metrics as enabled_metrics
    from transformer.training.eval_metrics import compile_metric
    from transformer.training.sharding import make_mesh, make_rules

    config = tiny.get_config()
    assert "induction" not in [m.name for m in enabled_metrics(config)]
    config.train.eval_induction = True
    metric = [m for m in enabled_metrics(config) if m.name == "induction"][0]
    cfg, params = model("gqa_qk_norm")
    mesh = make_mesh()
    x = jax.random.randint(jax.random.key(2), (4, 16), 10, 20)  # validation ids 10..19
    state = types.SimpleNamespace(params=params)
    row = compile_metric(metric, cfg, mesh, state, make_rules(cfg, mesh), x)(params, [(x, x)])
    ids = np.unique(np.asarray(x))
    tokens = induction.repeated_tokens(jax.random.key(0), 16, 8, cfg.vocab_size, ids=ids)  # n = T / 2 = 8 here
    assert set(np.unique(np.asarray(tokens))) <= set(ids)
    scores = np.asarray(induction.induction_scores(params, cfg, tokens))
    first, repeat = induction.repeated_loss(params, cfg, tokens)
    for l, h in np.ndindex(scores.shape):
        assert row[f"induction_score_l{l}h{h}"] == pytest.approx(float(scores[l, h]), rel=1e-5)
    assert row["induction_score_max"] == pytest.approx(float(scores.max()), rel=1e-5)
    assert row["first_half_loss"] == pytest.approx(float(first), rel=1e-5)
    assert row["repeat_loss"] == pytest.approx(float(repeat), rel=1e-5)
