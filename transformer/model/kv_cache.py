"""The KV cache: a tuple of per-layer caches, passed into the decoder and returned updated (a pytree).

A layer's cache is a KVCache, keys and values [B, G, S, K], or MLA's LatentCache [B, S, C + Kr]; the
layers read it, then `write` scatters this call's entries in place. One buffer per layer: XLA:CPU
copied a stacked [L, ...] array's slice before each attention dot (docs/performance.md).

A full buffer holds position p in slot p (rows of a ragged batch may sit at different positions). A
ring (a sliding-window layer's W slots, or a rolling cache's) holds p in slot p mod W and records
each slot's position; padding must then sit at PAD_POSITION. R register tokens take R leading slots
at positions -R..-1, written once by the call that fills an empty cache (`registers_written`).

A rolling ring under RoPE keeps its R + S leading slots (registers, sinks) for good, and a query past
the context sees them turned towards it (key_view.py). `write` keeps them as the attention wrote them
in `kept`, and in the ring's own slots turned for the position after the last one written, so that a
decoding step reads its ring as it lies: no turn or join on the read, one small turn on the write."""

from __future__ import annotations

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from transformer.model import ops
from transformer.model.config import ModelConfig
from transformer.model.positions import SCHEMES, scheme

Array = jax.Array
# A position after every real one. A token placed there is padding: no real token attends to it (it
# comes later) and no cache slot receives it; a ring slot recording it is empty.
PAD_POSITION = 2**30


@flax.struct.dataclass
class KVCache:
    """One layer's keys and values: k, v [B, G, R + S, K] (a layer's new entries: [B, T, G, K]).
    positions: a ring's record [B, R + S] of the position each slot holds, or None (slot = position +
    R). sinks: the slots after the registers a ring keeps for good, positions 0..sinks-1."""

    k: Array
    v: Array
    positions: Array | None = None
    registers: int = flax.struct.field(pytree_node=False, default=0)  # R leading register slots
    registers_written: bool = flax.struct.field(pytree_node=False, default=False)
    sinks: int = flax.struct.field(pytree_node=False, default=0)
    # cross_attention: the encoder's keys and values [B, G, S_e, K], written by the prefill, then only read
    cross_k: Array | None = None
    cross_v: Array | None = None
    # a rolling ring under RoPE: its R + S kept keys as written, unturned [B, G, R + S, K] (k holds them turned)
    kept: Array | None = None


@flax.struct.dataclass
class LatentCache:
    """One layer's cache of latent attention: latent [B, R + S, C + Kr], the latent c then the rotated
    rotary key (Kr: 0 without RoPE); new entries [B, T, C + Kr]. positions, sinks: as KVCache's."""

    latent: Array
    positions: Array | None = None
    registers: int = flax.struct.field(pytree_node=False, default=0)
    registers_written: bool = flax.struct.field(pytree_node=False, default=False)
    sinks: int = flax.struct.field(pytree_node=False, default=0)
    kept: Array | None = None  # as KVCache's: the kept slots' rotary keys as written [B, R + S, Kr]


LayerCache = KVCache | LatentCache
Cache = tuple[LayerCache, ...]  # one per layer


def buffers(layer: LayerCache) -> dict[str, Array]:
    """A layer's buffers by field name: k and v, or latent (not the ring's record)."""
    return {"latent": layer.latent} if isinstance(layer, LatentCache) else {"k": layer.k, "v": layer.v}


def slots(layer: LayerCache) -> int:
    """R + S, the layer's slots (registers included)."""
    return next(iter(buffers(layer).values())).shape[-2]  # [B, G, R + S, K] or [B, R + S, C + Kr]


def max_len(cache: Cache) -> int:
    """S, the positions a cache takes: its full buffers' fewest slots past the registers (rings only:
    every position below PAD_POSITION)."""
    return min(PAD_POSITION if c.positions is not None else slots(c) - c.registers for c in cache)


def registers_to_run(cfg: ModelConfig, cache: Cache | None) -> int:
    """R when this call runs the registers (no cache, or filling an empty one), else 0 (they are cached)."""
    return cfg.num_registers if cache is None or not cache[0].registers_written else 0


def _empty(cfg: ModelConfig, batch: int, size: int, dtype: str | None, ring: bool, sinks: int = 0) -> LayerCache:
    """One layer's empty cache of `size` slots (zeros), with a ring's record (all PAD_POSITION but the
    registers' -R..-1) when `ring`, and its kept keys' unturned copy when it keeps slots under RoPE;
    dtype None: cfg.dtype."""
    if dtype is None:
        cfg.check_resolved()
    dtype, r = jnp.dtype(dtype or cfg.dtype), cfg.num_registers
    record = None
    if ring:
        record = jnp.full((batch, size), PAD_POSITION, jnp.int32).at[:, :r].set(jnp.arange(-r, 0, dtype=jnp.int32))
    # Logical axes (sharding.py): the buffers are split by batch and key/value heads; the MLA latent
    # is read by every head, so only by batch.
    zeros = lambda shape, axes: nn.with_logical_constraint(jnp.zeros(shape, dtype), axes)  # noqa: E731
    turned = ring and r + sinks > 0 and scheme(cfg).rotate is not None  # kept slots that turn past the context
    if cfg.attention == "mla":
        width = cfg.kv_latent_dim + (cfg.rope_head_dim or 0)
        latent = zeros((batch, size, width), ("batch", "length", "latent"))
        kept = zeros((batch, r + sinks, cfg.rope_head_dim), ("batch", "length", "latent")) if turned else None
        return LatentCache(latent=latent, positions=record, registers=r, sinks=sinks, kept=kept)
    shape, axes = (batch, cfg.num_kv_heads, size, cfg.head_dim), ("batch", "kv_heads", "length", "head_dim")
    kept = zeros((*shape[:2], r + sinks, shape[3]), axes) if turned else None
    return KVCache(k=zeros(shape, axes), v=zeros(shape, axes), positions=record, registers=r, sinks=sinks, kept=kept)


def init_cache(cfg: ModelConfig, batch_size: int, max_len: int, dtype: str | None = None) -> Cache:
    """An empty cache for `batch_size` rows of up to `max_len` positions (R + max_len slots per global
    layer, a ring of W per local one): size it to prompt + new tokens, as each step reads every slot."""
    for name, value, most in (("batch_size", batch_size, None), ("max_len", max_len, cfg.max_seq_len)):
        if not (isinstance(value, int | np.integer) and 1 <= value <= (most or value)):
            raise ValueError(f"cache {name}={value!r} must be a whole number >= 1" + (
                f", at most the model's context max_seq_len={most} (prompt length + new tokens)" if most else ""))
    r = cfg.num_registers
    return tuple(_empty(cfg, batch_size, r + max_len if w is None else w, dtype, ring=w is not None)
                 for w in cfg.layer_windows())


def init_rolling_cache(cfg: ModelConfig, batch_size: int, sinks: int = 0, dtype: str | None = None) -> Cache:
    """A cache of constant size for generating past the context (StreamingLLM, Xiao et al. 2023).

    Every global layer is a ring of R + max_seq_len slots whose first S = `sinks` keep positions 0..S-1
    while the rest roll; a local layer keeps its ring of W: a query sees at most the max_seq_len keys it
    was trained with. Relative positions only: an absolute one past max_seq_len was never trained."""
    if not scheme(cfg).relative:
        relative = " or ".join(repr(name) for name, s in SCHEMES.items() if s.relative)
        raise ValueError(
            f"generation past the context needs position={relative}, not {cfg.position!r}: {cfg.position} "
            "positions are added into every token's vector, so each cached key holds its absolute position and "
            f"none exists past max_seq_len={cfg.max_seq_len}; generate at most the context (no sinks option)"
        )
    if not 0 <= sinks < cfg.max_seq_len:
        raise ValueError(f"sinks must be in [0, max_seq_len={cfg.max_seq_len}), got {sinks}")
    r = cfg.num_registers
    return tuple(_empty(cfg, batch_size, r + cfg.max_seq_len, dtype, ring=True, sinks=sinks) if w is None
                 else _empty(cfg, batch_size, w, dtype, ring=True) for w in cfg.layer_windows())


def write(cache: Cache, new: Cache, positions: Array, after: Array | None = None,
          thetas: tuple | None = None) -> Cache:
    """This call's entries `new` (per layer [B, T, G, K] or [B, T, C + Kr]) written into `cache` at
    positions [B, T]: slot position + R, or a ring's `ring_slots`; out-of-range slots are dropped.
    after: computed from every layer's read (the final hidden state); adding 0 * one of its elements
    orders every read before the write, so XLA updates in place (else it copies the cache twice a step).
    thetas: each layer's RoPE base, needed by a rolling ring with kept slots (`turn_kept`)."""
    zero = None if after is None else 0.0 * after.reshape(-1)[0]
    rows = jnp.arange(positions.shape[0])[:, None]  # [B, 1], broadcasts against positions [B, T]

    def put(c: LayerCache, n: LayerCache) -> LayerCache:
        if c.positions is None:
            slot = positions + c.registers  # [B, T]: slot = position + R
        else:
            slot = ring_slots(positions, c.positions.shape[1], c.sinks, c.registers)
        written = {}
        for name, buffer in buffers(c).items():
            value = getattr(n, name)
            value = (value if zero is None else value + zero.astype(value.dtype)).astype(buffer.dtype)
            # A KVCache's index [rows, :, slot]: the two index arrays are split by a slice, so NumPy
            # rules put their broadcast [B, T] axes first: the values go in as [B, T, G, K].
            written[name] = buffer.at[rows, slot].set(value) if buffer.ndim == 3 else buffer.at[rows, :, slot].set(value)
        if c.positions is not None:  # each ring slot records the position it now holds
            written["positions"] = c.positions.at[rows, slot].set(positions)
        if isinstance(n, KVCache) and n.cross_k is not None:  # the prefill's encoder keys and values, whole
            written.update(cross_k=n.cross_k.astype(c.k.dtype), cross_v=n.cross_v.astype(c.v.dtype))
        return c.replace(**written)

    written = tuple(put(c, n) for c, n in zip(cache, new, strict=True))
    if not any(c.kept is not None for c in cache):
        return written
    if thetas is None:
        raise ValueError("a rolling cache's kept slots turn by RoPE: pass write(..., thetas=) each layer's base")
    return tuple(c if c.kept is None else turn_kept(c, getattr(n, "k", None) if isinstance(n, KVCache) else n.latent,
                                                     positions, theta, rows)
                 for c, n, theta in zip(written, new, thetas, strict=True))


def turn_kept(c: LayerCache, entries: Array, positions: Array, theta: float | Array, rows: Array) -> LayerCache:
    """A rolling ring `c` just written with this call's `entries` [B, T, G, K] (or [B, T, C + Kr]) at
    `positions` [B, T]: the kept slots' (registers', sinks') keys among them copied, unturned, into
    c.kept, and the ring's kept slots set to c.kept turned by `shift` = the distance the kept slots
    move for the next position (key_view.py), each row's after its last written position."""
    kept = c.registers + c.sinks
    slot = ring_slots(positions, c.positions.shape[1], c.sinks, c.registers)  # [B, T]
    slot = jnp.where(slot < kept, slot, kept)  # only the kept slots; the rest dropped
    rotary = entries[..., -c.kept.shape[-1]:].astype(c.kept.dtype)  # [B, T, G, K] or MLA's rotary part [B, T, Kr]
    unturned = c.kept.at[rows, slot].set(rotary) if c.kept.ndim == 3 else c.kept.at[rows, :, slot].set(rotary)
    last = jnp.max(jnp.where(c.positions < PAD_POSITION, c.positions, -1), axis=1)  # [B]
    shift = next_shift(last + 1, c.positions.shape[1] - c.registers - c.sinks, c.sinks)
    flat = unturned[:, :, None] if unturned.ndim == 3 else jnp.moveaxis(unturned, 1, 2)  # [B, R + S, G or 1, K]
    turned = ops.rope_turn(flat, jnp.broadcast_to(shift[:, None], flat.shape[:2]), theta)
    if c.kept.ndim == 3:  # MLA: the rotary part of the latent's kept slots
        latent = jax.lax.dynamic_update_slice(c.latent, turned[:, :, 0].astype(c.latent.dtype),
                                              (0, 0, c.latent.shape[-1] - c.kept.shape[-1]))
        return c.replace(latent=latent, kept=unturned)
    k = jax.lax.dynamic_update_slice_in_dim(c.k, jnp.moveaxis(turned, 1, 2).astype(c.k.dtype), 0, axis=2)
    return c.replace(k=k, kept=unturned)


def next_shift(query: Array, window: int, sinks: int) -> Array:
    """[B] how far a rolling ring's kept slots move for a query at `query` [B]: past sinks + W - 1
    (W: the ring's rolling slots) they sit just before the oldest rolling key (StreamingLLM)."""
    return jnp.maximum(query - (sinks + window - 1), 0)


def ring_slots(positions: Array, size: int, sinks: int = 0, registers: int = 0) -> Array:
    """[B, T] positions -> [B, T] slots in a ring of `size` slots: R registers (positions -R..-1) first,
    then position p < sinks in slot R + p for good, a later one in slot R + sinks + (p - sinks) mod M
    (M = size - R - sinks) if among its row's last M real positions, else `size` (dropped), so that
    no two kept entries share a slot."""
    rolling = size - registers - sinks  # slots that roll
    real = positions < PAD_POSITION
    last = jnp.max(jnp.where(real, positions, -1), axis=1, keepdims=True)  # [B, 1]
    keep = real & (positions >= sinks) & (positions > last - rolling)
    slots = jnp.where(keep, registers + sinks + (positions - sinks) % rolling, size)
    if sinks:
        slots = jnp.where(real & (positions >= 0) & (positions < sinks), registers + positions, slots)
    return jnp.where(positions < 0, positions + registers, slots) if registers else slots


def stacked(cache: Cache) -> LayerCache:
    """The L layers' caches, alike (full buffers, or rings of one size), as one of [L, ...] arrays for nn.scan."""
    return jax.tree.map(lambda *layers: jnp.stack(layers), *cache)


def per_layer(stack: LayerCache, num_layers: int) -> Cache:
    """The inverse of `stacked`: one cache of [L, ...] arrays -> L per-layer caches."""
    return tuple(jax.tree.map(lambda a: a[i], stack) for i in range(num_layers))


def kv_cache_bytes_per_token(cfg: ModelConfig, dtype: str | None = None) -> int:
    """Bytes of cache one token costs over every layer, in `dtype` (default cfg.dtype): L * 2 * G * K
    values (a key and a value per key/value head), or L * (C + Kr) (MLA's latent)."""
    if dtype is None:
        cfg.check_resolved()
    itemsize = jnp.dtype(dtype or cfg.dtype).itemsize
    mla = cfg.attention == "mla"
    values = cfg.kv_latent_dim + (cfg.rope_head_dim or 0) if mla else 2 * cfg.num_kv_heads * cfg.head_dim
    return cfg.num_layers * values * itemsize


def kv_cache_bytes(cfg: ModelConfig, length: int, dtype: str | None = None) -> int:
    """Bytes of one row's cache holding `length` tokens: a global layer keeps every token, a local
    layer at most its W (the rings' position records not counted)."""
    per_layer = kv_cache_bytes_per_token(cfg, dtype) // cfg.num_layers
    return per_layer * sum(length if w is None else min(length, w) for w in cfg.layer_windows())


def describe_cache_size(cfg: ModelConfig, sinks: int | None = None) -> str:
    """The KV cache's size in words for sample.py: bytes per token, with windows what stays bounded past
    W, with `sinks` (generation past the context) the rolling cache's constant size."""
    per_token = kv_cache_bytes_per_token(cfg)
    if sinks is not None:
        rolling = jax.eval_shape(lambda: init_rolling_cache(cfg, 1, sinks))  # shapes only, nothing allocated
        return (f"{per_token:,} bytes per token; past the context a rolling cache of a constant "
                f"{measured_bytes(rolling):,} bytes a row (the first {sinks} tokens and the last "
                f"{cfg.max_seq_len - sinks} in every {'global ' if cfg.attention_window else ''}layer)")
    if not cfg.attention_window:
        return f"{per_token:,} bytes per token"
    w, windows = min(cfg.attention_window, cfg.max_seq_len), cfg.layer_windows()
    local = sum(v is not None for v in windows)
    past = (kv_cache_bytes(cfg, w + 1) - kv_cache_bytes(cfg, w))  # what each token past W adds
    return (f"{per_token:,} bytes per token up to the window W={w}; past it {past:,} bytes per token "
            f"({len(windows) - local} global layers) and a constant {kv_cache_bytes(cfg, w) - w * past:,} "
            f"bytes for the {local} local layers' ring buffers")


def measured_bytes_per_token(cache: Cache) -> float:
    """Cache bytes per token measured on a cache without rings: all its bytes / (B * slots)."""
    batch = jax.tree.leaves(cache)[0].shape[0]
    return measured_bytes(cache) / float(batch * (cache[0].registers + max_len(cache)))


def measured_bytes(cache: Cache) -> int:
    """All the bytes of the cache's arrays (buffers, and ring slot records), every row."""
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(cache))
