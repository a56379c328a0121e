"""transformer/analysis/tree_view.py: parameters, optimizer state and a KV cache as trees of array lines."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from transformer.model.kv_cache import init_cache, kv_cache_bytes_per_token
from transformer.model.config import ModelConfig
from transformer.model.decoder import count_params
from transformer.training.sharding import make_mesh, state_sharding
from transformer.training.steps import init_params
from transformer.analysis.tree_view import ArrayLeaf, array_leaf, show_tree, tree_summary

CFG = ModelConfig(vocab_size=64, max_seq_len=16, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2)


@pytest.fixture(scope="module")
def params():
    return init_params(CFG, jax.random.key(0))


def test_every_array_becomes_its_shape_dtype_size_and_placement(params):
    summary = tree_summary(params)
    assert jax.tree.structure(summary) == jax.tree.structure(params)
    for leaf, x in zip(jax.tree.leaves(summary), jax.tree.leaves(params)):
        assert leaf == ArrayLeaf(x.shape, "float32", x.size, 4 * x.size, "cpu:0")
    q = summary["layers"]["attn"]["q"]["kernel"]  # [L, H, K, D]
    assert str(q) == "float32[2, 4, 8, 32]  2,048 = 8.0 KiB  cpu:0"
    view = show_tree(params, "parameters")
    n = count_params(params)
    assert view.totals() == (len(jax.tree.leaves(params)), n, 4 * n)
    assert view.header() == f"parameters: {len(jax.tree.leaves(params))} arrays, {n:,} numbers, {4 * n / 1024:.1f} KiB"


def test_optimizer_state_cache_numpy_and_sharded_arrays(params):
    adam = show_tree(optax.adamw(1e-3).init(params), "AdamW state")
    assert adam.totals()[1] == 2 * count_params(params) + 1  # two moments and the step count
    cache = show_tree(init_cache(CFG, batch_size=3, max_len=16, dtype="bfloat16"), "KV cache")
    assert cache.totals()[2] == 3 * 16 * kv_cache_bytes_per_token(CFG.replace(dtype="bfloat16"))
    assert str(cache.summary[0].k).startswith("bfloat16[3, 2, 16, 8]")  # [B, G, S, K]
    assert tree_summary({"a": np.zeros((2, 3), np.int8), "n": 7})["a"].sharding == "numpy (host)"
    assert tree_summary({"n": 7, "none": None}) == {"n": 7, "none": None}
    abstract = tree_summary(jax.ShapeDtypeStruct((4,), jnp.float16))
    assert abstract == ArrayLeaf((4,), "float16", 4, 8, "abstract (no data)")

    mesh = make_mesh(data=1, fsdp=1)
    placed = jax.device_put(params, state_sharding(params, mesh))  # as training places the state
    # E [V, D] as the default rules place it (vocab over tensor, embed over fsdp; here both of size 1)
    embedding = tree_summary(placed)["embed"]["embedding"]
    assert embedding.sharding == "P('tensor', 'fsdp') over mesh (data=1, fsdp=1, tensor=1)"
    split = jax.device_put(params["embed"]["embedding"], NamedSharding(mesh, P(None, "fsdp")))
    assert array_leaf(split).sharding == "P(None, 'fsdp') over mesh (data=1, fsdp=1, tensor=1)"


def test_the_view_renders_with_treescope(params):
    pytest.importorskip("treescope")
    view = show_tree(params, "parameters")
    page = view._repr_html_()
    assert page.startswith("<div><b>parameters: ") and "treescope" in page
    text = str(view)
    assert "'q': {" in text and "float32[2, 4, 8, 32]  2,048 = 8.0 KiB  cpu:0" in text
