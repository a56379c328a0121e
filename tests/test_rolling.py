"""Tests of generation past the context (kv_cache.init_rolling_cache, generate's `sinks`): one
rolling layer is StreamingLLM's computation exactly (the first S tokens and the last max_seq_len - S,
RoPE positions assigned within the cache), the cache keeps its size for 8x the context, a request that
fits gives what the plain cache gives, and learned positions refuse by name."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers.decoder import jit, random_params
from transformer import ModelConfig, sampling
from transformer.analysis.capture import sown_points
from transformer.model import kv_cache, ops, points
from transformer.model.decoder import Decoder
from transformer.model.key_view import key_view
from transformer.sampling.sampler import _start, decode, SamplingOptions

CONTEXT, S = 8, 2
BASE = dict(vocab_size=64, max_seq_len=CONTEXT, d_model=32, num_heads=4, scan_layers=False)
KINDS = {"gqa-rope": dict(num_kv_heads=2, position="rope"), "mha-none": dict(position="none"),
         "mla-rope": dict(attention="mla", kv_latent_dim=12, rope_head_dim=4, position="rope"),
         "mla-none": dict(attention="mla", kv_latent_dim=12, position="none"),
         "gqa-alibi": dict(num_kv_heads=2, position="alibi"),
         "mla-alibi": dict(attention="mla", kv_latent_dim=12, position="alibi"),
         "gqa-alibi-registers": dict(num_kv_heads=2, position="alibi", num_registers=2),
         # register tokens stay in the cache for good, before the sinks, at positions -R..-1
         "gqa-rope-registers": dict(num_kv_heads=2, position="rope", num_registers=2),
         "mla-rope-registers": dict(attention="mla", kv_latent_dim=12, rope_head_dim=4, position="rope",
                                    num_registers=3)}
FAST = {("gqa-rope", S), ("gqa-rope-registers", 0), ("gqa-alibi", S)}  # in make test; the other cases in make test-all
CASES = [pytest.param(kind, sinks, marks=() if (kind, sinks) in FAST else pytest.mark.slow)
         for kind, sinks in [(kind, S) for kind in KINDS] + [("gqa-rope-registers", 0), ("mla-rope-registers", 1)]]


@pytest.mark.parametrize("kind,sinks", CASES)
def test_one_rolling_layer_is_streaming_llm(kind, sinks):
    """Decoding 20 tokens with a context of 8 and S sinks (2, or 0 and 1 with registers): the logit at
    t is the model's own forward over tokens 0..S-1 and the last 8 - S up to t, numbered 0..7
    (StreamingLLM's positions within the cache; registers, if any, before them at -R..-1). One
    layer, so every cached key is a function of its token and position alone."""
    cfg = ModelConfig(**BASE, num_layers=1, **KINDS[kind])
    model = Decoder(cfg)
    params = random_params(model)
    step = jit(lambda p, x, pos, c: model.apply({"params": p}, x, pos, c))
    forward = jit(lambda p, x: model.apply({"params": p}, x)[0])
    x = np.random.default_rng(0).integers(0, 64, (2, 20)).astype(np.int32)
    cache = kv_cache.init_rolling_cache(cfg, 2, sinks)
    shapes = [a.shape for a in jax.tree.leaves(cache)]
    logits, cache = step(params, x[:, :5], np.broadcast_to(np.arange(5), (2, 5)), cache)
    np.testing.assert_allclose(logits, forward(params, x[:, :5]), rtol=1e-5, atol=1e-5)
    for t in range(5, 20):
        logits, cache = step(params, x[:, t : t + 1], np.full((2, 1), t), cache)
        kept = list(range(sinks)) + list(range(max(sinks, t - (CONTEXT - sinks) + 1), t + 1))
        np.testing.assert_allclose(logits[:, 0], forward(params, x[:, kept])[:, -1], rtol=1e-5, atol=1e-5,
                                   err_msg=f"t={t}")
        assert [a.shape for a in jax.tree.leaves(cache)] == shapes  # constant memory


@pytest.mark.parametrize("kind", ["gqa-rope-registers", "mla-rope-registers"])
def test_a_captured_step_past_the_context_computes_what_decoding_does(kind):
    """Past the context a step that captures reads what decoding reads: the kept slots in place, one
    column per slot. Both give the same logits, and the captured pattern has R + C + 1 columns summing
    to 1."""
    cfg = ModelConfig(**BASE, num_layers=2, **KINDS[kind])
    model = Decoder(cfg)
    params = random_params(model)
    step = jit(lambda p, x, pos, c: model.apply({"params": p}, x, pos, c))
    captured = jit(lambda p, x, pos, c: model.apply({"params": p}, x, pos, c, mutable=[points.COLLECTION]))
    x = np.random.default_rng(1).integers(0, 64, (2, 14)).astype(np.int32)
    cache = kv_cache.init_rolling_cache(cfg, 2, S)
    _, cache = step(params, x[:, :CONTEXT], np.broadcast_to(np.arange(CONTEXT), (2, CONTEXT)), cache)
    for t in range(CONTEXT, 14):
        pos = np.full((2, 1), t)
        logits, cache_after = step(params, x[:, t : t + 1], pos, cache)
        (seen, _), sown = captured(params, x[:, t : t + 1], pos, cache)
        np.testing.assert_allclose(seen, logits, rtol=1e-5, atol=1e-5, err_msg=f"t={t}")
        pattern = sown_points(sown[points.COLLECTION], cfg, 0)["blocks.0.attn.pattern"]  # [B, H, 1, R + C + 1]
        assert pattern.shape[-1] == cfg.num_registers + CONTEXT + 1
        np.testing.assert_allclose(pattern.sum(-1), 1.0, rtol=1e-5)
        cache = cache_after


def test_the_ring_holds_its_kept_keys_turned_for_the_next_position():
    """Under RoPE a rolling ring keeps its registers' and sinks' keys as written in `kept` (never
    turned) and, after every call, in its own kept slots turned by the shift of the position after
    the last one written; so a one-token step's key view reads the ring as it lies (no shift, no
    join), and a call of several tokens joins the copy turned by its last query's shift."""
    cfg = ModelConfig(**BASE, num_layers=1, **KINDS["gqa-rope-registers"])
    model, r = Decoder(cfg), cfg.num_registers
    params = random_params(model)
    step = jit(lambda p, x, pos, c: model.apply({"params": p}, x, pos, c))
    x = np.random.default_rng(2).integers(0, 64, (2, 30)).astype(np.int32)
    cache = kv_cache.init_rolling_cache(cfg, 2, S)
    _, cache = step(params, x[:, :5], np.broadcast_to(np.arange(5), (2, 5)), cache)
    unturned = np.asarray(cache[0].kept)  # [B, G, R + S, K]
    assert unturned.shape == (2, 2, r + S, cfg.head_dim) and np.abs(unturned).min() > 0
    for t in range(5, 30):
        _, cache = step(params, x[:, t : t + 1], np.full((2, 1), t), cache)
        np.testing.assert_array_equal(cache[0].kept, unturned)
        shift = jnp.full((2, r + S), max(t + 1 - (CONTEXT - 1), 0))  # for the query at t + 1
        turned = ops.rope_turn(jnp.moveaxis(jnp.asarray(unturned), 1, 2), shift, cfg.rope_theta)
        np.testing.assert_allclose(cache[0].k[:, :, : r + S], jnp.moveaxis(turned, 1, 2), rtol=1e-6, atol=1e-6)
    one, two = (key_view(cfg, np.full((2, n), 30) + np.arange(n), cache[0]) for n in (1, 2))
    assert one.shift is None and not one.joined and one.unturned is None and len(one.positions) == 2
    assert two.joined and two.unturned is cache[0].kept and np.asarray(two.shift).tolist() == [24, 24]


@pytest.mark.slow  # make test-all only (the default set's time: docs/performance.md)
def test_generation_runs_8x_the_context_with_a_constant_cache():
    """A 2-layer RoPE model with local and global layers: generate 8x its context; the cache's
    arrays keep their shapes from the prefill to the last step, and inside the context the rolling
    cache gives the plain cache's tokens."""
    cfg = ModelConfig(**{**BASE, "max_seq_len": 16}, num_layers=2, num_kv_heads=2, position="rope",
                      attention_window=4, global_every=2)
    params = random_params(Decoder(cfg))
    prompts, key, options = [[1, 2, 3], [4, 5, 6, 7, 8, 9]], jax.random.key(0), SamplingOptions(temperature=0.0)
    state = _start(params, cfg, prompts, key, 8 * 16, options, sinks=4)
    assert [c.k.shape[2] for c in state.cache] == [4, 16] and tuple(c.sinks for c in state.cache) == (0, 4)
    after, tokens, _ = decode(params, cfg, state, 8 * 16 - 1, options)
    assert jax.tree.map(jnp.shape, after.cache) == jax.tree.map(jnp.shape, state.cache)
    assert tokens.shape == (2, 8 * 16 - 1) and np.asarray(after.positions).tolist() == [3 + 127, 6 + 127]
    assert int(np.asarray(after.cache[1].positions).max()) == 6 + 126  # the last position written
    fits = sampling.generate(params, cfg, prompts, key, 10, temperature=0.0)
    rolled = sampling.generate(params, cfg, prompts, key, 10, sinks=4, temperature=0.0)
    np.testing.assert_array_equal(rolled.tokens, fits.tokens)
    long = sampling.generate(params, cfg, prompts, key, 8 * 16, sinks=4, temperature=0.0)
    np.testing.assert_array_equal(long.tokens[:, :10], fits.tokens)


def test_learned_positions_and_requests_past_the_context_are_refused_by_name():
    learned = ModelConfig(**BASE, num_layers=1)
    params = random_params(Decoder(learned))
    with pytest.raises(ValueError, match="needs position='rope' or 'none' or 'alibi', not 'learned'"):
        sampling.generate(params, learned, [[1, 2]], jax.random.key(0), 20, sinks=2)
    with pytest.raises(ValueError, match="pass sinks=S"):
        sampling.generate(params, learned, [[1, 2]], jax.random.key(0), 20)
    rope = learned.replace(position="rope")
    with pytest.raises(ValueError, match=r"sinks must be in \[0, max_seq_len=8\)"):
        kv_cache.init_rolling_cache(rope, 1, 8)
    with pytest.raises(ValueError, match="prompt 0 has 9 tokens"):
        sampling.generate(random_params(Decoder(rope)), rope, [list(range(9))], jax.random.key(0), 20, sinks=2)


def test_rolling_nll_is_the_loss_of_streaming_llms_window():
    """analysis.streaming.rolling_nll on a one-layer model with registers, context 8, S = 1, a text of
    20: within the context the plain forward's loss; past it the loss of the forward over token 0 and
    the last 7 tokens (StreamingLLM's window), each next token's -log p."""
    from transformer.experiments.sinks.streaming import rolling_nll

    cfg = ModelConfig(**BASE, num_layers=1, **KINDS["gqa-rope-registers"])
    model = Decoder(cfg)
    params = random_params(model)
    forward = jit(lambda p, x: model.apply({"params": p}, x)[0])
    x = np.random.default_rng(1).integers(0, 64, (2, 20)).astype(np.int32)
    nll = np.asarray(rolling_nll(params, cfg, x, 1))
    assert nll.shape == (2, 19)
    for t in range(19):
        kept = [0] + list(range(max(1, t - (CONTEXT - 1) + 1), t + 1)) if t >= CONTEXT else list(range(t + 1))
        log_p = jax.nn.log_softmax(forward(params, x[:, kept])[:, -1])
        np.testing.assert_allclose(nll[:, t], -log_p[np.arange(2), x[:, t + 1]], rtol=1e-5, atol=1e-5,
                                   err_msg=f"t={t}")


def test_the_model_line_gives_the_rolling_caches_constant_size():
    """sample.py --sinks S: the model line's size is the bytes of the cache generate builds (its
    buffers and slot records), whatever the length."""
    cfg = ModelConfig(**BASE, num_layers=2, num_kv_heads=2, position="rope", num_registers=2)
    size = kv_cache.measured_bytes(kv_cache.init_rolling_cache(cfg, 1, S))
    assert f"a constant {size:,} bytes a row (the first {S} tokens and the last {CONTEXT - S} in every layer)" in \
        kv_cache.describe_cache_size(cfg, S)
    assert "constant" not in kv_cache.describe_cache_size(cfg)
