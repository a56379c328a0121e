"""Tiny decoders for tests/test_model.py and tests/test_attention.py: configs by attention variant and
position scheme, parameters drawn at a larger scale than the initialiser's, jitted forward / cached
step functions built once per process.

Parameters are drawn at std 0.25 instead of the initialiser's 0.02, so attention is far from
uniform and a wrong mask or a wrong cache slot changes the logits.
"""

from __future__ import annotations

import functools
import types

import jax
import jax.numpy as jnp
import numpy as np

from transformer import ModelConfig
from transformer.model.decoder import Decoder
from transformer.model.key_view import key_view
from transformer.model.kv_cache import init_cache

BASE = dict(vocab_size=64, max_seq_len=16, d_model=32, num_layers=2, num_heads=4)
ATTENTION = {
    "mha": {},
    "gqa": dict(num_kv_heads=2),
    "mqa": dict(num_kv_heads=1),
    "mla": dict(attention="mla", kv_latent_dim=16),
    "mla_q_rope": dict(attention="mla", kv_latent_dim=16, q_latent_dim=24, rope_head_dim=4, v_head_dim=6),
}
# Other choices ride along with the position scheme, so the matrix also covers both norms, all
# activations, biases on/off and tied/untied heads without growing.
POSITION = {
    "learned": dict(position="learned"),
    "sinusoidal": dict(position="sinusoidal", activation="relu"),
    "rope": dict(position="rope", norm="rmsnorm", norm_bias=False, activation="swiglu",
                 use_bias=False, tie_embeddings=False),
    "none": dict(position="none", activation="gelu_tanh", tie_embeddings=False),
    "alibi": dict(position="alibi", norm="rmsnorm", norm_bias=False),
}

# The tests check what the model computes, not how fast, and compiling dominates their time: XLA's
# LLVM backend at optimisation level 0 compiles these tiny programs ~35% faster. (HLO passes still
# run; tests/test_model.py::test_jit_and_eager_agree compiles with the default options.)
jit = functools.partial(jax.jit, compiler_options={"xla_backend_optimization_level": 0})

T = 12  # full sequence length
PREFILL = 7
TOL = dict(rtol=1e-5, atol=1e-5)


def segment_masks(positions, cache_len: int | None, registers: int = 0) -> list:
    """The key view's biases (model/key_view.py) for one layer without a window, with a cache of
    `cache_len` slots for tokens and `registers` leading register slots, or none (cache_len None)."""
    cfg = ModelConfig(vocab_size=8, max_seq_len=64, d_model=8, num_layers=1, num_heads=2, position="none",
                      num_registers=registers, dtype="float32", attention_impl="reference")
    cached = None
    if cache_len is not None:
        cached = jax.tree.map(lambda layers: layers[0], init_cache(cfg, positions.shape[0], cache_len),
                              is_leaf=lambda x: isinstance(x, tuple))
    return key_view(cfg, positions, cached).bias


def make_cfg(attention="gqa", position="rope", prenorm=True, **extra) -> ModelConfig:
    return ModelConfig(**{**BASE, **ATTENTION[attention], **POSITION[position], "prenorm": prenorm, **extra})


def random_params(model: Decoder, seed: int = 0, std: float = 0.25, inputs: tuple | None = None):
    """Params of `model`'s structure, drawn N(0, std) (norm gains 1 + N(0, std)), float32.

    inputs: what `model.init` takes besides the key, for a module other than a Decoder."""
    inputs = (jnp.zeros((1, 4), jnp.int32),) if inputs is None else inputs
    shapes = jax.eval_shape(model.init, jax.random.key(0), *inputs)["params"]
    rng = np.random.default_rng(seed)

    def draw(path, s):
        x = rng.standard_normal(s.shape) * std
        if path[-1].key == "scale":
            x = 1.0 + x
        return jnp.asarray(x, s.dtype)

    return jax.tree_util.tree_map_with_path(draw, shapes)


@functools.lru_cache(maxsize=None)
def build(attention="gqa", position="rope", prenorm=True, **extra):
    """A tiny model, its params and jitted forward/cached-step functions (cached per process)."""
    cfg = make_cfg(attention, position, prenorm, **extra)
    model = Decoder(cfg)
    params = random_params(model)
    forward_at = jit(lambda p, tokens, positions: model.apply({"params": p}, tokens, positions)[0])

    def forward(p, tokens, positions=None):  # one program for default and explicit positions
        if positions is None:
            positions = np.broadcast_to(np.arange(tokens.shape[1]), tokens.shape)
        return forward_at(p, tokens, positions)

    step = jit(lambda p, tokens, positions, cache: model.apply({"params": p}, tokens, positions, cache))
    tokens = np.random.default_rng(1).integers(0, cfg.vocab_size, (2, T)).astype(np.int32)
    return types.SimpleNamespace(cfg=cfg, model=model, params=params, forward=forward, step=step, tokens=tokens)


def max_diff(a, b):
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
