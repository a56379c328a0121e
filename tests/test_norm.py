"""Tests of transformer/model/norm.py: the Norm module (layer norm or RMSNorm, with or without gain and
bias) against ops.layer_norm / ops.rms_norm, which tests/test_ops.py checks against NumPy."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer.model import ops
from transformer.model.norm import Norm

D = 16
TOL = dict(rtol=1e-6, atol=1e-6)


def _x(seed=0, dtype=np.float32):
    """[2, 3, D] inputs far from zero mean and unit variance, so every step of a norm shows."""
    return (np.random.default_rng(seed).standard_normal((2, 3, D)) * 3 + 1).astype(dtype)


def _shapes(norm: Norm) -> dict:
    """{parameter name: (shape, dtype)}; {} for a norm without parameters."""
    return {name: (p.shape, p.dtype) for name, p in norm.init(jax.random.key(0), _x()).get("params", {}).items()}


def _random_params(norm: Norm, x=None, seed=1) -> dict:
    """The module's parameters redrawn (gain 1 + N(0, 0.5), bias N(0, 0.5)), so gain and bias show."""
    params = norm.init(jax.random.key(0), _x() if x is None else x).get("params", {})
    rng = np.random.default_rng(seed)
    return {name: jnp.asarray((1.0 if name == "scale" else 0.0) + 0.5 * rng.standard_normal(p.shape), p.dtype)
            for name, p in params.items()}


LAYERNORM = [(True, True), (True, False), (False, True), (False, False)]


@pytest.mark.parametrize("use_scale,use_bias", LAYERNORM, ids=["gain-bias", "gain", "bias", "plain"])
def test_layernorm_parameters_are_named_scale_and_bias_float32_of_width_d(use_scale, use_bias):
    want = {**({"scale": ((D,), jnp.float32)} if use_scale else {}),
            **({"bias": ((D,), jnp.float32)} if use_bias else {})}
    assert _shapes(Norm("layernorm", use_scale, use_bias)) == want
    # float32 parameters whatever the input's dtype.
    params = Norm("layernorm", use_scale, use_bias).init(jax.random.key(0), _x(dtype=jnp.bfloat16))
    assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(params))


@pytest.mark.parametrize("use_bias", [True, False])
@pytest.mark.parametrize("use_scale", [True, False])
def test_rmsnorm_has_a_gain_at_most_and_never_a_bias(use_scale, use_bias):
    assert _shapes(Norm("rmsnorm", use_scale, use_bias)) == ({"scale": ((D,), jnp.float32)} if use_scale else {})


def test_initial_gain_is_one_and_bias_zero():
    for kind in ("layernorm", "rmsnorm"):
        params = Norm(kind).init(jax.random.key(0), _x())["params"]
        np.testing.assert_array_equal(params["scale"], np.ones(D))
        if kind == "layernorm":
            np.testing.assert_array_equal(params["bias"], np.zeros(D))


@pytest.mark.parametrize("use_scale,use_bias", LAYERNORM, ids=["gain-bias", "gain", "bias", "plain"])
def test_layernorm_equals_ops_layer_norm(use_scale, use_bias):
    norm = Norm("layernorm", use_scale, use_bias, eps=1e-5)
    params = _random_params(norm)
    x = jnp.asarray(_x())
    y = norm.apply({"params": params}, x)
    np.testing.assert_allclose(y, ops.layer_norm(x, params.get("scale"), params.get("bias"), 1e-5), **TOL)
    if not (use_scale or use_bias):  # zero mean, unit variance over the last axis
        np.testing.assert_allclose(np.mean(y, -1), 0.0, atol=1e-5)
        np.testing.assert_allclose(np.var(y, -1), 1.0, rtol=1e-4)


@pytest.mark.parametrize("use_scale", [True, False], ids=["gain", "plain"])
def test_rmsnorm_equals_ops_rms_norm(use_scale):
    norm = Norm("rmsnorm", use_scale, eps=1e-6)
    params = _random_params(norm)
    x = jnp.asarray(_x())
    y = norm.apply({"params": params}, x)
    np.testing.assert_allclose(y, ops.rms_norm(x, params.get("scale"), 1e-6), **TOL)
    if not use_scale:  # unit root mean square over the last axis, the mean kept
        np.testing.assert_allclose(np.sqrt(np.mean(np.square(y), -1)), 1.0, rtol=1e-4)
        assert np.abs(np.mean(y, -1)).min() > 0.05


def test_layernorm_and_rmsnorm_differ_by_the_mean_only():
    """Without a bias, layer norm is RMSNorm of the centred input: the same on zero-mean rows,
    different on the others."""
    x = _x()
    centred = jnp.asarray(x - x.mean(-1, keepdims=True))
    layer, rms = Norm("layernorm", use_bias=False), Norm("rmsnorm")
    params = _random_params(rms)  # the same gain for both
    ln = lambda v: layer.apply({"params": params}, v)  # noqa: E731
    rn = lambda v: rms.apply({"params": params}, v)  # noqa: E731
    np.testing.assert_allclose(ln(centred), rn(centred), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ln(jnp.asarray(x)), rn(centred), rtol=1e-5, atol=1e-5)
    assert np.abs(np.asarray(ln(jnp.asarray(x))) - np.asarray(rn(jnp.asarray(x)))).max() > 0.1


@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
def test_output_has_the_input_dtype_and_shape(kind):
    norm = Norm(kind)
    x = jnp.asarray(_x(), jnp.bfloat16)
    params = norm.init(jax.random.key(0), x)["params"]
    y = norm.apply({"params": params}, x)
    assert y.dtype == jnp.bfloat16 and y.shape == x.shape
    np.testing.assert_allclose(np.asarray(y, np.float32), np.asarray(norm.apply({"params": params}, x.astype(
        jnp.float32))), rtol=0, atol=0.05)


def test_defaults_are_layernorm_with_gain_and_bias_and_eps_1e_5():
    norm = Norm()
    assert (norm.kind, norm.use_scale, norm.use_bias, norm.eps) == ("layernorm", True, True, 1e-5)
    x = jnp.asarray(_x() * 1e-3)  # a variance near eps: eps matters
    params = _random_params(norm, x)
    y = norm.apply({"params": params}, x)
    np.testing.assert_allclose(y, ops.layer_norm(x, params["scale"], params["bias"], 1e-5), **TOL)
    assert np.abs(np.asarray(y) - np.asarray(ops.layer_norm(x, params["scale"], params["bias"], 1e-8))).max() > 1e-3
