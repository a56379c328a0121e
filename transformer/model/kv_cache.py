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

Sliding-window layers (cfg.attention_window = W) keep a ring buffer instead: W slots, the token at
position p in slot p mod W, and beside the buffers a per-slot record of the position each slot holds
(`positions`, [B, W] int32 per local layer; None for a layer whose slot is its position). A local
layer's query sees only the W - 1 positions before it, so W slots hold all it can see however long
the generation runs; the record keeps the masks exact for ragged rows, and a write of more than W
positions (a long prefill) keeps each row's last W. Padding must sit at PAD_POSITION (the sampler
puts it there): a ring has no slot a padding token could harmlessly be written to.

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
from transformer.model.positions import SCHEMES, scheme

Array = jax.Array
Layers = tuple[Array, ...]  # one array per layer
# A position after every real one. A token placed there is padding: no real token attends to it (it
# comes later) and no cache slot receives it; a ring slot recording it is empty.
PAD_POSITION = 2**30


def _max_len(buffers: Layers | Array, positions: tuple | Array | None, registers: int) -> int:
    """Slots for real tokens, the fewest over the layers whose slot is their position; a ring layer
    takes every position (below PAD_POSITION)."""
    if not isinstance(buffers, tuple):  # one layer's view
        return PAD_POSITION if positions is not None else buffers.shape[-2] - registers
    rings = positions if positions is not None else (None,) * len(buffers)
    return min(_max_len(b, p, registers) for b, p in zip(buffers, rings, strict=True))


@flax.struct.dataclass
class KVCache:
    """Keys and values of multi-head / grouped-query attention.

    The model's cache: k, v tuples of L arrays [B, G, S, K] (a local layer's S = W, a ring buffer);
    positions None without windows, else a tuple of L entries: [B, W] int32, the position each
    ring slot holds, or None for a layer whose slot is its position. One layer's view (what a layer
    reads): k, v arrays [B, G, S, K], positions [B, W] or None. A layer's new entries: k, v
    [B, T, G, K]. sinks: per layer (a tuple of L; one layer's view: an int), how many first slots a
    ring keeps for good, positions 0..S-1 (`init_rolling_cache`; 0 elsewhere).
    """

    k: Layers | Array
    v: Layers | Array
    positions: tuple | Array | None = None  # ring layers: the position each slot holds
    registers: int = flax.struct.field(pytree_node=False, default=0)  # R leading register slots
    registers_written: bool = flax.struct.field(pytree_node=False, default=False)
    sinks: int | tuple[int, ...] = flax.struct.field(pytree_node=False, default=0)  # kept first slots, per layer

    @property
    def max_len(self) -> int:
        """Slots for real tokens (the R register slots are not counted); ring layers take any
        position, so a cache of ring layers only has PAD_POSITION."""
        return _max_len(self.k, self.positions, self.registers)


@flax.struct.dataclass
class LatentCache:
    """Multi-head latent attention caches only the latent and the shared rotary key.

    latent: a tuple of L arrays [B, S, C + Kr] (one layer's view: one array): the normalised
    key/value latent c (C = kv_latent_dim) followed by the rotated rotary key (Kr = rope_head_dim,
    0 without RoPE). positions: as KVCache's (ring layers). A layer's new entries: latent
    [B, T, C + Kr].
    """

    latent: Layers | Array
    positions: tuple | Array | None = None  # ring layers: the position each slot holds
    registers: int = flax.struct.field(pytree_node=False, default=0)  # R leading register slots
    registers_written: bool = flax.struct.field(pytree_node=False, default=False)
    sinks: int | tuple[int, ...] = flax.struct.field(pytree_node=False, default=0)  # kept first slots, per layer

    @property
    def max_len(self) -> int:
        """Slots for real tokens (the R register slots are not counted); see KVCache.max_len."""
        return _max_len(self.latent, self.positions, self.registers)


Cache = KVCache | LatentCache


def buffers(cache: Cache) -> dict[str, Layers | Array]:
    """The cache's buffers by field name: k and v, or latent (not the ring positions)."""
    return {"latent": cache.latent} if isinstance(cache, LatentCache) else {"k": cache.k, "v": cache.v}


def init_cache(cfg: ModelConfig, batch_size: int, max_len: int, dtype: str | None = None) -> Cache:
    """An empty cache for `batch_size` rows of up to `max_len` positions (zeros; nothing is valid yet).

    Size max_len to what a generation needs (prompt + new tokens), not to the model's context:
    every decode step attends over all max_len slots. With registers the buffers hold R more
    slots, before the tokens' (max_len counts real tokens only). A local layer (cfg.layer_windows)
    gets a ring of W slots, whatever max_len, and its slot record starts at PAD_POSITION (empty).
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
    windows = cfg.layer_windows()
    r = cfg.num_registers  # R register slots before the tokens'
    slots = [r + max_len if w is None else w for w in windows]  # per layer: S (+ R), or a ring of W
    zeros = lambda shape, axes: tuple(  # noqa: E731  shape(S) per layer
        nn.with_logical_constraint(jnp.zeros(shape(s), dtype), axes) for s in slots
    )
    positions = None  # without windows the cache is exactly the plain one
    if cfg.attention_window:
        positions = tuple(None if w is None else jnp.full((batch_size, w), PAD_POSITION, jnp.int32) for w in windows)
    if cfg.attention == "mla":
        width = cfg.kv_latent_dim + (cfg.rope_head_dim or 0)
        latent = zeros(lambda s: (batch_size, s, width), ("batch", "length", "latent"))
        return LatentCache(latent=latent, positions=positions, registers=r)
    shape = lambda s: (batch_size, cfg.num_kv_heads, s, cfg.head_dim)  # noqa: E731
    axes = ("batch", "kv_heads", "length", "head_dim")
    return KVCache(k=zeros(shape, axes), v=zeros(shape, axes), positions=positions, registers=r)


def init_rolling_cache(cfg: ModelConfig, batch_size: int, sinks: int = 0, dtype: str | None = None) -> Cache:
    """A cache of constant size for generating past the context (StreamingLLM, Xiao et al. 2023).

    Every global layer is a ring of max_seq_len slots whose first `sinks` slots keep positions
    0..S-1 for good (the attention sinks) while the other M = max_seq_len - S roll over the last M
    positions; a local layer keeps its ring of W. A query sees at most max_seq_len keys in every
    layer, the context it was trained with, however far the generation runs. Positions past
    max_seq_len are then allowed; each query sees the sinks at the distance StreamingLLM's in-cache
    positions give (model/key_view.py).

    Only for a relative position scheme (positions.SCHEMES): an absolute one is added into the
    token's vector before the first layer, so every cached key holds its absolute position and no
    position past max_seq_len exists (learned) or was trained (sinusoidal).
    """
    if not scheme(cfg).relative:
        relative = " or ".join(repr(name) for name, s in SCHEMES.items() if s.relative)
        raise ValueError(
            f"generation past the context needs position={relative}, not {cfg.position!r}: {cfg.position} "
            "positions are added into every token's vector, so each cached key holds its absolute position and "
            f"none exists past max_seq_len={cfg.max_seq_len}; generate at most the context (no sinks option)"
        )
    if not 0 <= sinks < cfg.max_seq_len:
        raise ValueError(f"sinks must be in [0, max_seq_len={cfg.max_seq_len}), got {sinks}")
    # Every layer a ring of max_seq_len slots (registers and windows do not mix in a config, so the
    # ring is built without them and the registers' slots are put in front below).
    rolling = cfg.replace(attention_window=cfg.max_seq_len, global_every=0, num_registers=0)
    cache = init_cache(rolling, batch_size, cfg.max_seq_len, dtype)
    windows = cfg.layer_windows()  # local layers: back to their rings of W
    local = init_cache(cfg, batch_size, 1, dtype) if cfg.attention_window else None
    pick = lambda name, i: getattr(cache if windows[i] is None else local, name)[i]  # noqa: E731
    fields = {name: tuple(pick(name, i) for i in range(cfg.num_layers)) for name in (*buffers(cache), "positions")}
    cache = cache.replace(**fields, sinks=tuple(sinks if w is None else 0 for w in windows))
    return with_register_slots(cache, cfg.num_registers)


def with_register_slots(cache: Cache, registers: int) -> Cache:
    """A rolling cache with R more leading slots in every ring, recording positions -R..-1: the
    register tokens, kept for good before the sinks (a plain cache puts them at slot position + R)."""
    if not registers:
        return cache
    slot_axis = 1 if isinstance(cache, LatentCache) else 2
    grow = lambda a: jnp.concatenate(  # noqa: E731
        [jnp.zeros_like(jax.lax.slice_in_dim(a, 0, registers, axis=slot_axis)), a], axis=slot_axis)
    fields = {name: tuple(map(grow, layers)) for name, layers in buffers(cache).items()}
    record = lambda p: jnp.concatenate(  # noqa: E731
        [jnp.broadcast_to(jnp.arange(-registers, 0, dtype=p.dtype), (p.shape[0], registers)), p], axis=1)
    return cache.replace(**fields, positions=tuple(map(record, cache.positions)), registers=registers)


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
      positions: [B, T] position of each new entry (registers: -R..-1; padding: PAD_POSITION); it
        goes to slot position + R, or in a ring of W slots to slot position mod W, kept only if it
        is among its row's last W (`ring_slots`). Out-of-range slots are dropped: the decoder checks
        the range and reports it.
      after: an array computed from every layer's read of the cache (the decoder passes its final
        hidden state). The write is made to depend on it (adding 0 * one of its elements), so that
        XLA sees every read come before the write and updates the cache in place; XLA orders
        buffers by data dependence only, and without this it copies the whole cache twice per
        decode step (layer l's new keys do not depend on layer l's read).
    """
    news = buffers(new)
    if after is not None:
        zero = 0.0 * after.reshape(-1)[0]
        news = jax.tree.map(lambda n: n + zero.astype(n.dtype), news)
    rows = jnp.arange(positions.shape[0])[:, None]  # [B, 1], broadcasts against positions [B, T]
    rings = cache.positions if cache.positions is not None else (None,) * cache_layers(cache)
    full_slots = positions + cache.registers  # slot = position + R
    sinks = cache.sinks if isinstance(cache.sinks, tuple) else (cache.sinks,) * len(rings)
    slots = [full_slots if ring is None else ring_slots(positions, ring.shape[1], s, cache.registers)
             for ring, s in zip(rings, sinks)]

    def put(c: Array, n: Array, slot: Array) -> Array:  # one layer's buffer
        if c.ndim == 3:  # latent [B, S, C + Kr]
            return c.at[rows, slot].set(n.astype(c.dtype))
        # Index [rows, :, slot]: the two index arrays are split by a slice, so NumPy rules put their
        # broadcast [B, T] axes first: the values go in as [B, T, G, K], as the layers give them.
        return c.at[rows, :, slot].set(n.astype(c.dtype))

    written = {name: tuple(put(c, n, i) for c, n, i in zip(getattr(cache, name), news[name], slots, strict=True))
               for name in news}
    if cache.positions is not None:  # each ring slot records the position it now holds
        written["positions"] = tuple(None if ring is None else ring.at[rows, i].set(positions)
                                     for ring, i in zip(rings, slots, strict=True))
    return cache.replace(**written)


def ring_slots(positions: Array, size: int, sinks: int = 0, registers: int = 0) -> Array:
    """[B, T] positions -> [B, T] slots in a ring of `size` slots whose first `sinks` slots hold
    positions 0..sinks-1 for good: position p < sinks in slot p; a later one in slot sinks + (p -
    sinks) mod (size - sinks) if it is among its row's last size - sinks positions (padding, at
    PAD_POSITION, excluded); `size` (out of range: dropped) for the rest, so that no two kept
    entries share a slot. sinks=0: slot p mod size. R registers (positions -R..-1) take the first R
    slots, and every other slot moves up by R."""
    rolling = size - registers - sinks  # slots that roll
    real = positions < PAD_POSITION
    last = jnp.max(jnp.where(real, positions, -1), axis=1, keepdims=True)  # [B, 1]
    keep = real & (positions >= sinks) & (positions > last - rolling)
    slots = jnp.where(keep, registers + sinks + (positions - sinks) % rolling, size)
    if sinks:
        slots = jnp.where(real & (positions >= 0) & (positions < sinks), registers + positions, slots)
    return jnp.where(positions < 0, positions + registers, slots) if registers else slots


def cache_layers(cache: Cache) -> int:
    """L, the number of layers whose buffers the cache holds."""
    return len(next(iter(buffers(cache).values())))


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


def kv_cache_bytes(cfg: ModelConfig, length: int, dtype: str | None = None) -> int:
    """Bytes of one row's KV cache holding `length` tokens: a global layer keeps every token, a
    local layer (cfg.layer_windows) at most its W. So the cache grows by kv_cache_bytes_per_token
    per token up to W; past W only the global layers' share grows, and the local layers' part stays
    at W times theirs (with a window in every layer the whole cache is constant past W). The ring
    slots' position records (4 bytes per slot and local layer) are not counted.
    """
    per_layer = kv_cache_bytes_per_token(cfg, dtype) // cfg.num_layers
    return per_layer * sum(length if w is None else min(length, w) for w in cfg.layer_windows())


def describe_cache_size(cfg: ModelConfig, sinks: int | None = None) -> str:
    """The KV cache's size in words, for the model line of sample.py: bytes per token, and with
    windows what stays bounded past W; with `sinks` (generation past the context) the rolling
    cache's constant size."""
    per_token = kv_cache_bytes_per_token(cfg)
    if sinks is not None:
        rolling = jax.eval_shape(lambda: init_rolling_cache(cfg, 1, sinks))  # shapes only, nothing allocated
        return (f"{per_token:,} bytes per token; past the context a rolling cache of a constant "
                f"{measured_bytes(rolling):,} bytes a row (the first {sinks} tokens and the last "
                f"{cfg.max_seq_len - sinks} in every {'global ' if cfg.attention_window else ''}layer)")
    if not cfg.attention_window:
        return f"{per_token:,} bytes per token"
    w, windows = cfg.attention_window, cfg.layer_windows()
    local = sum(v is not None for v in windows)
    past = (kv_cache_bytes(cfg, w + 1) - kv_cache_bytes(cfg, w))  # what each token past W adds
    return (f"{per_token:,} bytes per token up to the window W={w}; past it {past:,} bytes per token "
            f"({len(windows) - local} global layers) and a constant {kv_cache_bytes(cfg, w) - w * past:,} "
            f"bytes for the {local} local layers' ring buffers")


bytes_per_token = kv_cache_bytes_per_token  # the old name (notebooks/kv_cache.ipynb, tests)


def measured_bytes_per_token(cache: Cache) -> float:
    """Cache bytes per token measured on the pytree: all its bytes / (B * slots), registers' included
    (a cache without ring layers: with them, see `measured_bytes`)."""
    batch = jax.tree.leaves(cache)[0].shape[0]
    return measured_bytes(cache) / float(batch * (cache.registers + cache.max_len))


def measured_bytes(cache: Cache) -> int:
    """All the bytes of the cache's arrays (buffers, and ring slot records), every row."""
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(cache))
