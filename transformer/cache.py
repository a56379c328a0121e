"""The KV cache: a pytree passed into the decoder and returned updated, never a mutable collection.

Layout: one stacked array per kind with a leading layer axis, keys and values [L, B, G, S, K]
(heads before slots), slot s holding the token at position s. The decoder's layers only *read*
their slice of the cache and return this call's new keys/values; `write` then scatters all
layers' new entries into the stacked arrays at once. Inside a jitted `lax.scan` whose carry holds
the cache, XLA does that scatter in place (the write is ordered after every read, see `write`), so
a decode step costs O(cache read) and never copies the whole cache. Heads-first keeps each head's
[S, K] keys contiguous, and multi-head attention scores them as they lie (`ops.dot_product_attention`
heads_first). XLA:CPU still copies each layer's slice out of the stacked array for its dot (a third
of a GPT-2-small step with 1024 slots; one buffer per layer would avoid it). Both choices were
measured (bench/cache_layout.py, GPT-2 small shapes, 1024 slots): against writing each layer's
slice inside the layer scan with [L, B, S, G, K], this layout decodes 3.1x faster at batch 1 and
4.1x at batch 8; against the same read-then-write scheme with [L, B, S, G, K], 1.7x and 1.9x.

Because slot = position, a row's slots below its current position are always filled: rows of a
ragged batch may sit at different positions, and stale slots (e.g. padding written during a
prefill) are overwritten before any query can see them.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

from transformer.config import ModelConfig

Array = jax.Array


@flax.struct.dataclass
class KVCache:
    """Keys and values of multi-head / grouped-query attention.

    k: [L, B, G, S, K], v: [L, B, G, S, K]; one layer's view (inside the layer stack) drops the L axis.
    """

    k: Array
    v: Array

    @property
    def max_len(self) -> int:
        return self.k.shape[-2]


@flax.struct.dataclass
class LatentCache:
    """Multi-head latent attention caches only the latent and the shared rotary key.

    latent: [L, B, S, C + R]: the normalised key/value latent c (C = kv_latent_dim) followed by the
    rotated rotary key (R = rope_head_dim, 0 without RoPE).
    """

    latent: Array

    @property
    def max_len(self) -> int:
        return self.latent.shape[-2]


Cache = KVCache | LatentCache


def init_cache(cfg: ModelConfig, batch_size: int, max_len: int, dtype: str | None = None) -> Cache:
    """An empty cache for `batch_size` rows of up to `max_len` positions (zeros; nothing is valid yet).

    Size max_len to what a generation needs (prompt + new tokens), not to the model's context:
    every decode step attends over all max_len slots.
    """
    if max_len > cfg.max_seq_len:
        raise ValueError(
            f"cache max_len={max_len} exceeds the model's context max_seq_len={cfg.max_seq_len}; "
            "use a shorter cache (prompt length + new tokens)"
        )
    dtype = jnp.dtype(dtype or cfg.dtype)
    if cfg.attention == "mla":
        width = cfg.kv_latent_dim + (cfg.rope_head_dim or 0)
        return LatentCache(latent=jnp.zeros((cfg.num_layers, batch_size, max_len, width), dtype))
    shape = (cfg.num_layers, batch_size, cfg.num_kv_heads, max_len, cfg.head_dim)
    return KVCache(k=jnp.zeros(shape, dtype), v=jnp.zeros(shape, dtype))


def max_len(cache: Cache) -> int:
    """S, the number of slots per row."""
    return cache.max_len


def write(cache: Cache, new: Cache, positions: Array, after: Array | None = None) -> Cache:
    """Writes this call's entries into their slots.

    Args:
      cache: the cache (KVCache [L, B, G, S, K] or LatentCache [L, B, S, C + R]).
      new: this call's entries as the layers return them, KVCache([L, B, T, G, K]) or
        LatentCache([L, B, T, C + R]).
      positions: [B, T] slot (= position) of each new entry. Out-of-range slots are dropped: the
        decoder checks the range and reports it.
      after: an array computed from every layer's read of the cache (the decoder passes its final
        hidden state). The write is made to depend on it (adding 0 * one of its elements), so that
        XLA sees every read come before the write and updates the cache in place; XLA orders
        buffers by data dependence only, and without this it copies the whole cache twice per
        decode step (layer l's new keys do not depend on layer l's read).
    """
    if after is not None:
        zero = 0.0 * after.reshape(-1)[0]
        new = jax.tree.map(lambda n: n + zero.astype(n.dtype), new)
    rows = jnp.arange(positions.shape[0])[:, None]  # [B, 1], broadcasts against positions [B, T]
    if isinstance(cache, LatentCache):
        return LatentCache(cache.latent.at[:, rows, positions].set(new.latent.astype(cache.latent.dtype)))
    # Index [:, rows, :, positions]: the two index arrays are split by a slice, so NumPy rules put
    # their broadcast [B, T] axes first: the values go in as [B, T, L, G, K].
    put = lambda c, n: c.at[:, rows, :, positions].set(n.transpose(1, 2, 0, 3, 4).astype(c.dtype))  # noqa: E731
    return KVCache(k=put(cache.k, new.k), v=put(cache.v, new.v))


def bytes_per_token(cfg: ModelConfig, dtype: str | None = None) -> int:
    """Cache bytes one token costs, from the formula.

    MHA/GQA: L * 2 * G * K values (a key and a value per key/value head and layer).
    MLA:     L * (C + R) values (one latent and one shared rotary key per layer).
    """
    itemsize = jnp.dtype(dtype or cfg.dtype).itemsize
    if cfg.attention == "mla":
        per_layer = cfg.kv_latent_dim + (cfg.rope_head_dim or 0)
    else:
        per_layer = 2 * cfg.num_kv_heads * cfg.head_dim
    return cfg.num_layers * per_layer * itemsize


def measured_bytes_per_token(cache: Cache) -> float:
    """Cache bytes per token measured on the pytree: all its bytes / (B * S)."""
    batch = jax.tree.leaves(cache)[0].shape[1]
    total = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(cache))
    return total / float(batch * cache.max_len)
