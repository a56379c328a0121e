"""Tests of the parameter-tree edits (transformer/model/param_tree.py): the two layouts of the layer stack.

Nothing here compiles a model: the trees come from the abstract init (jax.eval_shape) filled with
distinct numbers, so every array says where it came from.
"""

from __future__ import annotations

import collections

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer import ModelConfig
from transformer.model.decoder import Decoder
from transformer.model.kv_cache import per_layer as unstack
from transformer.model.kv_cache import stacked as stack
from transformer.model.param_tree import (
    join_layers,
    layout_differences,
    relayout_layers,
    split_layers,
    stack_layers,
    unrolled,
    unstack_layers,
)

L = 3
CFG = ModelConfig(vocab_size=64, max_seq_len=16, d_model=32, num_layers=L, num_heads=4, tie_embeddings=False,
                  attention="mla", kv_latent_dim=16, q_latent_dim=24, rope_head_dim=4, position="rope")


def params_of(cfg: ModelConfig) -> dict:
    """Decoder(cfg)'s params, every number in the tree distinct (a running count)."""
    shapes = jax.eval_shape(Decoder(cfg).init, jax.random.key(0), jnp.zeros((1, 4), jnp.int32))["params"]
    start = [0]

    def fill(s):
        a = np.arange(start[0], start[0] + s.size, dtype=np.float32).reshape(s.shape)
        start[0] += s.size
        return jnp.asarray(a)

    return jax.tree.map(fill, shapes)


def test_stack_and_unstack_are_inverses():
    layers = [{"a": {"w": np.full((2, 3), i, np.float32)}, "b": np.full(4, 10 * i, np.float32)} for i in range(L)]
    stacked = stack(layers)
    chex.assert_shape(stacked["a"]["w"], (L, 2, 3))
    chex.assert_shape(stacked["b"], (L, 4))
    back = unstack(stacked, L)
    assert len(back) == L
    for got, want in zip(back, layers):
        chex.assert_trees_all_equal(got, jax.tree.map(jnp.asarray, want))


def test_unstack_layers_gives_the_unscanned_models_layout_and_stack_layers_inverts_it():
    scanned = params_of(CFG)
    unscanned = unstack_layers(scanned, L)
    assert layout_differences(CFG.replace(scan_layers=False), unscanned) == []
    for i in range(L):
        chex.assert_trees_all_equal(unscanned[f"layers_{i}"], jax.tree.map(lambda a: a[i], scanned["layers"]))
    chex.assert_trees_all_equal(stack_layers(unscanned, L), scanned)
    # Both read either layout: converting to the layout a tree already has changes nothing.
    chex.assert_trees_all_equal(stack_layers(scanned, L), scanned)
    chex.assert_trees_all_equal(unstack_layers(unscanned, L), unscanned)


@pytest.mark.parametrize("scanned", [True, False], ids=["scanned", "unscanned"])
def test_split_and_join_layers(scanned):
    params = params_of(CFG.replace(scan_layers=scanned))
    rest, layers = split_layers(params, L)
    assert sorted(rest) == ["embed", "final_norm", "head"]
    assert len(layers) == L and all("attn" in layer and "mlp" in layer for layer in layers)
    chex.assert_shape(layers[1]["attn"]["o"]["kernel"], (CFG.d_model, CFG.num_heads, CFG.head_dim))
    chex.assert_trees_all_equal(join_layers(rest, layers, scanned=scanned), params)
    assert ("layers" if scanned else "layers_0") in params, "split_layers must not change its argument"


def test_unrolled():
    params = params_of(CFG)
    same, cfg = unrolled(unstack_layers(params, L), CFG.replace(scan_layers=False))
    assert cfg == CFG.replace(scan_layers=False) and "layers_0" in same
    params_u, cfg_u = unrolled(params, CFG)
    assert cfg_u == CFG.replace(scan_layers=False)
    chex.assert_trees_all_equal(params_u, unstack_layers(params, L))


AdamState = collections.namedtuple("AdamState", "count mu nu")


@pytest.mark.parametrize("saved_scan", [True, False], ids=["scanned-to-unscanned", "unscanned-to-scanned"])
def test_relayout_layers_converts_params_and_moments_matched_by_path(saved_scan):
    """A train-state-like tree (params and AdamW moments in a namedtuple) into the other layout."""
    scanned = params_of(CFG)
    layouts = {True: scanned, False: unstack_layers(scanned, L)}  # the same numbers, both layouts

    def state(params):
        mu = jax.tree.map(lambda a: a + 0.5, params)
        return {"step": jnp.asarray(3), "params": params, "opt": (AdamState(jnp.asarray(1), mu, params),)}

    saved, want = state(layouts[saved_scan]), state(layouts[not saved_scan])
    like = jax.tree.map(jnp.zeros_like, want)  # a fresh state: only its structure counts
    got = relayout_layers(jax.tree.map(np.asarray, saved), like, L)
    assert jax.tree.structure(got) == jax.tree.structure(like)
    chex.assert_trees_all_equal(jax.tree.map(jnp.asarray, got), want)


def test_layout_differences_names_each_wrong_or_missing_array():
    params = params_of(CFG)
    assert layout_differences(CFG, params) == []
    assert layout_differences(CFG, jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), params)) == []
    wrong = {**params, "embed": {"embedding": jnp.zeros((CFG.d_model, CFG.vocab_size))}}
    del wrong["head"]
    assert layout_differences(CFG, wrong) == [
        f"['embed']['embedding']: got ({CFG.d_model}, {CFG.vocab_size}), model ({CFG.vocab_size}, {CFG.d_model})",
        f"['head']['kernel']: got nothing, model ({CFG.vocab_size}, {CFG.d_model})",
    ]
    # The other layout differs everywhere in the layer stack.
    diff = layout_differences(CFG.replace(scan_layers=False), params)
    assert any(d.startswith("['layers']") for d in diff) and any(d.startswith("['layers_0']") for d in diff)
