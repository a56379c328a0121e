"""transformer/model/linear.py: y = W x + b with W stored [out, in]."""

import jax
import jax.numpy as jnp
import numpy as np

import pytest

from transformer.model.linear import FEW_ROWS, Linear, times_transpose


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


def barriers(rows: int) -> int:
    """How many optimization barriers times_transpose puts into its program for x [rows, 16]."""
    x, w = jnp.ones((rows, 16)), jnp.ones((8, 16))
    return str(jax.make_jaxpr(times_transpose)(x, w)).count("optimization_barrier")


@pytest.mark.parametrize("rows", [1, 2, 8, FEW_ROWS, FEW_ROWS + 1, 300])
def test_times_transpose_equals_the_product_and_its_gradient(rows):
    """Weight-major or not, x W^T and its gradients are the plain product's (float32 sums in another order)."""
    x = jax.random.normal(jax.random.key(0), (rows, 16))
    w = jax.random.normal(jax.random.key(1), (8, 16))
    plain = lambda x, w: jnp.einsum("...i,oi->...o", x, w)  # noqa: E731
    np.testing.assert_allclose(times_transpose(x, w), plain(x, w), rtol=1e-5, atol=1e-5)
    loss = lambda f: lambda x, w: (jnp.sin(f(x, w)) ** 2).sum()  # noqa: E731
    for got, want in zip(jax.grad(loss(times_transpose), (0, 1))(x, w), jax.grad(loss(plain), (0, 1))(x, w)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_few_rows_go_weight_major_on_a_cpu_and_others_do_not():
    """A decoding step's few rows (2..FEW_ROWS) take the weight-major form, held by its two barriers;
    one row (a matrix-vector product) and a training batch's many rows take the plain product."""
    assert jax.default_backend() == "cpu"
    assert [barriers(rows) for rows in (1, 2, FEW_ROWS, FEW_ROWS + 1)] == [0, 2, 2, 0]
    batched = jax.make_jaxpr(times_transpose)(jnp.ones((2, 4, 16)), jnp.ones((8, 16)))  # [B, T, D]: 8 rows
    assert str(batched).count("optimization_barrier") == 2
    assert times_transpose(jnp.ones((2, 4, 16)), jnp.ones((8, 16))).shape == (2, 4, 8)
