"""Sampling: logit filters, prefill, the `lax.scan` decode loop, and generate / generate_stream.

Two compiled stages over a ragged batch: `prefill` runs the right-padded prompts once, filling the
cache and drawing each row's first token; `decode` is a `lax.scan` of steps. Shapes are bucketed (64,
128, ...) to reuse compiles. Row b's i-th token uses fold_in(fold_in(key, b), i): independent of the
other rows and of how decoding is chunked.

Shapes: B batch, P padded prompt length, S cache slots, V vocabulary, N new tokens."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from transformer.model.kv_cache import PAD_POSITION, Cache, init_cache, init_rolling_cache
from transformer.model.config import ModelConfig
from transformer.model.decoder import Decoder
from transformer.model.edits import Edit, check_for_sampling, run
from transformer.model.param_tree import unrolled
from transformer.model.ops import MASK_VALUE
from transformer.model.positions import scheme

Array = jax.Array

# Cache and prompt lengths are rounded up to the next of these sizes (doubling past the last one),
# capped at the model's context: a handful of compiled shapes instead of one per prompt length.
SMALLEST_BUCKET = 64


# ----------------------------------------------------------------------------- logit filters, [B, V] float32


def apply_temperature(logits: Array, temperature: float) -> Array:
    """[B, V] logits / temperature (> 0); greedy (0) is `sample_token`'s argmax."""
    if not 0 < temperature < math.inf:  # also rejects NaN
        raise ValueError(f"apply_temperature needs a finite temperature > 0, got {temperature}; "
                         "for greedy decoding call sample_token with temperature=0")
    return logits / temperature


def top_k_filter(logits: Array, k: int) -> Array:
    """[B, V] float32 -> [B, V]: the k largest logits of each row kept (exactly k: ties broken by index),
    the rest MASK_VALUE. k >= V keeps everything; k >= 1 (`SamplingOptions` checks it)."""
    batch, vocab = logits.shape
    if k >= vocab:
        return logits
    _, kept = jax.lax.top_k(logits, k)  # [B, k] indices
    keep = jnp.zeros(logits.shape, bool).at[jnp.arange(batch)[:, None], kept].set(True)
    return jnp.where(keep, logits, MASK_VALUE)


def top_p_filter(logits: Array, p: float) -> Array:
    """Nucleus filter, [B, V] float32 -> [B, V]: keeps the most likely tokens while the mass taken
    before each is below p (so the first is always kept), the rest MASK_VALUE. p in (0, 1] (`SamplingOptions`)."""
    batch = logits.shape[0]
    order = jnp.argsort(-logits, axis=-1)  # [B, V] token ids, most likely first
    probs = jax.nn.softmax(jnp.take_along_axis(logits, order, axis=-1), axis=-1)
    # Exclusive prefix sum (mass strictly before each token), built without subtracting, so the
    # first token's mass-before is exactly 0 < p.
    mass_before = jnp.concatenate([jnp.zeros((batch, 1)), jnp.cumsum(probs, axis=-1)[:, :-1]], axis=-1)
    keep_sorted = mass_before < p
    keep = jnp.zeros(logits.shape, bool).at[jnp.arange(batch)[:, None], order].set(keep_sorted)
    return jnp.where(keep, logits, MASK_VALUE)


@dataclasses.dataclass(frozen=True)
class SamplingOptions:
    """How tokens are drawn and when a row stops; hashable (a static argument under jit). temperature:
    0 = greedy. top_k, top_p: None keeps every token. stop_tokens: a row drawing one is done (pad_id
    after). vocab_limit: draw only ids below it (the tokenizer's size under a padded head)."""

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    stop_tokens: Sequence[int] = ()
    pad_id: int = 0
    vocab_limit: int | None = None

    def __post_init__(self) -> None:
        # Each check reads "not (valid)": every comparison with NaN is False, so NaN fails it.
        if not 0 <= self.temperature < math.inf:
            raise ValueError(f"temperature must be >= 0 and finite (0 = greedy), got {self.temperature}")
        if self.top_k is not None and not self.top_k >= 1:
            raise ValueError(f"top_k must be at least 1, got {self.top_k}; use None to keep every token")
        if self.top_p is not None and not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}; use None or 1.0 to keep every token")
        # Normalise (numpy scalars, a list of stop tokens) so that equal options hash equally.
        set_field = functools.partial(object.__setattr__, self)
        set_field("temperature", float(self.temperature))
        set_field("top_k", None if self.top_k is None else _whole("top_k", self.top_k))
        set_field("top_p", None if self.top_p is None else float(self.top_p))
        set_field("stop_tokens", tuple(_whole("stop_tokens", t) for t in self.stop_tokens))
        set_field("pad_id", _whole("pad_id", self.pad_id))
        set_field("vocab_limit", None if self.vocab_limit is None else _whole("vocab_limit", self.vocab_limit))
        if self.vocab_limit is not None and self.vocab_limit < 1:
            raise ValueError(f"vocab_limit must be at least 1, got {self.vocab_limit}; use None to draw every id")


def _whole(option: str, value: int | float) -> int:
    """value as an int, or a ValueError naming the option (inf, NaN and 2.5 are neither counts nor ids)."""
    if not float(value).is_integer():
        raise ValueError(f"{option} must be a whole number, got {value}")
    return int(value)


def sample_token(logits: Array, key: Array, temperature: float = 1.0, top_k: int | None = None,
                 top_p: float | None = None) -> Array:
    """[B, V] float32 logits -> [B] int32 tokens: temperature (0: argmax), then top-k, then top-p, then
    a categorical draw with one key per row (`row_keys`: key, or [B] keys)."""
    SamplingOptions(temperature, top_k, top_p)  # validates the options with a clear error
    if temperature == 0:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    logits = apply_temperature(logits.astype(jnp.float32), temperature)
    if top_k is not None:
        logits = top_k_filter(logits, top_k)
    if top_p is not None and top_p < 1.0:
        logits = top_p_filter(logits, top_p)
    keys = row_keys(key, logits.shape[0])
    # One draw per row with that row's own key: a row's sample never depends on the others.
    return jax.vmap(jax.random.categorical)(keys, logits).astype(jnp.int32)


def encode_prompt(cfg: ModelConfig, tokenizer: Any, prompt: str, new_tokens: int = 1) -> list[int]:
    """Prompt text -> token ids [N]; a clear error when empty or N + new_tokens > max_seq_len (0: a forward)."""
    ids = tokenizer.encode(prompt)  # raises ValueError for text the tokenizer cannot represent
    if len(ids) == 0:
        raise ValueError("the prompt is empty; pass --prompt with at least one character")
    if len(ids) + new_tokens > cfg.max_seq_len:
        room = ", leaving no room for new tokens" if len(ids) <= cfg.max_seq_len else ""
        raise ValueError(f"the prompt has {len(ids)} tokens but the model's context is max_seq_len="
                         f"{cfg.max_seq_len}{room}; shorten the prompt")
    return ids


MAX_SEED = 2**63 - 1  # jax.random.key takes 64-bit seeds; without 64-bit mode it keeps the low 32 bits


def check_seed(seed: int) -> int:
    """`seed` as an int, or a ValueError unless it is a whole number in [0, MAX_SEED]."""
    if not isinstance(seed, (int, np.integer)) or not 0 <= seed <= MAX_SEED:
        raise ValueError(f"the seed must be a whole number in [0, 2**63 - 1 = {MAX_SEED}], got {seed!r}")
    return int(seed)


def seed_key(seed: int) -> Array:
    """The PRNG key of a seed in [0, 2**63), as jax.random.key makes it with 64-bit integers on (so
    seeds 2**32 apart differ and seeds below 2**32 keep their usual key); ValueError for other seeds."""
    seed = check_seed(seed)
    with jax.enable_x64(True):
        return jax.random.key(seed)


def row_keys(key: Array, batch_size: int) -> Array:
    """[B] per-row keys fold_in(key, b) (B keys: as they are; an int: a seed); row b alone: [b:b + 1]."""
    key = seed_key(key) if isinstance(key, int | np.integer) else key
    typed = jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
    if key.ndim == (1 if typed else 2):  # already one key per row
        if key.shape[0] != batch_size:
            raise ValueError(f"got {key.shape[0]} per-row keys for a batch of {batch_size} rows")
        return key
    return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, jnp.arange(batch_size))


def _draw(logits: Array, keys: Array, step: Array | int, options: SamplingOptions) -> Array:
    """[B, V] logits -> [B] int32: each row's step-th new token, drawn with fold_in(keys[b], step)."""
    step_keys = jax.vmap(jax.random.fold_in, in_axes=(0, None))(keys, step)
    if options.vocab_limit is not None and options.vocab_limit < logits.shape[-1]:
        logits = jnp.where(jnp.arange(logits.shape[-1]) < options.vocab_limit, logits, -jnp.inf)
    return sample_token(logits, step_keys, options.temperature, options.top_k, options.top_p)


def _is_stop(tokens: Array, stop_tokens: tuple[int, ...]) -> Array:
    """[B] int32 -> [B] bool, True where the token is a stop token."""
    if not stop_tokens:
        return jnp.zeros(tokens.shape, bool)
    return jnp.isin(tokens, jnp.asarray(stop_tokens, jnp.int32))


# ----------------------------------------------------------------------------- the two compiled stages


@flax.struct.dataclass
class DecodeState:
    """The `lax.scan` carry: everything one decode step needs and updates."""

    cache: Cache  # one cache per layer (model/kv_cache.py)
    tokens: Array  # [B] int32: each row's last drawn token, fed at the next step
    positions: Array  # [B] int32: row b's next position (where tokens[b] is written)
    keys: Array  # [B] per-row PRNG keys (`row_keys`)
    step: Array  # [] int32: how many new tokens each row has drawn
    done: Array  # [B] bool: the row has drawn a stop token; its later outputs are padding


def forward(params: dict, cfg: ModelConfig, tokens: Array, positions: Array, cache: Cache,
            edits: Sequence[Edit] = ()) -> tuple[Array, Cache]:
    """tokens [B, T] at positions [B, T] -> (logits [B, T, V], the updated cache); edits: model/edits.run."""
    if edits:
        return run(params, cfg, tokens, edits, positions=positions, cache=cache)
    return Decoder(cfg).apply({"params": params}, tokens, positions=positions, cache=cache)


@functools.partial(jax.jit, static_argnames=("cfg", "cache_len", "options", "sinks"))
def prefill(params: dict, cfg: ModelConfig, tokens: Array, lengths: Array, keys: Array, cache_len: int,
            options: SamplingOptions, edits: Sequence[Edit] = (), sinks: int | None = None,
            images: Array | None = None) -> DecodeState:
    """tokens [B, P] int32, right-padded prompts of lengths [B] (n_b >= 1), keys [B], cache_len S >= P
    -> the decode state after each row's first new token (positions [B] = lengths). Padding sits at
    PAD_POSITION (seen by no token, written to no slot: a ring would lose the prompt's end to it).
    edits: model/edits.py's, at every position. sinks: None, or S >= 0 for a rolling cache. images: a
    cross-attention model's encoder input [B, ...], encoded here once (its keys and values cached)."""
    batch, length = tokens.shape
    steps = jnp.arange(length, dtype=jnp.int32)[None, :]  # [1, P]
    positions = jnp.where(steps < lengths[:, None], steps, PAD_POSITION)  # [B, P]: padding at PAD_POSITION
    if len(set(cfg.layer_windows())) > 1 or sinks is not None:  # rings of several sizes do not stack
        params, cfg = unrolled(params, cfg)
    cache = init_cache(cfg, batch, cache_len) if sinks is None else init_rolling_cache(cfg, batch, sinks)
    data = tokens if images is None else {"image": images, "tokens": tokens}
    logits, cache = forward(params, cfg, data, positions, cache, edits)
    last = jnp.take_along_axis(logits, (lengths - 1)[:, None, None], axis=1)[:, 0]  # [B, V]
    first = _draw(last, keys, 0, options)
    return DecodeState(cache=cache, tokens=first, positions=lengths.astype(jnp.int32), keys=keys,
                       step=jnp.ones((), jnp.int32), done=_is_stop(first, options.stop_tokens))


def decode_step(params: dict, cfg: ModelConfig, state: DecodeState, options: SamplingOptions,
                edits: Sequence[Edit] = ()) -> tuple[DecodeState, tuple[Array, Array]]:
    """One token per row: feed the last tokens, append their keys/values, draw the next ->
    (next state, (tokens [B] int32, pad_id for rows already done, emitted [B] bool))."""
    logits, cache = forward(params, cfg, state.tokens[:, None], state.positions[:, None], state.cache, edits)
    drawn = _draw(logits[:, 0], state.keys, state.step, options)
    emitted = ~state.done
    # A done row keeps running (the batch moves in lockstep) but its draws are never shown.
    next_state = state.replace(cache=cache, tokens=drawn, positions=state.positions + 1, step=state.step + 1,
                               done=state.done | _is_stop(drawn, options.stop_tokens))
    return next_state, (jnp.where(emitted, drawn, options.pad_id), emitted)


@functools.partial(jax.jit, static_argnames=("cfg", "num_steps", "options"))
def decode(params: dict, cfg: ModelConfig, state: DecodeState, num_steps: int, options: SamplingOptions,
           edits: Sequence[Edit] = ()) -> tuple[DecodeState, Array, Array]:
    """`num_steps` decode steps in one `lax.scan` -> (last state, tokens [B, num_steps] int32, emitted
    [B, num_steps] bool). The layers unrolled first: a scan would copy every weight every step."""
    params, cfg = unrolled(params, cfg)
    state, (tokens, emitted) = jax.lax.scan(
        lambda carry, _: decode_step(params, cfg, carry, options, edits), state, length=num_steps
    )
    return state, tokens.T, emitted.T


# ----------------------------------------------------------------------------- host-side checks and buckets


class GenerateOutput(NamedTuple):
    tokens: np.ndarray  # [B, N] int32 new tokens, pad_id after a row's stop token
    lengths: np.ndarray  # [B] int32: each row's new tokens, its stop token included


def bucket(n: int, cap: int) -> int:
    """The smallest of 64, 128, 256, ... that is >= n, capped at `cap`."""
    size = SMALLEST_BUCKET
    while size < n:
        size *= 2
    return min(size, cap)


def generate(params: dict, cfg: ModelConfig, prompts: Sequence[Sequence[int]], key: Array, max_new_tokens: int,
             edits: Sequence[Edit] = (), sinks: int | None = None, images: Array | None = None,
             **sampling: Any) -> GenerateOutput:
    """Continues B prompts (token ids, lengths >= 1) by up to N = `max_new_tokens` tokens: one prefill,
    one `lax.scan` -> GenerateOutput(tokens [B, N], lengths [B]). key: a PRNG key or an int seed (row b
    uses fold_in(key, b)), or [B] keys. The longest prompt + N must fit in max_seq_len, unless `sinks` =
    S >= 0: past the context at constant memory (init_rolling_cache). edits: model/edits.py's, at every
    position, e.g. `ablate_heads`. images: one per prompt, for a cross-attention model (inputs='image_text').
    sampling: SamplingOptions' fields."""
    options = SamplingOptions(**sampling)
    edits = list(edits)
    check_for_sampling(edits, cfg)
    state = _start(params, cfg, prompts, key, max_new_tokens, options, edits, sinks, images)
    first = state.tokens[:, None]  # the first new token: no row is done before it
    _, rest, emitted = decode(params, cfg, state, max_new_tokens - 1, options, edits)
    tokens = np.asarray(jnp.concatenate([first, rest], axis=1))
    lengths = 1 + np.asarray(emitted).sum(axis=1, dtype=np.int32)
    return GenerateOutput(tokens=tokens, lengths=lengths)


def generate_stream(params: dict, cfg: ModelConfig, prompts: Sequence[Sequence[int]], key: Array,
                    max_new_tokens: int, chunk_size: int = 16, sinks: int | None = None,
                    images: Array | None = None, **sampling: Any) -> Iterator[np.ndarray]:
    """`generate`, yielding new tokens as made: [B, 1], then [B, <= chunk_size] per scan (joined: `generate`'s)."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be at least 1, got {chunk_size}")
    options = SamplingOptions(**sampling)
    state = _start(params, cfg, prompts, key, max_new_tokens, options, sinks=sinks, images=images)
    yield np.asarray(state.tokens)[:, None]  # the first token at once: time to first token
    params, cfg = unrolled(params, cfg)  # once for all chunks; see decode
    made = 1
    while made < max_new_tokens and not bool(state.done.all()):
        steps = min(chunk_size, max_new_tokens - made)
        state, tokens, _ = decode(params, cfg, state, steps, options)
        made += steps
        yield np.asarray(tokens)


def _start(params: dict, cfg: ModelConfig, prompts: Sequence[Sequence[int]], key: Array, max_new_tokens: int,
           options: SamplingOptions, edits: Sequence[Edit] = (), sinks: int | None = None,
           images: Array | None = None) -> DecodeState:
    """Checks the request, right-pads the prompts to a bucketed length and runs the prefill."""
    rows = _check_prompts(cfg, prompts, max_new_tokens, rolling=sinks is not None)
    if sinks is not None:  # the rolling cache refuses learned positions and bad counts by name
        init_rolling_cache(cfg, 1, sinks, dtype="float32")
    longest = max(len(r) for r in rows)
    # A rolling cache has max_seq_len slots per global layer whatever the request (cache_len unused).
    cache_len = cfg.max_seq_len if sinks is not None else bucket(longest + max_new_tokens, cfg.max_seq_len)
    padded_len = bucket(longest, cache_len)
    # Padding uses token 0, a valid id, at PAD_POSITION (prefill): never attended to, never written.
    tokens = np.zeros((len(rows), padded_len), np.int32)
    for b, row in enumerate(rows):
        tokens[b, : len(row)] = row
    lengths = np.array([len(r) for r in rows], np.int32)
    if (images is None) == cfg.cross_attention:
        raise ValueError("a cross-attention model (inputs='image_text') generates from images=[B, ...] with the "
                         "prompts, one per prompt; another model takes no images" if cfg.cross_attention else
                         "images are read by a cross-attention model only (inputs='image_text'); pass images=None")
    return prefill(params, cfg, tokens, lengths, row_keys(key, len(rows)), cache_len, options, edits, sinks, images)


def _check_prompts(cfg: ModelConfig, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                   rolling: bool = False) -> list[np.ndarray]:
    """Each prompt as a 1-D integer array, or a ValueError naming the fix. rolling: only the prompts must fit."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    rows = [np.asarray(p) for p in prompts]
    if not rows:
        raise ValueError("no prompts given; pass a list of token-id sequences")
    for b, row in enumerate(rows):
        if row.ndim != 1 or (row.size and not np.issubdtype(row.dtype, np.integer)):
            raise ValueError(f"prompt {b} must be a 1-D sequence of integer token ids, got shape {row.shape} "
                             f"and dtype {row.dtype}; pass prompts as a list of token-id lists")
        if row.size == 0:
            raise ValueError(f"prompt {b} is empty; generation continues a prompt, so give it at least one token "
                             "(e.g. a newline or a beginning-of-text token)")
        if row.min() < 0 or row.max() >= cfg.vocab_size:
            raise ValueError(f"prompt {b} holds token ids outside [0, {cfg.vocab_size}) (min {row.min()}, max "
                             f"{row.max()}); encode it with the model's tokenizer")
        if rolling and len(row) > cfg.max_seq_len:
            raise ValueError(f"prompt {b} has {len(row)} tokens, past the model's context of max_seq_len="
                             f"{cfg.max_seq_len}: a rolling cache continues past the context, but the prompt is "
                             "read in one pass; shorten it")
        if not rolling and len(row) + max_new_tokens > cfg.max_seq_len:
            room = cfg.max_seq_len - len(row)
            sinks = "" if scheme(cfg).relative else f" (relative positions only, not {cfg.position!r})"
            fix = (f"ask for at most {room} new tokens, or pass sinks=S (sample.py --sinks) to continue past the "
                   f"context with a rolling cache{sinks}") if room > 0 else f"shorten it below {cfg.max_seq_len} tokens"
            raise ValueError(f"prompt {b} has {len(row)} tokens and max_new_tokens is {max_new_tokens}: "
                             f"{len(row) + max_new_tokens} positions, past the model's context of max_seq_len="
                             f"{cfg.max_seq_len}; {fix}")
    return rows
