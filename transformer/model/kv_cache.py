"""The KV cache: a pytree passed into the decoder and returned updated, never a mutable collection.

Layout: one buffer per layer and kind, keys and values [B, G, S, K] (heads before slots), slot s
holding the token at position s; the cache holds a tuple of L of them. The decoder's layers only
*read* their buffer and return this call's new keys/values; `write` then scatters every layer's new
entries into its buffer. Inside a jitted `lax.scan` whose carry holds the cache, XLA does those
scatters in place (the write is ordered after every read, see `write`), so a decode step costs
O(cache read) and never copies the cache. Heads-first keeps each head's [S, K] keys contiguous, and
multi-head attention scores them as they lie (`ops.dot_product_attention` heads_first).

Why one buffer per layer rather than one stacked [L, B, G, S, K] array: XLA:CPU copied each layer's
slice out of a stacked array before its attention dot, every step (docs/performance.md, "KV-cache
layout"). A Python loop over the layers reads layer i's view (`param_tree.cache_layer`); a layer
scan (`scan_layers` with a cache, e.g. a prefill of a scanned model) reads the buffers stacked
(`param_tree.stack_cache`); decoding always runs unrolled layers.

Because slot = position, a row's slots below its current position are always filled: rows of a
ragged batch may sit at different positions, and stale slots (e.g. padding written during a
prefill) are overwritten before any query can see them.

Register tokens (cfg.num_registers = R > 0) take R extra leading slots: the registers sit at
positions -R..-1 (model.py), so slot = position + R, and max_len still counts real tokens. Their
keys and values depend on the parameters only (they come first causally), so the call that fills
an empty cache (the prefill) computes and writes them once; `registers_written`, a static field
(part of the pytree's structure, not an array), tells later calls to read them from the cache.
"""

from __future__ import annotations

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from transformer.model.config import ModelConfig

Array = jax.Array
Layers = tuple[Array, ...]  # one array per layer


@flax.struct.dataclass
class KVCache:
    """Keys and values of multi-head / grouped-query attention.

    The model's cache: k, v tuples of L arrays [B, G, S, K]. One layer's view (what a layer reads):
    k, v arrays [B, G, S, K]. A layer's new entries: k, v [B, T, G, K].
    """

    k: Layers | Array
    v: Layers | Array
    registers: int = flax.struct.field(pytree_node=False, default=0)  # R leading register slots
    registers_written: bool = flax.struct.field(pytree_node=False, default=False)

    @property
    def max_len(self) -> int:
        """Slots for real tokens (the R register slots are not counted)."""
        return jax.tree.leaves(self.k)[0].shape[-2] - self.registers


@flax.struct.dataclass
class LatentCache:
    """Multi-head latent attention caches only the latent and the shared rotary key.

    latent: a tuple of L arrays [B, S, C + Kr] (one layer's view: one array): the normalised
    key/value latent c (C = kv_latent_dim) followed by the rotated rotary key (Kr = rope_head_dim,
    0 without RoPE). A layer's new entries: latent [B, T, C + Kr].
    """

    latent: Layers | Array
    registers: int = flax.struct.field(pytree_node=False, default=0)  # R leading register slots
    registers_written: bool = flax.struct.field(pytree_node=False, default=False)

    @property
    def max_len(self) -> int:
        """Slots for real tokens (the R register slots are not counted)."""
        return jax.tree.leaves(self.latent)[0].shape[-2] - self.registers


Cache = KVCache | LatentCache


def init_cache(cfg: ModelConfig, batch_size: int, max_len: int, dtype: str | None = None) -> Cache:
    """An empty cache for `batch_size` rows of up to `max_len` positions (zeros; nothing is valid yet).

    Size max_len to what a generation needs (prompt + new tokens), not to the model's context:
    every decode step attends over all max_len slots. With registers the buffers hold R more
    slots, before the tokens' (max_len counts real tokens only).
    """
    if max_len > cfg.max_seq_len:
        raise ValueError(
            f"cache max_len={max_len} exceeds the model's context max_seq_len={cfg.max_seq_len}; "
            "use a shorter cache (prompt length + new tokens)"
        )
    if dtype is None:
        cfg.check_resolved()
    dtype = jnp.dtype(dtype or cfg.dtype)
    # Logical axes (sharding.py): under sharding.axis_rules the buffers are split by batch and
    # key/value heads; the MLA latent is read by every head, so only by batch.
    zeros = lambda shape, axes: tuple(  # noqa: E731
        nn.with_logical_constraint(jnp.zeros(shape, dtype), axes) for _ in range(cfg.num_layers)
    )
    slots, r = cfg.num_registers + max_len, cfg.num_registers  # R register slots before the tokens'
    if cfg.attention == "mla":
        width = cfg.kv_latent_dim + (cfg.rope_head_dim or 0)
        return LatentCache(latent=zeros((batch_size, slots, width), ("batch", "length", "latent")), registers=r)
    shape = (batch_size, cfg.num_kv_heads, slots, cfg.head_dim)
    axes = ("batch", "kv_heads", "length", "head_dim")
    return KVCache(k=zeros(shape, axes), v=zeros(shape, axes), registers=r)


def max_len(cache: Cache) -> int:
    """S, the number of slots per row for real tokens."""
    return cache.max_len


def _is_layers(x) -> bool:
    return isinstance(x, tuple)


def write(cache: Cache, new: Cache, positions: Array, after: Array | None = None) -> Cache:
    """Writes this call's entries into their slots.

    Args:
      cache: the cache, per layer KVCache [B, G, S, K] or LatentCache [B, S, C + Kr].
      new: this call's entries, per layer KVCache [B, T, G, K] or LatentCache [B, T, C + Kr].
      positions: [B, T] position of each new entry (registers: -R..-1); it goes to slot position
        + R. Out-of-range slots are dropped: the decoder checks the range and reports it.
      after: an array computed from every layer's read of the cache (the decoder passes its final
        hidden state). The write is made to depend on it (adding 0 * one of its elements), so that
        XLA sees every read come before the write and updates the cache in place; XLA orders
        buffers by data dependence only, and without this it copies the whole cache twice per
        decode step (layer l's new keys do not depend on layer l's read).
    """
    # The layers' new entries carry the default static fields; the cache's own go with the write.
    new = new.replace(registers=cache.registers, registers_written=cache.registers_written)
    if after is not None:
        zero = 0.0 * after.reshape(-1)[0]
        new = jax.tree.map(lambda n: n + zero.astype(n.dtype), new)
    rows = jnp.arange(positions.shape[0])[:, None]  # [B, 1], broadcasts against positions [B, T]
    positions = positions + cache.registers  # slot = position + R
    if isinstance(cache, LatentCache):
        put = lambda c, n: c.at[rows, positions].set(n.astype(c.dtype))  # noqa: E731
    else:
        # Index [rows, :, positions]: the two index arrays are split by a slice, so NumPy rules put
        # their broadcast [B, T] axes first: the values go in as [B, T, G, K], as the layers give them.
        put = lambda c, n: c.at[rows, :, positions].set(n.astype(c.dtype))  # noqa: E731
    return jax.tree.map(
        lambda cs, ns: tuple(put(c, n) for c, n in zip(cs, ns, strict=True)), cache, new, is_leaf=_is_layers
    )


def kv_cache_bytes_per_token(cfg: ModelConfig, dtype: str | None = None) -> int:
    """Bytes of KV cache one token of context costs, summed over every layer of the model.

    What `init_cache` allocates per (row, slot), in `dtype` (default cfg.dtype, the dtype the
    sampler's cache has):
      MHA / GQA / MQA: L * 2 * G * K values (a key and a value per key/value head and layer;
                       G = num_kv_heads: H for MHA, 1 for MQA, K = head_dim).
      MLA:             L * (C + Kr) values (one latent and one shared rotary key per layer;
                       C = kv_latent_dim, Kr = rope_head_dim or 0).
    A cache of B rows and S slots takes B * S times this.
    """
    if dtype is None:
        cfg.check_resolved()
    itemsize = jnp.dtype(dtype or cfg.dtype).itemsize
    if cfg.attention == "mla":
        values = cfg.kv_latent_dim + (cfg.rope_head_dim or 0)
    else:
        values = 2 * cfg.num_kv_heads * cfg.head_dim
    return cfg.num_layers * values * itemsize


bytes_per_token = kv_cache_bytes_per_token  # the old name (notebooks/kv_cache.ipynb, tests)


def measured_bytes_per_token(cache: Cache) -> float:
    """Cache bytes per token measured on the pytree: all its bytes / (B * slots), registers' included."""
    batch = jax.tree.leaves(cache)[0].shape[0]
    total = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(cache))
    return total / float(batch * (cache.registers + cache.max_len))
