"""attention_impl and dtype: the model's attention paths against an independent float32 reference.

ModelConfig.attention_impl picks how the cache-free forward (training, prefill without a cache)
computes attention: 'reference' (ops.dot_product_attention's own einsums and float32 softmax),
'xla' (jax.nn.dot_product_attention's XLA implementation) or 'cudnn' (its cuDNN kernel, GPU only).
Each is held to tests/helpers/reference.py, a decoder written from the lecture's formulas that
shares no code with transformer/model (so a broken mask or scale in the model breaks one side
only), at parameters drawn at std 0.25 where attention is far from uniform: in float32 tightly
(logits and gradients), in bfloat16 at about twice its largest measured error, under a fifth of a
broken model's (tests/helpers/reference.py has the figures). test_a_broken_mask_or_scale_fails_
every_comparison breaks the mask and the scale and sees every comparison fail.

Variants: MHA with sinusoidal positions and ReLU, GQA with RoPE, RMSNorm and SwiGLU, MQA post-norm
with learned positions, MLA with a query latent and decoupled RoPE (tests/helpers/decoder.py).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers.marks import first_fast
from tests.helpers import reference
from tests.helpers.decoder import BASE, T, TOL, jit, make_cfg, random_params
from transformer import init_cache
from transformer.model import ops
from transformer.model.decoder import Decoder

VARIANTS = {  # name: (attention, position, prenorm) as tests/helpers/decoder.py spells them
    "mha": ("mha", "sinusoidal", True),
    "gqa": ("gqa", "rope", True),
    "mqa": ("mqa", "learned", False),
    "mla": ("mla_q_rope", "rope", True),
}
B = 2
TOKENS = np.random.default_rng(1).integers(0, BASE["vocab_size"], (B, T)).astype(np.int32)  # as build()'s
TARGETS = np.roll(TOKENS, -1, axis=1)
# Gradients: each leaf's largest error as a share of its largest |value|, measured 8e-7 .. 3e-6 in
# float32 (the largest over a variant's leaves): ~10x.
GRAD_TOL = 3e-5


def variant(name: str, **extra):
    """The variant's config and its parameters at std 0.25 (the same draw for every dtype / impl)."""
    cfg = make_cfg(*VARIANTS[name], **extra)
    return cfg, random_params(Decoder(cfg))


def model_logits(params, cfg, tokens):
    return Decoder(cfg).apply({"params": params}, tokens)[0]


def reference_logits(params, cfg, tokens):
    return reference.logits(cfg, params, tokens)


def loss_logits_and_grads(logits_fn):
    """A jitted (params, cfg) -> ((cross-entropy on TOKENS -> TARGETS, logits), gradients)."""
    def loss(params, cfg):
        logits = logits_fn(params, cfg, TOKENS)
        return reference.cross_entropy(logits, TARGETS), logits

    return jit(jax.value_and_grad(loss, has_aux=True), static_argnums=1)


# Module-level, so it keeps its traces: never called under a breakage (that test traces its own).
model_run = loss_logits_and_grads(model_logits)


@functools.lru_cache(maxsize=None)
def reference_run(name: str, scan_layers: bool = True):
    """((loss, logits), gradients) of the float32 reference decoder on the variant's parameters."""
    cfg, params = variant(name, scan_layers=scan_layers)
    return loss_logits_and_grads(reference_logits)(params, cfg)


def make_forward(configs):
    """A new jitted params -> [logits of each config on TOKENS]: traced on its first call, so it
    computes the model as the code is then."""
    return jit(lambda params: [model_logits(params, cfg, TOKENS) for cfg in configs])


# ----------------------------------------------------------------------------- float32


# Every variant with nn.scan over the layers (the default), and the unrolled loop once for the
# Attention module and once for LatentAttention.
@pytest.mark.parametrize(
    "name, scan_layers",  # make test: GQA scanned (the default layout); the other variants in test-all
    first_fast([("gqa", True)] + [(a, True) for a in VARIANTS if a != "gqa"] + [("mha", False), ("mla", False)],
               ids=["gqa-scan"] + [f"{a}-scan" for a in VARIANTS if a != "gqa"] + ["mha-loop", "mla-loop"]),
)
def test_reference_and_xla_paths_give_the_float32_reference_logits_and_gradients(name, scan_layers):
    """Independent: both attention_impl paths' logits, loss and every gradient leaf against the
    reference decoder's (jax.grad of the same cross-entropy of its logits)."""
    cfg, params = variant(name, scan_layers=scan_layers)
    (want_loss, want_logits), want_grads = reference_run(name, scan_layers)
    largest = max(float(np.abs(g).max()) for g in jax.tree.leaves(want_grads))
    for impl in ("reference", "xla"):
        (loss, logits), grads = model_run(params, cfg.replace(attention_impl=impl))
        reference.assert_close(logits, want_logits, reference.FLOAT32_TOL, what=f"{impl} logits")
        np.testing.assert_allclose(loss, want_loss, rtol=reference.FLOAT32_TOL)
        assert jax.tree.structure(grads) == jax.tree.structure(want_grads)
        for path, g in jax.tree_util.tree_leaves_with_path(grads):
            g_want, where = _at(want_grads, path), f"{impl} gradient {jax.tree_util.keystr(path)}"
            if [key.key for key in path[-2:]] == ["k", "bias"]:
                # b_k adds q . b_k to every score of a query alike, which the softmax ignores: 0.
                assert max(float(np.abs(a).max()) for a in (g, g_want)) < 1e-6 * largest, where
                continue
            assert np.abs(np.asarray(g_want)).max() > 1e-3 * largest, f"{where} is (nearly) zero"
            reference.assert_close(g, g_want, GRAD_TOL, what=where)


def _at(tree, path):
    for key in path:
        tree = tree[key.key]
    return tree


@pytest.mark.parametrize("name", ["gqa", "mla"])
def test_xla_prefill_into_a_cache_equals_reference(name):
    """With a cache, attention_impl='xla' falls back to the reference path (two key segments):
    prefill and one decode step give the reference path's logits and cache (the same code, so
    this checks the fallback), and the prefill gives the float32 reference's logits (independent)."""
    ref, params = variant(name)
    positions = np.broadcast_to(np.arange(T), (B, T))

    def prefill_and_step(params, cfg, cache):
        logits, cache = Decoder(cfg).apply({"params": params}, TOKENS, positions, cache)
        step, cache = Decoder(cfg).apply({"params": params}, TOKENS[:, :1], positions[:, -1:] + 1, cache)
        return logits, step, cache

    run = jit(prefill_and_step, static_argnums=1)
    outs = {}
    for impl in ("reference", "xla"):
        cfg = ref.replace(attention_impl=impl)
        outs[impl] = run(params, cfg, init_cache(cfg, batch_size=B, max_len=T + 1))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, **TOL), outs["xla"], outs["reference"])
    (_, want), _ = reference_run(name)
    reference.assert_close(outs["xla"][0], want, reference.FLOAT32_TOL, what="xla prefill")


# ----------------------------------------------------------------------------- bfloat16


@pytest.mark.parametrize("name", first_fast(list(VARIANTS), list(VARIANTS)))
def test_bfloat16_logits_stay_close_to_the_float32_reference(name):
    """Independent: bfloat16 compute (float32 parameters, float32 softmax and norms) on both paths
    gives finite float32 logits within BFLOAT16_TOL of the float32 reference decoder's."""
    cfg, params = variant(name, dtype="bfloat16")
    (_, want), _ = reference_run(name)
    impls = ("reference", "xla")
    for impl, got in zip(impls, make_forward([cfg.replace(attention_impl=i) for i in impls])(params)):
        assert got.dtype == jnp.float32  # logits are float32 whatever the compute dtype
        reference.assert_close(got, want, reference.BFLOAT16_TOL, what=f"{impl} bfloat16 logits")


# ----------------------------------------------------------------------------- the comparisons fail a broken model


def _no_causal_mask(monkeypatch):
    real = ops.causal_mask
    monkeypatch.setattr(ops, "causal_mask", lambda *args, **kw: jnp.zeros_like(real(*args, **kw)))


def _scale_by(monkeypatch, wrong):
    """Scores scaled by wrong(s) for the right s = 1/sqrt(d_h) (MLA passes its 1/sqrt(K + Kr))."""
    real = ops.dot_product_attention

    def broken(q, k, v, mask=None, *, scale=None, **kw):
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        return real(q, k, v, mask, scale=wrong(scale), **kw)

    monkeypatch.setattr(ops, "dot_product_attention", broken)


BREAKAGES = {
    "no-causal-mask": _no_causal_mask,  # every key visible to every query
    "scale-1/d_h": lambda mp: _scale_by(mp, lambda s: s * s),
    "no-scale": lambda mp: _scale_by(mp, lambda s: 1.0),
}
# The comparisons of the tests above, (dtype, attention_impl, tolerance); ("bfloat16", "reference")
# on "gqa" is also tests/test_model.py::test_bfloat16_compute_keeps_float32_params's (same config,
# parameters, tokens and tolerance).
COMPARISONS = [
    ("float32", "reference", reference.FLOAT32_TOL),
    ("float32", "xla", reference.FLOAT32_TOL),
    ("bfloat16", "reference", reference.BFLOAT16_TOL),
    ("bfloat16", "xla", reference.BFLOAT16_TOL),
]
MARGIN = 3  # a broken model fails even at 3x each tolerance


@pytest.mark.parametrize("name", list(VARIANTS))
@pytest.mark.parametrize("breakage", list(BREAKAGES))
def test_a_broken_mask_or_scale_fails_every_comparison(breakage, name, monkeypatch):
    """With the causal mask or the score scale broken in transformer.model.ops, reference.assert_close
    fails every comparison above (both dtypes and paths) even at MARGIN times its tolerance."""
    BREAKAGES[breakage](monkeypatch)
    cfg, params = variant(name)
    (_, want), _ = reference_run(name)  # the reference shares no code with the broken model
    configs = [cfg.replace(dtype=dtype, attention_impl=impl) for dtype, impl, _ in COMPARISONS]
    passed = []
    for (dtype, impl, tol), got in zip(COMPARISONS, make_forward(configs)(params)):  # a fresh trace
        try:
            err = reference.assert_close(got, want, MARGIN * tol)
        except AssertionError as failure:
            assert "off the float32 reference" in str(failure)  # failed on the numbers, not on NaNs
        else:
            passed.append(f"{dtype} {impl} (error {err:.2g}, tolerance {tol:.2g})")
    assert not passed, f"{name} with {breakage} passes: {passed}"


# ----------------------------------------------------------------------------- cuDNN


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="checks the CPU behaviour; on a GPU cuDNN may run")
def test_cudnn_is_gpu_only_and_says_so_on_cpu():
    """attention_impl='cudnn' is accepted by ModelConfig (it is a property of the hardware, not
    of the model), but off a GPU the first call names the problem and the fix, at trace time."""
    cfg = make_cfg("mha", attention_impl="cudnn", dtype="bfloat16")
    with pytest.raises(ValueError, match="needs an NVIDIA GPU.*attention_impl='xla'"):
        Decoder(cfg).init(jax.random.key(0), TOKENS)


def test_cudnn_needs_half_precision():
    with pytest.raises(ValueError, match="attention_impl='cudnn'.*bfloat16 or float16.*dtype='bfloat16'"):
        make_cfg("mha", attention_impl="cudnn", dtype="float32")
