"""What a query sees: the keys of one attention call, segment by segment, with their additive biases.

Every attention kind (MHA / GQA / MQA, MLA in both forms) reads one `KeyView`, built once per call.
Its segments: this layer's cached slots (registers first; a ring's in slot order), then this call's
keys; per segment the positions [B, S_i] (registers -R..-1, an empty slot PAD_POSITION) and the bias
[B, 1 or H, T, S_i]: 0 where query t sees key s, a large negative value where not, plus the position
scheme's score bias. Query t sees key s iff pos_s <= pos_t, with a window W also pos_t - pos_s < W
unless s is kept for good (sinks, registers); a cached slot only if filled before this call. An input
may bring its own order of this call's keys instead (`order`: a table's rows). With mask='bidirectional'
(cfg.mask, the mask kind) a query sees every key of its call, registers too, but padding (PAD_POSITION):
such a model reads its input in one pass, without a cache.

A rolling layer with sinks or registers numbers its cache as StreamingLLM does once a query q runs
past sinks + W - 1: the keys kept for good move `shift` = q - (sinks + W - 1) towards it, so the
rolling keys keep their true distances: RoPE turns the kept keys by `shift`, a score bias measures
from the shifted positions. Under RoPE the ring's kept slots already hold them turned for the position
after its last one (kv_cache.write), which a decoding step's one query is: it reads the ring as it
lies. A call of several queries turns the cache's unturned copy (`kept`) by its last query's shift and
joins it to this call's keys (in place: a copy of the cache).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from transformer.model import ops
from transformer.model import kv_cache
from transformer.model.kv_cache import PAD_POSITION, LayerCache
from transformer.model.positions import scheme

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class KeyView:
    """positions [B, S_i] and bias [B, 1 or H, T, S_i] per key segment: the cached slots, then this
    call's keys. kept: the leading cached slots kept for good (R + sinks); shift [B]: how far they
    move, or None; joined: the kept slots come (turned) before this call's keys, masked in the cache's;
    unturned: the kept slots' rotary keys as written (kv_cache's `kept`), which `shift` turns."""

    positions: list[Array]
    bias: list[Array]
    kept: int = 0
    shift: Array | None = None
    joined: bool = False
    unturned: Array | None = None

    def all_positions(self) -> Array:
        """[B, S_total]: every key's position, the segments joined (cached slots first)."""
        return jnp.concatenate(self.positions, axis=1) if len(self.positions) > 1 else self.positions[0]

    def segments(self, cfg, cached: Array, new: Array, slot_axis: int, rotary: slice | None = slice(None),
                 theta: float | Array | None = None) -> list:
        """[cached, new] as the queries see them: one layer's cache [B, G, slots, K] (slot_axis 2) or
        MLA's latent [B, slots, C + Kr] (slot_axis 1), and this call's [B, T, ...]. A rolling layer's
        kept slots turned by `shift` in their `rotary` features (None: values, not turned; RoPE depends
        on differences only) with the layer's RoPE base `theta`, in place or joined before `new`."""
        rotate = scheme(cfg).rotate
        if self.shift is None or rotate is None:
            return [cached, new]
        kept = jnp.moveaxis(jax.lax.slice_in_dim(cached, 0, self.kept, axis=slot_axis), slot_axis, 1)
        if rotary is not None:  # kept [B, R + S, G, K] or [B, R + S, C + Kr]
            part = kept[..., rotary] if self.unturned is None else \
                jnp.moveaxis(self.unturned, slot_axis, 1).astype(kept.dtype)  # the ring's own are turned
            flat = part if part.ndim == 4 else part[:, :, None]  # [B, R + S, G or 1, Kr]
            shift = jnp.broadcast_to(self.shift[:, None], flat.shape[:2])
            turned = ops.rope_turn(flat, shift, cfg.rope_theta if theta is None else theta).reshape(part.shape)
            kept = turned if part.shape == kept.shape else kept.at[..., rotary].set(turned)  # all turned: no scatter
        if self.joined:
            return [cached, jnp.concatenate([kept.astype(new.dtype), new], axis=1)]
        return [jax.lax.dynamic_update_slice_in_dim(cached, jnp.moveaxis(kept, 1, slot_axis), 0, slot_axis), new]


def slot_positions(cached: LayerCache, batch: int) -> Array:
    """[B, R + S] int32: the position each slot of one layer's cache holds (registers -R..-1; a ring
    slot's recorded position, PAD_POSITION while empty)."""
    if cached.positions is not None:
        return cached.positions
    slots = kv_cache.slots(cached)
    return jnp.broadcast_to(jnp.arange(slots, dtype=jnp.int32) - cached.registers, (batch, slots))


def key_view(cfg, positions: Array, cached: LayerCache | None = None, window: int | Array | None = None,
             order: Array | None = None, join: bool = True) -> KeyView:
    """The keys that queries at `positions` [B, T] see in one layer, its cache `cached` and sliding window
    `window` each or None; order [B, 1, T, T]: the input's own additive order of this call's keys (no cache).
    join: a rolling layer's turned kept slots joined to this call's keys (False: in place, one column
    per slot, as captured attention maps show them)."""
    sinks, kept, shift, unturned = None, 0, None, None
    segments = []  # per segment its parts (positions, valid or None, leading slots kept for good): cache first
    new = [(positions, None, 0)]
    if cached is not None:
        if cfg.mask == "bidirectional":
            raise ValueError("a model with mask='bidirectional' reads its input in one pass (every token sees the "
                             "later ones), without a KV cache; pass cache=None")
        if order is not None:
            raise ValueError("an input with its own order of keys (a table's rows) is read in one forward "
                             "pass, without a KV cache; pass cache=None")
        slots = slot_positions(cached, positions.shape[0])
        if cached.positions is not None:  # a ring: it rolls over its last `window` positions, keeps the rest
            window, ring_sinks = cached.positions.shape[1] - cached.registers - cached.sinks, cached.sinks
            if ring_sinks or cached.registers:
                sinks, kept = ring_sinks, cached.registers + ring_sinks
                last = jnp.where(positions < PAD_POSITION, positions, -1).max(axis=1)  # [B]
                shift = kv_cache.next_shift(last, window, ring_sinks)
                if cached.kept is not None:  # under RoPE: the ring holds them turned for the next position
                    shift, unturned = (None, None) if positions.shape[1] == 1 else (shift, cached.kept)
        valid = slots < positions[:, :1]  # slots at or after the first new position are stale
        join = join and shift is not None and scheme(cfg).rotate is not None
        if join:  # the kept slots move to this call's keys
            new.insert(0, (slots[:, :kept], valid[:, :kept], kept))
            valid = valid & (jnp.arange(slots.shape[1]) >= kept)
        segments.append([(slots, valid, 0 if join else kept)])
    segments.append(new)
    bias_of = scheme(cfg).score_bias

    def bias(k_positions: Array, valid: Array | None, leading: int) -> Array:
        own_order = valid is None and order is not None  # this call's keys, in the input's own order
        if own_order:
            mask = order
        elif cfg.mask == "bidirectional":  # as a query after every position: it sees every key but padding
            mask = ops.causal_mask(jnp.full_like(positions, PAD_POSITION - 1), k_positions)
        else:
            mask = ops.causal_mask(positions, k_positions, valid, window=window, sinks=sinks)
        if bias_of is not None:  # measured from the kept slots' positions moved `shift` towards the queries
            scored = k_positions
            if shift is not None and leading:
                scored = jnp.where(jnp.arange(k_positions.shape[1]) < leading, k_positions + shift[:, None], k_positions)
            mask = mask + bias_of(cfg, positions, scored)  # [B, H, T, S_i]
        return mask

    view = KeyView([], [], kept, shift, cached is not None and join, unturned)
    for parts in segments:
        view.positions.append(jnp.concatenate([part[0] for part in parts], axis=1))
        view.bias.append(jnp.concatenate([bias(*part) for part in parts], axis=-1))
    return view
