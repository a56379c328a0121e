"""Tests of transformer/sampling/sampler.py: the logit filters, then generation against a cache-free loop."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tests.helpers.marks import first_fast

from transformer import sampling
from transformer.model.config import ModelConfig
from transformer.model.decoder import Decoder
from transformer.model.param_tree import unrolled
from transformer.model.ops import MASK_VALUE
from transformer.data.tokenizer import ByteTokenizer
from transformer.sampling.text import print_samples

# ---------------------------------------------------------------------------------------------
# Filters
# ---------------------------------------------------------------------------------------------


def kept(logits: jax.Array) -> np.ndarray:
    """[B, V] bool: the tokens a filter left unmasked."""
    return np.asarray(logits) > MASK_VALUE / 2


def test_apply_temperature_divides_logits():
    logits = jnp.array([[1.0, -2.0, 4.0]])
    np.testing.assert_allclose(sampling.apply_temperature(logits, 0.5), [[2.0, -4.0, 8.0]])
    with pytest.raises(ValueError, match="temperature=0"):
        sampling.apply_temperature(logits, 0.0)


def test_top_k_keeps_exactly_k_even_with_ties():
    logits = jnp.array([[0.0, 3.0, 1.0, 3.0, 2.0, 3.0], [5.0, 4.0, 3.0, 2.0, 1.0, 0.0]])
    out = sampling.top_k_filter(logits, 2)
    assert kept(out).sum(axis=1).tolist() == [2, 2]
    assert set(np.flatnonzero(kept(out)[1])) == {0, 1}
    assert set(np.flatnonzero(kept(out)[0])) <= {1, 3, 5}  # two of the three tied maxima
    np.testing.assert_array_equal(np.asarray(out)[kept(out)], np.asarray(logits)[kept(out)])
    assert kept(sampling.top_k_filter(logits, 100)).all()  # k >= V keeps everything


def test_top_p_keeps_the_smallest_set_reaching_p():
    probs = np.array([[0.1, 0.5, 0.05, 0.25, 0.1]])
    logits = jnp.log(jnp.asarray(probs, jnp.float32))
    # Sorted: 0.5, 0.25, 0.1, 0.1, 0.05 -> cumulative 0.5, 0.75, 0.85, ...
    assert set(np.flatnonzero(kept(sampling.top_p_filter(logits, 0.5))[0])) == {1}
    assert set(np.flatnonzero(kept(sampling.top_p_filter(logits, 0.6))[0])) == {1, 3}
    assert set(np.flatnonzero(kept(sampling.top_p_filter(logits, 0.75))[0])) == {1, 3}
    assert kept(sampling.top_p_filter(logits, 0.8)).sum() == 3
    assert kept(sampling.top_p_filter(logits, 1.0)).all()


def test_top_p_always_keeps_the_most_likely_token():
    logits = jax.random.normal(jax.random.key(0), (8, 50))
    out = sampling.top_p_filter(logits, 1e-6)
    assert kept(out).sum(axis=1).tolist() == [1] * 8
    np.testing.assert_array_equal(kept(out).argmax(axis=1), np.asarray(logits).argmax(axis=1))


def test_sample_token_with_temperature_zero_is_argmax():
    logits = jax.random.normal(jax.random.key(1), (16, 64))
    tokens = sampling.sample_token(logits, jax.random.key(2), temperature=0.0, top_k=3, top_p=0.5)
    np.testing.assert_array_equal(tokens, np.asarray(logits).argmax(axis=1))
    assert tokens.dtype == jnp.int32


def test_sample_token_draws_from_the_filtered_distribution():
    logits = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05]]))
    keys = jax.random.split(jax.random.key(3), 4000)

    def draw(**options) -> np.ndarray:
        return np.asarray(jax.vmap(lambda k: sampling.sample_token(logits, k, **options)[0])(keys))

    freq = np.bincount(draw(), minlength=4) / len(keys)
    np.testing.assert_allclose(freq, [0.5, 0.3, 0.15, 0.05], atol=0.03)
    # top_k=2 renormalises over the two most likely tokens: 0.5 / 0.8 and 0.3 / 0.8.
    freq_k = np.bincount(draw(top_k=2), minlength=4) / len(keys)
    np.testing.assert_allclose(freq_k, [0.625, 0.375, 0.0, 0.0], atol=0.03)
    # temperature 0.5 squares the probabilities before renormalising.
    sharp = np.array([0.5, 0.3, 0.15, 0.05]) ** 2
    freq_t = np.bincount(draw(temperature=0.5), minlength=4) / len(keys)
    np.testing.assert_allclose(freq_t, sharp / sharp.sum(), atol=0.03)


def test_sample_token_rows_do_not_depend_on_the_batch():
    logits = jax.random.normal(jax.random.key(4), (5, 64))
    keys = sampling.row_keys(jax.random.key(5), 5)
    together = sampling.sample_token(logits, keys)
    alone = [int(sampling.sample_token(logits[b : b + 1], keys[b : b + 1])[0]) for b in range(5)]
    assert together.tolist() == alone


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(temperature=-1.0), "temperature must be >= 0"),
        (dict(top_k=0), "top_k must be at least 1"),
        (dict(top_p=0.0), r"top_p must be in \(0, 1\]"),
        (dict(top_p=1.5), r"top_p must be in \(0, 1\]"),
        # Not a number or infinite: rejected, not turned into all-NaN logits and token 0.
        (dict(temperature=float("nan")), r"temperature must be >= 0 and finite .*got nan"),
        (dict(temperature=float("inf")), r"temperature must be >= 0 and finite .*got inf"),
        (dict(top_p=float("nan")), r"top_p must be in \(0, 1\], got nan"),
        (dict(top_k=float("nan")), "top_k must be at least 1, got nan"),
        (dict(top_k=float("inf")), "top_k must be a whole number, got inf"),
    ],
)
def test_bad_sampling_options_are_named(options, message):
    with pytest.raises(ValueError, match=message):
        sampling.SamplingOptions(**options)
    with pytest.raises(ValueError, match=message):
        sampling.sample_token(jnp.zeros((1, 8)), jax.random.key(0), **options)


@pytest.mark.parametrize("options", [dict(pad_id=float("nan")), dict(stop_tokens=(1, float("inf")))])
def test_non_finite_token_ids_in_options_are_named(options):
    (option,) = options
    with pytest.raises(ValueError, match=f"{option} must be a whole number"):
        sampling.SamplingOptions(**options)


def test_apply_temperature_rejects_nan_and_inf():
    for temperature in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match="finite temperature > 0"):
            sampling.apply_temperature(jnp.zeros((1, 8)), temperature)


def test_seed_keys_are_jaxs_below_2_32_and_distinct_above():
    """#31: jax.random.key kept a seed's low 32 bits (--seed 4294967296 drew seed 0's sample) and
    overflowed past 2**63; seed_key keeps every seed below 2**32 on its key."""
    data = lambda seed: np.asarray(jax.random.key_data(sampling.seed_key(seed))).tolist()  # noqa: E731
    for seed in (0, 3, 2**31, 2**32 - 1):
        assert data(seed) == np.asarray(jax.random.key_data(jax.random.key(seed))).tolist()
    assert len({str(data(s)) for s in (0, 2**32, 2**32 + 3, 3, 2**63 - 1)}) == 5
    assert data(2**32 + 3) == [1, 3]
    for seed in (-1, 2**63, 99999999999999999999, 1.5):
        with pytest.raises(ValueError, match=r"the seed must be a whole number in \[0, 2\*\*63 - 1"):
            sampling.seed_key(seed)


class Chars:
    """A tokenizer of one id per character (ord), enough for encode_prompt."""

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]


def test_encode_prompt_leaves_room_for_the_new_tokens_asked():
    cfg = ModelConfig(**TINY)  # max_seq_len 64
    with pytest.raises(ValueError, match="has 64 tokens but the model's context is max_seq_len=64, leaving no room"):
        sampling.encode_prompt(cfg, Chars(), "x" * 64)
    assert sampling.encode_prompt(cfg, Chars(), "x" * 64, new_tokens=0) == [120] * 64  # a forward pass only
    with pytest.raises(ValueError, match=r"has 65 tokens but the model's context is max_seq_len=64; shorten"):
        sampling.encode_prompt(cfg, Chars(), "x" * 65, new_tokens=0)


# ---------------------------------------------------------------------------------------------
# Generation
# ---------------------------------------------------------------------------------------------

TINY = dict(vocab_size=64, max_seq_len=64, d_model=32, num_layers=2, num_heads=4)
VARIANTS = {  # between them: every attention, position, norm and MLP kind, tied and untied heads
    "mha": ModelConfig(**TINY),  # the default model's architecture (GPT-2 style)
    "gqa": ModelConfig(**TINY, num_kv_heads=2, position="rope", scan_layers=False, tie_embeddings=False),
    "mqa": ModelConfig(
        **TINY, num_kv_heads=1, position="sinusoidal", norm="rmsnorm", activation="swiglu", prenorm=False
    ),
    "mla": ModelConfig(
        **TINY, attention="mla", head_dim=8, kv_latent_dim=16, q_latent_dim=24, rope_head_dim=8,
        position="rope", tie_embeddings=False,
    ),
    # a sink logit per head and registers: the prefill writes the registers' cache slots, decoding reads them
    "sinks": ModelConfig(**TINY, num_kv_heads=2, position="rope", attention_sink=True, num_registers=2),
    # the training-recipe options: qk-normed keys in the cache, squared ReLU, soft-capped logits
    "recipe": ModelConfig(**TINY, num_kv_heads=2, position="rope", norm="rmsnorm", use_bias=False,
                          tie_embeddings=False, qk_norm=True, activation="relu2", logit_softcap=15.0),
    # sliding windows: ring-buffer caches that wrap while decoding (prompts and generations longer than W)
    "window": ModelConfig(**TINY, num_kv_heads=2, position="rope", attention_window=4, attention_sink=True),
    # local and global MLA layers, scanned: the prefill unrolls them (a mixed cache does not stack)
    "window_mixed": ModelConfig(**{**TINY, "num_layers": 4}, attention="mla", kv_latent_dim=16, position="none",
                                attention_window=3, global_every=2),
}
PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10], [11]]  # a ragged batch
NEW = 10  # new tokens: the tests share it, so they share compiled functions too
SAMPLED = dict(temperature=1.0, top_k=20, top_p=0.95)  # sampled, with both filters on


@functools.cache
def model(variant: str) -> tuple[ModelConfig, dict]:
    """A tiny model with random parameters drawn by numpy (no init to compile).

    Weights N(0, 0.1) and norm gains of 5 make the logits spread out, so that the next tokens
    vary and greedy argmaxes are clear of ties.
    """
    cfg = VARIANTS[variant]
    shapes = jax.eval_shape(lambda: Decoder(cfg).init(jax.random.key(0), jnp.zeros((1, 1), jnp.int32)))
    rng = np.random.default_rng(0)

    def draw(path, leaf: jax.ShapeDtypeStruct) -> jax.Array:
        if path[-1].key == "scale":
            return jnp.full(leaf.shape, 5.0, jnp.float32)
        return jnp.asarray(rng.normal(0.0, 0.1, leaf.shape), jnp.float32)

    return cfg, jax.tree_util.tree_map_with_path(draw, shapes["params"])


def greedy_without_cache(variant: str, prompts: list[list[int]], steps: int) -> np.ndarray:
    """The reference, [B, steps]: re-run the full cache-free forward on the growing sequences.

    The sequences sit in a fixed-length buffer so that one compilation serves every step; the
    forward is causal, so the tokens after row b's last position n_b - 1 do not change its logit.
    """
    cfg, params = model(variant)
    forward = jax.jit(lambda p, x: Decoder(cfg).apply({"params": p}, x)[0])
    buffer = np.zeros((len(prompts), cfg.max_seq_len), np.int32)
    ends = np.array([len(p) for p in prompts])  # [B] each row's length so far
    for b, prompt in enumerate(prompts):
        buffer[b, : len(prompt)] = prompt
    rows = np.arange(len(prompts))
    for _ in range(steps):
        logits = np.asarray(forward(params, buffer))[rows, ends - 1]  # [B, V]
        top2 = np.sort(logits, axis=-1)[:, -2:]
        assert (top2[:, 1] - top2[:, 0] > 1e-4).all(), "near-tie in the reference: change the seed"
        buffer[rows, ends] = logits.argmax(axis=-1)
        ends += 1
    return np.stack([buffer[b, len(p) : len(p) + steps] for b, p in enumerate(prompts)])


@pytest.mark.parametrize("variant", first_fast(list(VARIANTS), list(VARIANTS)))
def test_greedy_generate_equals_argmax_loop_without_cache(variant):
    cfg, params = model(variant)
    out = sampling.generate(params, cfg, PROMPTS, jax.random.key(0), NEW, temperature=0.0)
    assert out.tokens.shape == (3, NEW) and out.tokens.dtype == np.int32
    assert out.lengths.tolist() == [NEW] * 3
    np.testing.assert_array_equal(out.tokens, greedy_without_cache(variant, PROMPTS, NEW))


def test_ragged_batch_equals_one_prompt_at_a_time():
    cfg, params = model("mha")
    key = jax.random.key(7)
    batch = sampling.generate(params, cfg, PROMPTS, key, NEW, **SAMPLED)
    keys = sampling.row_keys(key, len(PROMPTS))  # row b's key in the batch
    for b, prompt in enumerate(PROMPTS):
        alone = sampling.generate(params, cfg, [prompt], keys[b : b + 1], NEW, **SAMPLED)
        np.testing.assert_array_equal(alone.tokens[0], batch.tokens[b])


def test_stop_tokens_end_a_row_with_padding_after():
    cfg, params = model("mha")
    greedy = sampling.generate(params, cfg, PROMPTS, jax.random.key(0), NEW, temperature=0.0).tokens
    stop = int(greedy[1, 3])  # a token greedy decoding is known to emit in row 1
    out = sampling.generate(
        params, cfg, PROMPTS, jax.random.key(0), NEW, temperature=0.0, stop_tokens=[stop], pad_id=-1
    )
    for b in range(len(PROMPTS)):
        hits = np.flatnonzero(greedy[b] == stop)
        length = int(hits[0]) + 1 if hits.size else NEW
        assert out.lengths[b] == length
        np.testing.assert_array_equal(out.tokens[b, :length], greedy[b, :length])
        assert (out.tokens[b, length:] == -1).all()
    assert out.lengths[1] <= 4


def test_same_seed_same_output_and_another_seed_differs():
    cfg, params = model("mha")

    def run(seed: int) -> np.ndarray:
        return sampling.generate(params, cfg, PROMPTS, jax.random.key(seed), NEW, **SAMPLED).tokens

    np.testing.assert_array_equal(run(1), run(1))
    assert not np.array_equal(run(1), run(2))


def test_second_call_with_the_same_shapes_does_not_recompile():
    cfg, params = model("mha")
    sampling.generate(params, cfg, PROMPTS, jax.random.key(0), NEW, **SAMPLED)
    compiled = sampling.prefill._cache_size(), sampling.decode._cache_size()
    sampling.generate(params, cfg, PROMPTS, jax.random.key(1), NEW, **SAMPLED)
    # Other prompt lengths that round up to the same buckets reuse the compiled functions too.
    sampling.generate(params, cfg, [[5, 6], [7] * 11, [8, 9, 10]], jax.random.key(2), NEW, **SAMPLED)
    assert (sampling.prefill._cache_size(), sampling.decode._cache_size()) == compiled


def test_prompt_past_the_context_is_an_error_naming_both_numbers():
    cfg, params = model("mha")
    with pytest.raises(ValueError, match=r"50 tokens and max_new_tokens is 20.*max_seq_len=64"):
        sampling.generate(params, cfg, [[1] * 50], jax.random.key(0), max_new_tokens=20)


@pytest.mark.parametrize(
    "prompts, message",
    [([[1, 2], []], "prompt 1 is empty"), ([], "no prompts"), ([[1, 64]], r"outside \[0, 64\)")],
)
def test_bad_prompts_are_named(prompts, message):
    cfg, params = model("mha")
    with pytest.raises(ValueError, match=message):
        sampling.generate(params, cfg, prompts, jax.random.key(0), max_new_tokens=4)


def test_generate_and_generate_stream_reject_a_nan_temperature():
    cfg, params = model("mha")
    with pytest.raises(ValueError, match="temperature must be >= 0 and finite"):
        sampling.generate(params, cfg, PROMPTS, jax.random.key(0), NEW, temperature=float("nan"))
    with pytest.raises(ValueError, match="temperature must be >= 0 and finite"):
        next(sampling.generate_stream(params, cfg, PROMPTS, jax.random.key(0), NEW, temperature=float("nan")))


def test_stream_equals_one_shot_generate():
    cfg, params = model("mha")
    one_shot = sampling.generate(params, cfg, PROMPTS, jax.random.key(3), NEW, **SAMPLED)
    chunks = list(
        sampling.generate_stream(params, cfg, PROMPTS, jax.random.key(3), NEW, **SAMPLED, chunk_size=3)
    )
    assert [c.shape for c in chunks] == [(3, 1), (3, 3), (3, 3), (3, 3)]
    np.testing.assert_array_equal(np.concatenate(chunks, axis=1), one_shot.tokens)


def test_stream_stops_once_every_row_is_done():
    cfg, params = model("mha")
    first = int(greedy_without_cache("mha", PROMPTS[:1], 1)[0, 0])
    chunks = list(sampling.generate_stream(
        params, cfg, PROMPTS[:1], jax.random.key(0), NEW, temperature=0.0, stop_tokens=[first]
    ))
    assert len(chunks) == 1 and chunks[0].tolist() == [[first]]


def test_decode_unrolls_a_scanned_layer_stack():
    """A scanned stack would read each layer's weights through a per-step dynamic slice (a copy
    on XLA:CPU); decode unrolls it, so its program slices no more than the unscanned model's."""
    cfg, params = model("mha")
    assert cfg.scan_layers
    params_u, cfg_u = unrolled(params, cfg)
    assert not cfg_u.scan_layers and "layers" not in params_u
    state = sampling.prefill(
        params, cfg, np.array([[1, 2, 3]], np.int32), np.array([3], np.int32),
        sampling.row_keys(jax.random.key(0), 1), 16, sampling.SamplingOptions(temperature=0.0),
    )
    args = (state, 4, sampling.SamplingOptions(temperature=0.0))
    _, scanned, _ = sampling.decode(params, cfg, *args)
    _, unscanned, _ = sampling.decode(params_u, cfg_u, *args)
    np.testing.assert_array_equal(scanned, unscanned)

    def dynamic_slices(p, c) -> int:
        return sampling.decode.lower(p, c, *args).compile().as_text().count(" dynamic-slice(")

    assert dynamic_slices(params, cfg) == dynamic_slices(params_u, cfg_u)


def test_decode_updates_the_cache_in_place():
    """Inside the decode loop nothing copies or slices a layer's cache buffer: the write after the
    layers is ordered after their reads (cache.write's `after`), so XLA updates the buffers in place,
    and each layer reads its own buffer (a stacked [L, ...] cache was sliced per layer every step)."""
    cfg, params = model("gqa")
    state = sampling.prefill(
        params, cfg, np.array([[1, 2, 3]], np.int32), np.array([3], np.int32),
        sampling.row_keys(jax.random.key(0), 1), 16, sampling.SamplingOptions(temperature=0.0),
    )
    hlo = sampling.decode.lower(params, cfg, state, 4, sampling.SamplingOptions(temperature=0.0)).compile().as_text()
    buffer = "f32[1,%d,16,%d]{3,2,1,0}" % (cfg.num_kv_heads, cfg.head_dim)  # one layer's keys or values
    loop_computations = [c for c in hlo.split("\n\n") if not c.startswith("ENTRY")]
    updates = sum(c.count(f"{buffer} dynamic-update-slice(") for c in loop_computations)
    copies = sum(c.count(f"{buffer} {op}(") for c in loop_computations for op in ("copy", "slice"))
    assert updates == 2 * cfg.num_layers and copies == 0


@pytest.mark.slow  # make test-all only (the default set's time: docs/performance.md)
def test_a_head_larger_than_the_tokenizer_never_draws_an_id_the_tokenizer_lacks(capsys):
    """Logits over 300 ids that favour ids 256-299: with vocab_limit=256 greedy and sampled draws
    are all bytes; without it they are the ids past the byte tokenizer. sample.py's print_samples
    passes the tokenizer's size: a model with such a head prints decodable text."""
    logits = jnp.concatenate([jnp.zeros((4, 256)), jnp.full((4, 44), 20.0)], axis=1)  # [B, V]
    keys = sampling.row_keys(jax.random.key(1), 4)
    for temperature in (0.0, 1.0):
        free = sampling.SamplingOptions(temperature=temperature)
        bound = sampling.SamplingOptions(temperature=temperature, vocab_limit=256)
        assert (np.asarray(sampling.sampler._draw(logits, keys, 0, free)) >= 256).all()
        assert (np.asarray(sampling.sampler._draw(logits, keys, 0, bound)) < 256).all()
    with pytest.raises(ValueError, match="vocab_limit must be at least 1, got 0; use None"):
        sampling.SamplingOptions(vocab_limit=0)

    cfg = ModelConfig(vocab_size=300, max_seq_len=8, d_model=16, num_layers=1, num_heads=2, tie_embeddings=False)
    params = jax.jit(Decoder(cfg).init)(jax.random.key(0), jnp.zeros((1, 4), jnp.int32))["params"]
    head = params["head"]["kernel"]  # [V, D]: logits of ids < 256 are 0, of the others +-500 |h|
    params = {**params, "head": {"kernel": head.at[:256].set(0.0).at[256:].multiply(500.0)}}
    print_samples(cfg, params, ByteTokenizer(), "Hi", 1, 6, seed=0, chunk_size=6, temperature=0.0)
    assert capsys.readouterr().out.startswith("--- sample 1 of 1 ---\nHi")  # decode raises on an id >= 256
