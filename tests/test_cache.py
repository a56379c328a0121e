"""Tests of transformer/model/kv_cache.py: shapes, bytes per token, errors, pytree behaviour, writes."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import gpt2
from transformer import KVCache, LatentCache, ModelConfig, init_cache, kv_cache_bytes_per_token
from transformer.model import kv_cache
from transformer.model.execution import resolve_auto

BASE = dict(vocab_size=64, max_seq_len=16, d_model=32, num_layers=2, num_heads=4)  # K = 8
CFGS = {
    "mha": ModelConfig(**BASE),
    "gqa": ModelConfig(**BASE, num_kv_heads=2),
    "mqa": ModelConfig(**BASE, num_kv_heads=1),
    "mla": ModelConfig(**BASE, attention="mla", kv_latent_dim=12, position="rope", rope_head_dim=4),
    "mla_nope": ModelConfig(**BASE, attention="mla", kv_latent_dim=12),
}


@pytest.mark.parametrize(
    "name,shape",
    [
        ("mha", (3, 4, 10, 8)),  # per layer [B, G, S, K]
        ("gqa", (3, 2, 10, 8)),
        ("mqa", (3, 1, 10, 8)),
        ("mla", (3, 10, 12 + 4)),  # per layer [B, S, C + R]
        ("mla_nope", (3, 10, 12)),
    ],
)
def test_init_cache_shapes(name, shape):
    cache = init_cache(CFGS[name], batch_size=3, max_len=10)
    assert all(isinstance(c, LatentCache if name.startswith("mla") else KVCache) for c in cache)  # one per layer
    buffers = jax.tree.leaves(cache)
    assert len(buffers) == CFGS[name].num_layers * (1 if name.startswith("mla") else 2)  # one per layer
    chex.assert_shape(buffers, shape)
    assert all(x.dtype == jnp.float32 and not np.any(np.asarray(x)) for x in jax.tree.leaves(cache))
    assert kv_cache.max_len(cache) == 10
    assert {x.dtype for x in jax.tree.leaves(init_cache(CFGS[name], 1, 4, dtype="bfloat16"))} == {
        jnp.dtype(jnp.bfloat16)
    }
    bf16_cfg = CFGS[name].replace(dtype="bfloat16")
    assert {x.dtype for x in jax.tree.leaves(init_cache(bf16_cfg, 1, 4))} == {jnp.dtype(jnp.bfloat16)}


# Expected bytes per token, by hand. L = 2 layers, K = 8, float32 = 4 bytes.
#   MHA/GQA/MQA: L * 2 (key and value) * G * K * itemsize;  MLA: L * (C + R) * itemsize.
EXPECTED_BYTES = {
    "mha": 2 * 2 * 4 * 8 * 4,  # 512
    "gqa": 2 * 2 * 2 * 8 * 4,  # 256
    "mqa": 2 * 2 * 1 * 8 * 4,  # 128
    "mla": 2 * (12 + 4) * 4,  # 128
    "mla_nope": 2 * 12 * 4,  # 96
}


@pytest.mark.parametrize("name", list(EXPECTED_BYTES))
def test_bytes_per_token_formula_and_measured(name):
    cfg = CFGS[name]
    expected = EXPECTED_BYTES[name]
    assert kv_cache_bytes_per_token(cfg) == expected
    assert kv_cache_bytes_per_token(cfg, "bfloat16") == expected // 2
    assert kv_cache.measured_bytes_per_token(init_cache(cfg, 3, 10)) == expected
    assert kv_cache.measured_bytes_per_token(init_cache(cfg, 2, 5, dtype="bfloat16")) == expected // 2


@pytest.mark.parametrize("name", list(EXPECTED_BYTES))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_exported_kv_cache_bytes_per_token_counts_init_cache_buffers(name, dtype):
    """The package's public name, against the bytes init_cache allocates: every layer's buffers."""
    cfg = CFGS[name].replace(dtype=dtype)
    batch, slots = 3, 10
    cache = init_cache(cfg, batch, slots)
    buffers = jax.tree.leaves(cache)
    assert len(buffers) == cfg.num_layers * (1 if cfg.attention == "mla" else 2)
    assert kv_cache_bytes_per_token(cfg) == sum(b.nbytes for b in buffers) // (batch * slots)
    assert kv_cache_bytes_per_token(cfg) == EXPECTED_BYTES[name] * jnp.dtype(dtype).itemsize // 4


def test_gqa_and_mla_caches_are_smaller_than_mha():
    mha = kv_cache_bytes_per_token(CFGS["mha"])
    assert kv_cache_bytes_per_token(CFGS["gqa"]) == mha // 2
    assert kv_cache_bytes_per_token(CFGS["mqa"]) == mha // 4
    assert kv_cache_bytes_per_token(CFGS["mla"]) < mha
    # GPT-2 small in float32 (a CPU's 'auto' dtype): 12 layers * 2 * 12 heads * 64 * 4 bytes = 73,728
    # bytes (72 KiB) per token.
    assert kv_cache_bytes_per_token(resolve_auto(ModelConfig.from_dict(gpt2.get_config().model), "cpu").cfg) == 73_728


def test_init_cache_longer_than_context_raises():
    cfg = CFGS["gqa"]
    init_cache(cfg, 1, cfg.max_seq_len)  # exactly the context is fine
    with pytest.raises(ValueError, match="max_seq_len"):
        init_cache(cfg, 1, cfg.max_seq_len + 1)


@pytest.mark.parametrize("name", ["gqa", "mla"])
def test_cache_is_a_pytree_through_jit_and_scan(name):
    cfg = CFGS[name]
    cache = init_cache(cfg, 2, 6)
    leaves, treedef = jax.tree.flatten(cache)
    assert len(leaves) == cfg.num_layers * (1 if name == "mla" else 2)
    assert type(jax.tree.unflatten(treedef, leaves)) is type(cache)

    plus_one = jax.jit(lambda c: jax.tree.map(lambda x: x + 1, c))(cache)
    assert type(plus_one) is type(cache)
    assert all(np.all(np.asarray(x) == 1) for x in jax.tree.leaves(plus_one))

    # Carried by lax.scan: step t writes the value t + 1 at slot t of every row.
    def step(c, t):  # the layers return new entries as [B, T, G, K] / [B, T, C + R] each
        if name == "mla":
            new = jax.tree.map(lambda x: jnp.full((2, 1, x.shape[2]), t + 1.0, x.dtype), c)
        else:
            new = jax.tree.map(lambda x: jnp.full((2, 1, x.shape[1], x.shape[3]), t + 1.0, x.dtype), c)
        return kv_cache.write(c, new, jnp.full((2, 1), t)), None

    filled, _ = jax.jit(lambda c: jax.lax.scan(step, c, jnp.arange(4)))(cache)
    assert type(filled) is type(cache)
    for x in jax.tree.leaves(filled):
        x = np.asarray(x) if name == "mla" else np.moveaxis(np.asarray(x), 2, 1)  # slots to axis 1
        per_slot = x.reshape(*x.shape[:2], -1)
        np.testing.assert_array_equal(per_slot[:, :4], np.broadcast_to(np.arange(1.0, 5.0)[:, None], per_slot[:, :4].shape))
        assert not np.any(per_slot[:, 4:])


@pytest.mark.parametrize("name", ["gqa", "mla"])
def test_layer_caches_and_stacking(name):
    """cache[i] is layer i's buffers; kv_cache.stacked / per_layer convert to and from [L, ...]
    arrays (the scanned layout's one boundary), and per_layer puts the layers back together."""
    cache = jax.tree.map(lambda x: x + jnp.arange(x.size, dtype=x.dtype).reshape(x.shape), init_cache(CFGS[name], 2, 6))
    times = lambda x: x * jnp.arange(1, 3).reshape(2, *[1] * (x.ndim - 1))  # noqa: E731
    L = CFGS[name].num_layers
    cache = kv_cache.per_layer(jax.tree.map(times, kv_cache.stacked(cache)), L)  # layer i's values times i + 1
    stack = kv_cache.stacked(cache)
    for i in range(L):
        view = cache[i]
        assert type(view) is type(stack) and kv_cache.max_len((view,)) == 6
        for got, whole in zip(jax.tree.leaves(view), jax.tree.leaves(stack), strict=True):
            np.testing.assert_array_equal(got, whole[i])
    assert jax.tree.structure(kv_cache.per_layer(stack, L)) == jax.tree.structure(cache)
    views = [cache[i] for i in range(L)]
    joined = tuple(views)
    assert jax.tree.structure(joined) == jax.tree.structure(cache)
    for got, want in zip(jax.tree.leaves(joined), jax.tree.leaves(cache), strict=True):
        np.testing.assert_array_equal(got, want)
    assert not np.array_equal(*[np.asarray(jax.tree.leaves(c)[0]) for c in cache[:2]])  # layers differ


def test_write_puts_each_row_at_its_own_positions():
    cfg = CFGS["gqa"]
    cache = init_cache(cfg, 2, 8)
    L, G, K = cfg.num_layers, cfg.num_kv_heads, cfg.head_dim
    new_k = jnp.arange(1.0, 1 + L * 2 * 3 * G * K).reshape(L, 2, 3, G, K)  # [L, B, T, G, K]
    new = kv_cache.per_layer(KVCache(k=new_k, v=-new_k), L)
    positions = jnp.array([[0, 1, 2], [4, 5, 6]])
    out = kv_cache.stacked(kv_cache.write(cache, new, positions))
    k = np.moveaxis(np.asarray(out.k), 3, 2)  # [L, B, G, S, K] -> [L, B, S, G, K] to compare
    np.testing.assert_array_equal(k[:, 0, 0:3], new_k[:, 0])
    np.testing.assert_array_equal(k[:, 1, 4:7], new_k[:, 1])
    np.testing.assert_array_equal(np.moveaxis(np.asarray(out.v), 3, 2), -k)
    assert not np.any(k[:, 0, 3:]) and not np.any(k[:, 1, :4]) and not np.any(k[:, 1, 7:])
    # Out-of-range slots are dropped, not clipped onto the last slot.
    first = kv_cache.per_layer(KVCache(k=new_k[:, :, :1], v=new_k[:, :, :1]), L)
    dropped = kv_cache.write(cache, first, jnp.array([[8], [9]]))
    assert not any(np.any(np.asarray(x)) for x in jax.tree.leaves(dropped))


@pytest.mark.parametrize("layout", ["plain", "windowed", "rolling", "registers"])
@pytest.mark.parametrize("name", ["gqa", "mla"])
def test_every_cache_is_a_tuple_of_one_layer_cache_each_with_one_set_of_field_types(name, layout):
    """Whatever the layers hold (full buffers, rings of W beside full buffers, a rolling ring with sinks,
    register slots), the cache is L layer caches of one class, each field one layer's array (or None)."""
    extra = dict(windowed=dict(attention_window=4, global_every=2), registers=dict(num_registers=2)).get(layout, {})
    cfg = CFGS[name].replace(**extra, position="rope", **({"rope_head_dim": 4} if name == "mla" else {}))
    cache = kv_cache.init_rolling_cache(cfg, 3, sinks=2) if layout == "rolling" else init_cache(cfg, 3, 8)
    kind, rank = (LatentCache, 3) if name == "mla" else (KVCache, 4)  # [B, R + S, C + Kr] or [B, G, R + S, K]
    assert isinstance(cache, tuple) and len(cache) == cfg.num_layers
    for layer in cache:
        assert type(layer) is kind
        for buffer in kv_cache.buffers(layer).values():
            assert buffer.ndim == rank and buffer.shape[0] == 3
        assert layer.positions is None or layer.positions.shape == (3, kv_cache.slots(layer))
        assert isinstance(layer.registers, int) and isinstance(layer.sinks, int)
    rings = [layer.positions is not None for layer in cache]
    assert rings == {"plain": [False, False], "registers": [False, False], "windowed": [True, False],
                     "rolling": [True, True]}[layout]
