"""transformer/model/linear.py: y = W x + b with W stored [out, in]."""

import jax
import jax.numpy as jnp
import numpy as np

from transformer.model.linear import Linear


def test_linear_is_w_x_plus_b_with_w_stored_out_by_in():
    x = jax.random.normal(jax.random.key(0), (2, 3, 5))
    layer = Linear(4)
    params = layer.init(jax.random.key(1), x)["params"]
    params = {"kernel": params["kernel"], "bias": jnp.arange(4.0)}
    assert params["kernel"].shape == (4, 5)
    want = np.einsum("oi,bti->bto", params["kernel"], x) + np.arange(4.0)
    np.testing.assert_allclose(layer.apply({"params": params}, x), want, rtol=1e-6, atol=1e-6)


def test_linear_with_shaped_output_and_two_input_axes():
    """Per-head projections: W_q [H, K, D] maps [.., D] -> [.., H, K]; W_o [D, H, K] reads [.., H, K]."""
    x = jax.random.normal(jax.random.key(0), (2, 3, 8))
    w_q = Linear((2, 4), use_bias=False)
    p_q = w_q.init(jax.random.key(1), x)["params"]
    assert p_q["kernel"].shape == (2, 4, 8)
    q = w_q.apply({"params": p_q}, x)
    np.testing.assert_allclose(q, np.einsum("hkd,btd->bthk", p_q["kernel"], x), rtol=1e-6, atol=1e-6)
    w_o = Linear(8, in_axes=2, use_bias=False)
    p_o = w_o.init(jax.random.key(2), q)["params"]
    assert p_o["kernel"].shape == (8, 2, 4)
    np.testing.assert_allclose(
        w_o.apply({"params": p_o}, q), np.einsum("dhk,bthk->btd", p_o["kernel"], q), rtol=1e-5, atol=1e-5
    )


def test_linear_computes_in_dtype_and_keeps_float32_params():
    x = jnp.ones((1, 5), jnp.float32)
    layer = Linear(3, dtype=jnp.bfloat16)
    params = layer.init(jax.random.key(0), x)["params"]
    assert params["kernel"].dtype == jnp.float32
    assert layer.apply({"params": params}, x).dtype == jnp.bfloat16
