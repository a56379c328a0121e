"""attention_impl: the fused `jax.nn.dot_product_attention` paths against the reference einsum path.

ModelConfig.attention_impl picks how the cache-free forward (training, prefill without a cache)
computes attention: 'reference' (ops.dot_product_attention's own einsums and float32 softmax),
'xla' (jax.nn.dot_product_attention's XLA implementation) or 'cudnn' (its cuDNN kernel, GPU only).
The first two must be the same function: same logits and same gradients, for multi-head,
grouped-query and latent (MLA) attention, in float32 and, loosely, in bfloat16.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer import ModelConfig, init_cache
from transformer.model.decoder import Decoder
from transformer.training.loss import loss_fn

BASE = dict(vocab_size=64, max_seq_len=16, d_model=32, num_layers=2, num_heads=4)
ATTENTION = {
    "mha": dict(position="learned"),
    "gqa": dict(num_kv_heads=2, position="rope", norm="rmsnorm", norm_bias=False, activation="swiglu",
                use_bias=False, tie_embeddings=False),
    "mqa": dict(num_kv_heads=1, position="sinusoidal", prenorm=False),
    "mla": dict(attention="mla", kv_latent_dim=16, q_latent_dim=24, rope_head_dim=4, v_head_dim=6,
                position="rope", norm="rmsnorm", norm_bias=False, use_bias=False),
}
B, T = 2, 12
TOL = dict(rtol=1e-5, atol=1e-5)


def make_cfg(attention: str, **extra) -> ModelConfig:
    return ModelConfig(**{**BASE, **ATTENTION[attention], **extra})


def tokens(seed: int = 0, b: int = B, t: int = T) -> jax.Array:
    return jax.random.randint(jax.random.key(seed), (b, t), 0, BASE["vocab_size"])


def init(cfg: ModelConfig, scale: float = 0.25):
    """Parameters redrawn at std `scale` (norm gains kept at 1), so attention is far from uniform
    and a wrong mask or a wrong softmax shows in the logits."""
    params = Decoder(cfg).init(jax.random.key(1), tokens())["params"]
    leaves, treedef = jax.tree_util.tree_flatten_with_path(params)
    keys = jax.random.split(jax.random.key(2), len(leaves))
    redrawn = [
        x if path[-1].key == "scale" else scale * jax.random.normal(k, x.shape, x.dtype)
        for k, (path, x) in zip(keys, leaves)
    ]
    return jax.tree.unflatten(treedef, redrawn)


@functools.partial(jax.jit, static_argnums=0)
def logits_of(cfg: ModelConfig, params, x: jax.Array) -> jax.Array:
    return Decoder(cfg).apply({"params": params}, x)[0]


@functools.partial(jax.jit, static_argnums=1)
def loss_and_grads(params, cfg: ModelConfig, x: jax.Array, y: jax.Array):
    return jax.value_and_grad(loss_fn)(params, cfg, x, y, None)


# Every attention variant with nn.scan over the layers (the default), and the unrolled loop once
# for the Attention module and once for LatentAttention.
@pytest.mark.parametrize(
    "attention, scan_layers",
    [(a, True) for a in ATTENTION] + [("mha", False), ("mla", False)],
    ids=[f"{a}-scan" for a in ATTENTION] + ["mha-loop", "mla-loop"],
)
def test_xla_equals_reference_logits_and_gradients(attention, scan_layers):
    ref = make_cfg(attention, scan_layers=scan_layers)
    xla = ref.replace(attention_impl="xla")
    params = init(ref)
    x, y = tokens(0), tokens(1)

    np.testing.assert_allclose(logits_of(xla, params, x), logits_of(ref, params, x), **TOL)

    loss_ref, grads_ref = loss_and_grads(params, ref, x, y)
    loss_xla, grads_xla = loss_and_grads(params, xla, x, y)
    np.testing.assert_allclose(loss_xla, loss_ref, **TOL)
    assert jax.tree.structure(grads_xla) == jax.tree.structure(grads_ref)
    for path, g_ref in jax.tree_util.tree_leaves_with_path(grads_ref):
        g_xla = _at(grads_xla, path)
        assert np.abs(np.asarray(g_ref)).max() > 0, f"gradient {jax.tree_util.keystr(path)} is all zero"
        np.testing.assert_allclose(g_xla, g_ref, **TOL, err_msg=jax.tree_util.keystr(path))


def _at(tree, path):
    for key in path:
        tree = tree[key.key]
    return tree


@pytest.mark.parametrize("attention", ["gqa", "mla"])
def test_xla_prefill_into_a_cache_equals_reference(attention):
    """With a cache, attention_impl='xla' falls back to the reference path (two key segments):
    prefill and one decode step give the reference's logits and cache."""
    ref = make_cfg(attention)
    xla = ref.replace(attention_impl="xla")
    params = init(ref)
    x = tokens(0)
    positions = jnp.broadcast_to(jnp.arange(T), (B, T))
    outs = {}
    for name, cfg in (("ref", ref), ("xla", xla)):
        cache = init_cache(cfg, batch_size=B, max_len=T + 1)
        logits, cache = Decoder(cfg).apply({"params": params}, x, positions, cache)
        step, cache = Decoder(cfg).apply({"params": params}, x[:, :1], positions[:, -1:] + 1, cache)
        outs[name] = (logits, step, cache)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, **TOL), outs["xla"], outs["ref"])


@pytest.mark.parametrize("attention", list(ATTENTION))
def test_bfloat16_forward_runs_and_stays_close_to_float32(attention):
    """bfloat16 compute (float32 parameters, float32 softmax and norms): finite logits within a
    loose tolerance of float32's, at the initialiser's scale (std 0.02)."""
    f32 = make_cfg(attention, attention_impl="xla")
    bf16 = f32.replace(dtype="bfloat16")
    params = Decoder(f32).init(jax.random.key(1), tokens())["params"]
    x = tokens(0)
    want = logits_of(f32, params, x)
    got = logits_of(bf16, params, x)
    assert got.dtype == jnp.float32  # logits are returned in float32 whatever the compute dtype
    assert np.isfinite(np.asarray(got)).all()
    # bfloat16 keeps 8 significant bits (~0.4% relative); over 2 layers the logits move by ~0.4% of
    # their largest magnitude on this model: allow 2%.
    scale = float(jnp.abs(want).max())
    np.testing.assert_allclose(got, want, rtol=0, atol=0.02 * scale)
    # ... and the reference path agrees with it in bfloat16 as well.
    other = logits_of(bf16.replace(attention_impl="reference"), params, x)
    np.testing.assert_allclose(got, other, rtol=0, atol=0.01 * scale)


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="checks the CPU behaviour; on a GPU cuDNN may run")
def test_cudnn_is_gpu_only_and_says_so_on_cpu():
    """attention_impl='cudnn' is accepted by ModelConfig (it is a property of the hardware, not
    of the model), but off a GPU the first call names the problem and the fix, at trace time."""
    cfg = make_cfg("mha", attention_impl="cudnn", dtype="bfloat16")
    with pytest.raises(ValueError, match="needs an NVIDIA GPU.*attention_impl='xla'"):
        Decoder(cfg).init(jax.random.key(0), tokens())


def test_cudnn_needs_half_precision():
    with pytest.raises(ValueError, match="attention_impl='cudnn'.*bfloat16 or float16.*dtype='bfloat16'"):
        make_cfg("mha", attention_impl="cudnn", dtype="float32")
