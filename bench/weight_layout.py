"""Batch-1 decoding reads every weight once: how fast XLA:CPU reads them in each weight layout.

    python bench/weight_layout.py     # ~1 minute

GPT-2 small's 12 layers of matrix-vector products (W_qkv [768, 2304], W_o [768, 768],
W_in [768, 3072], W_out [3072, 768]; 340 MB of float32, far more than the CPU caches), run as one
jitted chain at batch 1 and 8, with the weights stored as Flax keeps them, [in, out] (x @ W), or
transposed, [out, in] (x @ W^T, PyTorch's layout), and the time to read the same bytes with numpy
(the floor). The model stores [out, in] (transformer/model/linear.py); this measures what that choice gains.
Prints a Markdown table; compare ratios within one run.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import jax
import jax.numpy as jnp

from bench import timing

D, F, LAYERS = 768, 3072, 12
SHAPES = ((D, 3 * D), (D, D), (D, F), (F, D))  # [in, out]: qkv, o, mlp in, mlp out
REPEATS = 15  # timed calls of each chain, after one that compiles it


def layer_chain(matmul: Callable[[jax.Array, jax.Array], jax.Array]):
    """x [B, D] through LAYERS layers of attention-shaped and MLP-shaped products (no attention)."""

    def chain(x, weights):
        for w_qkv, w_o, w_in, w_out in weights:
            qkv = matmul(x, w_qkv)
            x = x + matmul(qkv[:, :D] + qkv[:, D:2 * D] + qkv[:, 2 * D:], w_o)
            x = x + matmul(jax.nn.gelu(matmul(x, w_in)), w_out)
        return x

    return jax.jit(chain)


def main() -> None:
    keys = iter(jax.random.split(jax.random.key(0), LAYERS * len(SHAPES)))
    in_out = [[jax.random.normal(next(keys), s) * 0.02 for s in SHAPES] for _ in range(LAYERS)]
    out_in = [[w.T.copy() for w in layer] for layer in in_out]
    num_bytes = sum(w.size * 4 for layer in in_out for w in layer)
    in_out_layout = layer_chain(lambda x, w: x @ w)
    out_in_layout = layer_chain(lambda x, w: jnp.einsum("bi,oi->bo", x, w))
    floor = timing.read_seconds(num_bytes, repeats=5)
    print(f"### Weight reading by layout: GPT-2 small's layers, {num_bytes / 1e6:.0f} MB of float32 "
          f"weights, {os.cpu_count()} cores\n")
    print(f"Floor (numpy reads the same bytes): {floor * 1e3:.1f} ms.\n")
    print("| batch | [in, out] ms | [out, in] ms | [out, in] speed-up | [in, out] / floor | [out, in] / floor |")
    print("|---|---|---|---|---|---|")
    for batch in (1, 8):
        x = jnp.ones((batch, D))
        a = timing.best(lambda: in_out_layout(x, in_out), REPEATS)  # noqa: B023
        b = timing.best(lambda: out_in_layout(x, out_in), REPEATS)  # noqa: B023
        print(f"| {batch} | {a * 1e3:.1f} | {b * 1e3:.1f} | {a / b:.2f}x | {a / floor:.2f}x | {b / floor:.2f}x |")


if __name__ == "__main__":
    main()
