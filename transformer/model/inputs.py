"""What the decoder reads and gives back: token ids -> vocabulary logits (here), a table's rows ->
class logits (model/table.py) or images -> class logits (model/image.py), chosen by ModelConfig.inputs
through `INPUTS`. An input kind has three functions, called with the Decoder as `module` (so their
parameters sit at its top level):

    example(cfg, length)                                  zeros of the input's shape, to build params
    embed(module, cfg, data, positions, cache, det)   ->  x [B, T, D], positions [B, T], order
    logits(module, cfg, h, data, positions, cache)    ->  [B, T, V or C] float32 (the point `logits`)

`order`: an additive [B, 1, T, T] in place of the causal mask in every layer, or None: causal. An image
and text (`IMAGE_TEXT`, inputs='image_text') has a fourth: what its encoder reads (the decoder runs the
encoder, whose output tokens every block cross-attends to), or None when the cache holds their keys
and values:

    encoder_input(cfg, data, cache)                   ->  data["image"] or None"""

from __future__ import annotations

import types
from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from transformer.model import image, kv_cache, ops, table
from transformer.model.config import ModelConfig
from transformer.model.kv_cache import Cache
from transformer.model.linear import Linear, times_transpose
from transformer.model.points import point
from transformer.model.positions import scheme

Array = jax.Array


def embed_tokens(module: nn.Module, cfg: ModelConfig, tokens: Array, positions: Array | None, cache: Cache | None,
                 deterministic: bool) -> tuple[Array, Array, None]:
    """tokens [B, T] -> x [B, T, D]: E[tokens] (E [V, D], `embed`; times sqrt(D) with embed_scale) plus the scheme's
    embedding at `positions` (default 0..T-1), then dropout. Checks ids and positions when known."""
    if positions is None:
        positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)  # [B, T]: 0..T-1
    check_tokens(cfg, tokens)  # ids in [0, V), when they are known (not traced)
    check_positions(cfg, positions, cache)  # positions < max_seq_len and < S, likewise
    embed = nn.Embed(cfg.vocab_size, cfg.d_model, embedding_init=nn.initializers.normal(0.02),
                     dtype=cfg.dtype, name="embed")  # E [V, D]
    # Clipped: nn.Embed looks up an id >= V as NaN, which the attention would spread to every
    # position of the row. A bad id's logits are set to NaN after the layers instead.
    x = embed(jnp.clip(tokens, 0, cfg.vocab_size - 1))  # [B, T, D]
    if cfg.embed_scale:  # times sqrt(D) rounded to the compute dtype, as Gemma's normaliser
        x = x * jnp.asarray(cfg.d_model ** 0.5, x.dtype)
    x = point(module, "token_embedding", x)  # the point embed
    embed_positions = scheme(cfg).embed
    if embed_positions is not None:  # + P[positions], learned or sinusoidal: the point pos_embed
        x = x + point(module, "position_embedding", embed_positions(module, cfg, positions))
    return nn.Dropout(cfg.dropout, deterministic=deterministic)(x), positions, None


def vocabulary_logits(module: nn.Module, cfg: ModelConfig, h: Array, tokens: Array, positions: Array,
                      cache: Cache | None) -> Array:
    """h [B, T, D] -> logits [B, T, V] float32: h E^T with tied embeddings, else a head W [V, D], then
    soft-capped (cfg.logit_softcap > 0). A row is NaN from its first out-of-range input on."""
    h = nan_from_out_of_range(cfg, h, tokens, positions, cache)  # [B, T, D]: jit's stand-in for the checks
    if cfg.tie_embeddings:
        # E's rows contracted in place: embed.attend transposes E, and XLA:CPU then fuses the final norm
        # into a slow loop over E (docs/performance.md).
        embedding = module.variables["params"]["embed"]["embedding"]  # E [V, D], made by embed_tokens
        logits = times_transpose(h, embedding.astype(cfg.dtype))
    else:
        init = nn.initializers.zeros if cfg.zero_init_head else nn.initializers.normal(0.02)
        logits = Linear(cfg.vocab_size, use_bias=False, dtype=cfg.dtype, kernel_init=init, name="head")(h)
    logits = logits.astype(jnp.float32)
    if cfg.logit_softcap:
        logits = ops.softcap(logits, cfg.logit_softcap)  # c tanh(logits / c): |logits| <= c
    return point(module, "logits", nn.with_logical_constraint(logits, ("batch", "length", "vocab")))


def nan_from_out_of_range(cfg: ModelConfig, x: Array, tokens: Array, positions: Array, cache: Cache | None) -> Array:
    """x [B, T, D] with NaN from each row's first out-of-range input on (an id outside [0, V), a
    position past `position_limit`): under jit the checks cannot run. Later tokens of the row attend
    to it, earlier ones and other rows do not. tokens, positions: [B, T] integers."""
    t = tokens.shape[1]
    bad = (tokens < 0) | (tokens >= cfg.vocab_size) | (positions >= position_limit(cfg, cache))
    index = jnp.arange(t)
    first_bad = jnp.where(bad, index, t).min(axis=1, keepdims=True, initial=t)  # [B, 1], T if none
    return jnp.where((index >= first_bad)[..., None], jnp.nan, x)


def as_tokens(tokens: Any) -> Array:
    """Token ids as [B, T] int32: a list or a [T] array is one row; other input a ValueError saying what to pass."""
    if isinstance(tokens, jax.core.Tracer):
        return tokens
    array = np.asarray(tokens)
    array = array[None] if array.ndim == 1 else array
    if array.ndim != 2 or array.size == 0 or not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"tokens must be integer token ids [B, T] (or one row [T]), got shape {array.shape} and "
                         f"dtype {array.dtype}; encode text with the model's tokenizer: tokenizer.encode(text)")
    return jnp.asarray(array, jnp.int32)


def check_tokens(cfg: ModelConfig, tokens: Array) -> None:
    """Raises a clear error for token ids outside [0, vocab_size), when they are known."""
    if isinstance(tokens, jax.core.Tracer):
        return
    tokens = np.asarray(tokens)
    bad = np.argwhere((tokens < 0) | (tokens >= cfg.vocab_size))
    if len(bad):
        row, t = bad[0]
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise ValueError(
            f"token id {tokens[row, t]} at row {row}, position {t}{more} is outside the vocabulary "
            f"of vocab_size={cfg.vocab_size} (ids 0..{cfg.vocab_size - 1}); encode the text with "
            "the model's tokenizer, or use a model whose vocab_size covers every id"
        )


def position_limit(cfg: ModelConfig, cache: Cache | None) -> int:
    """The first position a call may not use: the context or the cache's slots; a cache of rings only
    rolls past the context when the position scheme is relative."""
    if cache is None:
        return cfg.max_seq_len
    if kv_cache.max_len(cache) >= kv_cache.PAD_POSITION and scheme(cfg).relative:
        return kv_cache.PAD_POSITION
    return min(cfg.max_seq_len, kv_cache.max_len(cache))


def check_positions(cfg: ModelConfig, positions: Array, cache: Cache | None) -> None:
    """Raises a clear error for positions past the context or the cache, when they are known."""
    if isinstance(positions, jax.core.Tracer):
        return
    real = np.asarray(positions)[np.asarray(positions) != kv_cache.PAD_POSITION]  # padding is never written
    top = int(real.max()) if real.size else -1
    if top >= cfg.max_seq_len and position_limit(cfg, cache) < kv_cache.PAD_POSITION:
        raise ValueError(
            f"position {top} is past the model's context (max_seq_len={cfg.max_seq_len}); "
            "shorten the input or use a model with a longer context"
        )
    if cache is not None and top >= kv_cache.max_len(cache):
        raise ValueError(
            f"position {top} does not fit in the cache of {kv_cache.max_len(cache)} slots; "
            "init_cache with a larger max_len (prompt length + new tokens)"
        )


TOKENS = types.SimpleNamespace(example=lambda cfg, length=1: jnp.zeros((1, length), jnp.int32), embed=embed_tokens,
                               logits=vocabulary_logits)


# ----------------------------------------------------------------------------- an image and text (cross_attention)


def text_of(data: Any) -> Array:
    """The token ids [B, T] of an image-and-text input {"image": ..., "tokens": [B, T]}, or of a decoding
    step's plain ids [B, T] (the image's keys and values are in the cache then)."""
    return data["tokens"] if isinstance(data, Mapping) else data


def encoder_input(cfg: ModelConfig, data: Any, cache: Cache | None) -> Array | None:
    """What the encoder reads, data["image"] [B, ...] (a ViT's images), or None when the cache holds the
    keys and values of its output tokens already (a decoding step: the encoder is not run again,
    whatever image is passed). The decoder runs the encoder, a Decoder of cfg.encoder (`encoder`)."""
    if cache is not None and cache[0].cross_k is not None:
        return None
    picture = data.get("image") if isinstance(data, Mapping) else None
    if picture is None:
        raise ValueError("a cross-attention model (inputs='image_text') reads {'image': an array [B, ...] for its "
                         "encoder, 'tokens': ids [B, T]}; pass the image too (a decoding step from a filled cache "
                         "may pass the tokens alone)")
    if picture.shape[0] != text_of(data).shape[0]:
        raise ValueError(f"the image batch has {picture.shape[0]} rows but the tokens {text_of(data).shape[0]}; give "
                         "one image per row of tokens")
    return picture


IMAGE_TEXT = types.SimpleNamespace(
    example=lambda cfg, length=1: {"image": INPUTS[cfg.encoder.inputs].example(cfg.encoder),
                                   "tokens": TOKENS.example(cfg, length)},
    embed=lambda module, cfg, data, *rest: embed_tokens(module, cfg, text_of(data), *rest),
    logits=lambda module, cfg, h, data, *rest: vocabulary_logits(module, cfg, h, text_of(data), *rest),
    encoder_input=encoder_input,
)
INPUTS = {"tokens": TOKENS, "table": table.ROWS, "image": image.PIXELS, "image_text": IMAGE_TEXT}


def num_tokens(cfg: ModelConfig, data: Array) -> int:
    """The tokens T one call's input gives: T of ids [B, T] or rows [B, T, F + 1]; an image's cfg.image_tokens."""
    return cfg.image_tokens if cfg.inputs == "image" else text_of(data).shape[1]
