"""One fused q/k/v projection against three: the forward and backward of the attention's input maps.

    python bench/qkv_fusion.py     # ~1 minute

At the lecture GPT's shapes (configs/shakespeare.py: batch 32 x 128, d 128, 4 heads of 32), the
jitted gradient of x -> (q, k, v) -> a scalar that uses all three, with W_q, W_k, W_v [H, K, D] as
the model stores them (transformer/model/attention.py): three einsums, or the kernels concatenated into one
[3H, K, D] einsum whose output is split (what a fused W_qkv would compute). Alternating rounds, each
side's fastest; prints a Markdown table. Compare ratios within one run.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from bench import timing

B, T, D, H, K = 32, 128, 128, 4, 32
CALLS = 50  # gradient calls per timed round


def separate(w: list[jax.Array], x: jax.Array) -> jax.Array:
    q, k, v = (jnp.einsum("btd,hkd->bthk", x, w_i) for w_i in w)  # [B, T, H, K] each
    return jnp.sum(jnp.tanh(q) * k * v)


def fused(w: list[jax.Array], x: jax.Array) -> jax.Array:
    qkv = jnp.einsum("btd,hkd->bthk", x, jnp.concatenate(w, axis=0))  # [B, T, 3H, K]
    q, k, v = jnp.split(qkv, 3, axis=2)
    return jnp.sum(jnp.tanh(q) * k * v)


def main() -> None:
    keys = jax.random.split(jax.random.key(0), 4)
    x = jax.random.normal(keys[0], (B, T, D))
    w = [jax.random.normal(key, (H, K, D)) * 0.02 for key in keys[1:]]
    grads = {name: jax.jit(jax.grad(f, argnums=(0, 1))) for name, f in (("three", separate), ("fused", fused))}
    for g in grads.values():
        jax.block_until_ready(g(w, x))  # compile

    def timer(g):
        def run():
            for _ in range(CALLS):
                out = g(w, x)
            jax.block_until_ready(out)
        return lambda: timing.seconds(run) / CALLS

    best = timing.alternate({name: timer(g) for name, g in grads.items()}, rounds=5)
    print(f"### q/k/v projections, forward + backward (batch {B} x {T}, d {D}, {H} heads of {K})\n")
    print("| projection | ms per gradient | x three einsums |")
    print("|---|---|---|")
    for name, seconds in best.items():
        print(f"| {name} | {seconds * 1e3:.2f} | {seconds / best['three']:.2f} |")


if __name__ == "__main__":
    main()
