"""bench/op_profile.py reads a jax.profiler trace back and names each op after its JAX operation."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from bench.op_profile import hlo_ops, kind, op_seconds


def test_profile_attributes_op_time_to_jax_operations():
    f = jax.jit(lambda a, b: jnp.tanh(a @ b).sum())
    a = jnp.ones((256, 256))
    ops = hlo_ops(f.lower(a, a).compile().as_text())
    assert any(kind(source) == "dot_general" and shape == "f32[256,256]" for shape, source in ops.values())
    f(a, a).block_until_ready()
    seconds = op_seconds(lambda: f(a, a).block_until_ready(), ops)
    assert seconds and all(s > 0 for s in seconds.values())
    assert "dot_general" in {kind(ops[name][1]) for name in seconds}
