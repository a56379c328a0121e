"""Which KV-cache layout and update scheme decodes fastest? (the choice behind transformer/model/kv_cache.py)

Times one decode step of L layers of attention (GPT-2 small's shapes: 12 layers, 12 heads of 64)
over a cache of S slots, inside a jitted `lax.scan` over decode steps whose carry holds the cache,
as the sampler runs it. Five variants:

  write-per-layer [L,B,S,G,K]  each layer writes its new key/value into its cache slice and the
                               layer scan returns the updated slices (the textbook way)
  write-per-layer [L,B,G,S,K]  the same with heads before the sequence axis
  read-then-write [L,B,S,G,K]  layers only read the cache; the new entries are written once after
                               the layer scan
  read-then-write [L,B,G,S,K]  the same, heads first
  read-then-write L x [B,G,S,K]  one buffer per layer, layers unrolled, each reading its buffer as it
                               lies (`ops.dot_product_attention` heads_first), then one write per
                               buffer after the layers: what transformer/model/kv_cache.py does, run with
                               cache.py's own init_cache and write

The four stacked variants are alternatives the library no longer has (it keeps the per-layer
buffers): only their own code lives here, the stacked write and the layer scan over the stack.

    python bench/cache_layout.py [--quick]
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp

from bench import timing
from bench.steps import model_config
from configs import gpt2
from transformer.model import kv_cache as cache, ops

CFG = model_config(gpt2.get_config().model)  # GPT-2 small: the per-layer cache is init_cache(CFG, ...)
L, H, K = CFG.num_layers, CFG.num_heads, CFG.head_dim


def decode_loop(step, steps: int):
    """run(kv, x, pos): `steps` decode steps in one jitted lax.scan carrying (kv cache, x, pos)."""

    @jax.jit
    def run(kv, x, pos):
        carry, _ = jax.lax.scan(step, (kv, x, pos), None, length=steps)
        return carry

    return run


def make_per_layer_decode(steps: int):
    """The cache.py scheme: a KVCache of L buffers [B, G, S, K] per kind, written by cache.write."""

    def step(carry, _):
        kv, x, pos = carry  # kv: a tuple of L cache.KVCache (buffers [B, G, S, K]); x [B, 1, H, K]; pos [B, 1]
        s = cache.max_len(kv)
        slots = jnp.broadcast_to(jnp.arange(s), (x.shape[0], s))
        masks = [ops.causal_mask(pos, slots, slots < pos), ops.causal_mask(pos, pos)]
        news = []
        for k_l, v_l in ((c.k, c.v) for c in kv):
            k_new, v_new = x * 0.5, x * 0.25  # stand-ins for the projections
            x, _ = ops.dot_product_attention(x, [k_l, k_new], [v_l, v_new], masks, heads_first=[True, False])
            news.append((k_new, v_new))
        new = tuple(cache.KVCache(k=k, v=v) for k, v in news)
        return (cache.write(kv, new, pos, after=x), x, pos + 1), None

    return decode_loop(step, steps)


def make_decode(layout: str, scheme: str, steps: int):
    """A stacked layout ([L, B, S, G, K] or [L, B, G, S, K]) read by a layer scan, written per layer or
    after the scan: the alternatives to cache.py's per-layer buffers, with their own write."""
    heads_first = layout == "BGSK"

    def attend(q, k_cache, v_cache, k_new, v_new, pos):
        if heads_first:  # [B, G, S, K] -> the [B, S, G, K] that ops expects (XLA fuses the transpose)
            k_cache, v_cache = k_cache.transpose(0, 2, 1, 3), v_cache.transpose(0, 2, 1, 3)
        s = k_cache.shape[1]
        slots = jnp.broadcast_to(jnp.arange(s), (q.shape[0], s))
        masks = [ops.causal_mask(pos, slots, slots < pos), ops.causal_mask(pos, pos)]
        out, _ = ops.dot_product_attention(q, [k_cache, k_new], [v_cache, v_new], masks)
        return out

    def write(c, new, pos):
        """c [(L,) B, S, G, K] or [(L,) B, G, S, K]; new [(L,) B, 1, G, K]; pos [B, 1]."""
        rows = jnp.arange(pos.shape[0])
        if not heads_first:
            return c.at[..., rows[:, None], pos, :, :].set(new)
        values = new[..., 0, :, :]  # [(L,) B, G, K]
        if values.ndim == 4:  # indices split by a slice put their axis first: [B, L, G, K]
            values = jnp.moveaxis(values, 1, 0)
        return c.at[..., rows, :, pos[:, 0], :].set(values)

    def step(carry, _):
        (k_c, v_c), x, pos = carry  # x [B, 1, H, K] stands in for the residual stream

        def layer(x, kv):
            k_l, v_l = kv
            k_new, v_new = x * 0.5, x * 0.25  # stand-ins for the projections
            out = attend(x, k_l, v_l, k_new, v_new, pos)
            if scheme == "write-per-layer":
                k_l, v_l = write(k_l, k_new, pos), write(v_l, v_new, pos)
                return out, (k_l, v_l)
            return out, (k_new, v_new)

        x, ys = jax.lax.scan(layer, x, (k_c, v_c))
        if scheme == "write-per-layer":
            k_c, v_c = ys
        else:
            k_c, v_c = write(k_c, ys[0], pos), write(v_c, ys[1], pos)
        return ((k_c, v_c), x, pos + 1), None

    return decode_loop(step, steps)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true")
    a = p.parse_args()
    steps = 8 if a.quick else 32
    print("| batch | slots S | variant | ms per decode step | vs best |")
    print("| --- | --- | --- | --- | --- |")
    for b, s in ((1, 256), (8, 256)) if a.quick else ((1, 1024), (8, 1024)):
        times = {}
        for layout in ("BSGK", "BGSK", "per-layer"):
            for scheme in ("write-per-layer", "read-then-write"):
                if layout == "per-layer":
                    if scheme == "write-per-layer":
                        continue
                    kv, run = cache.init_cache(CFG, b, s), make_per_layer_decode(steps)
                    name = f"{scheme} L x [B,G,S,K]"
                else:
                    shape = (L, b, s, H, K) if layout == "BSGK" else (L, b, H, s, K)
                    kv, run = (jnp.zeros(shape), jnp.zeros(shape)), make_decode(layout, scheme, steps)
                    name = f"{scheme} [L,B,{'S,G' if layout == 'BSGK' else 'G,S'},K]"
                x = jnp.ones((b, 1, H, K))
                pos = jnp.full((b, 1), 3)
                best = timing.best(lambda: run(kv, x, pos), repeats=3)  # noqa: B023  (its warm-up call compiles)
                times[name] = best / steps * 1e3
        fastest = min(times.values())
        for name, ms in times.items():
            print(f"| {b} | {s} | {name} | {ms:.2f} | {ms / fastest:.2f}x |")


if __name__ == "__main__":
    main()
