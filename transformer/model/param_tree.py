"""The two layouts of a Decoder's layer stack, and conversions between them (chosen by cfg.scan_layers):

    scanned     {"embed": ..., "layers": {"attn": {"q": {"kernel": [L, H, K, D]}, ...}, ...}}
    unscanned   {"embed": ..., "layers_0": {"attn": {"q": {"kernel": [H, K, D]}, ...}, ...}, ..., "layers_{L-1}": ...}

`relayout_layers` converts any tree of parameter-shaped subtrees (a train state with its AdamW
moments); `layout_differences` checks a tree against Decoder(cfg).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from transformer.model.config import ModelConfig
from transformer.model.decoder import Decoder, example_input
# L trees alike <-> one tree of [L, ...] arrays, as for the caches of a scanned stack
from transformer.model.kv_cache import per_layer, stacked

Tree = Any  # nested dicts (or other pytrees) of arrays


def path_names(path) -> tuple[str, ...]:
    """A jax key path -> the names along it: ('layers', 'attn', 'q', 'kernel')."""
    return tuple(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)


def param_shapes(cfg: ModelConfig) -> Tree:
    """The parameters Decoder(cfg) builds, as jax.ShapeDtypeStructs: nothing is computed."""
    return jax.eval_shape(lambda: Decoder(cfg).init(jax.random.key(0), example_input(cfg)))["params"]


def split_layers(params: Mapping, num_layers: int) -> tuple[dict, list[Tree]]:
    """Params in either layout -> (the other parameters: embed, pos_embed, final_norm, head;
    [layer 0, ..., layer L-1], each one layer's tree: no L axis)."""
    rest = dict(params)
    if "layers" in rest:
        layers = list(per_layer(rest.pop("layers"), num_layers))
    else:
        layers = [rest.pop(f"layers_{i}") for i in range(num_layers)]
    return rest, layers


def join_layers(rest: Mapping, layers: Sequence[Tree], scanned: bool) -> dict:
    """The inverse of `split_layers`: (the other parameters, L layers) -> params, scanned (one
    `layers`, arrays [L, ...]) or unscanned (layers_0 ... layers_{L-1})."""
    if scanned:
        return {**rest, "layers": stacked(layers)}
    return {**rest, **{f"layers_{i}": layer for i, layer in enumerate(layers)}}


def stack_layers(params: Mapping, num_layers: int) -> dict:
    """Unscanned params (layers_0 ... layers_{L-1}) -> scanned params (one `layers` with an L axis)."""
    return join_layers(*split_layers(params, num_layers), scanned=True)


def unstack_layers(params: Mapping, num_layers: int) -> dict:
    """Scanned params (`layers` with a leading L axis) -> unscanned (layers_0 ... layers_{L-1})."""
    return join_layers(*split_layers(params, num_layers), scanned=False)


def unrolled(params: Mapping, cfg: ModelConfig) -> tuple[Mapping, ModelConfig]:
    """(params with layers_i, cfg with scan_layers off): for decoding, where a scanned stack's dynamic
    slices make XLA:CPU copy every weight every step; unrolled layers read static slices."""
    if not cfg.scan_layers:
        return params, cfg
    return unstack_layers(params, cfg.num_layers), cfg.replace(scan_layers=False)


def relayout_layers(saved: Tree, like: Tree, num_layers: int) -> Tree:
    """`saved`'s arrays arranged as `like` (any trees of parameter-shaped subtrees, as dicts or their
    classes), leaves matched by the names along their paths: a leaf under `layers` [L, ...] stacks
    layers_0 ... layers_{L-1}'s, a leaf under `layers_i` takes slice [i] of `layers`'."""
    source = {path_names(p): x for p, x in jax.tree_util.tree_leaves_with_path(saved)}

    def take(path, _) -> Any:
        path = path_names(path)
        if path in source:
            return source[path]
        if "layers" in path:  # scanned here, unscanned in `saved`: stack layers_0 ... layers_{L-1}
            at = path.index("layers")
            return jnp.stack([source[path[:at] + (f"layers_{i}",) + path[at + 1:]] for i in range(num_layers)])
        at = next(i for i, n in enumerate(path) if re.fullmatch(r"layers_\d+", n))
        return source[path[:at] + ("layers",) + path[at + 1:]][int(path[at][len("layers_"):])]

    return jax.tree_util.tree_map_with_path(take, like)


def layout_differences(cfg: ModelConfig, params: Tree) -> list[str]:
    """'path: got (shape), model (shape)' where `params` (arrays, or anything with a .shape) differs
    from the tree Decoder(cfg) builds; empty when they match. Nothing is computed."""
    def shapes(tree) -> dict[str, tuple]:
        return {jax.tree_util.keystr(p): tuple(x.shape) for p, x in jax.tree_util.tree_leaves_with_path(tree)}

    got, want = shapes(params), shapes(param_shapes(cfg))
    return [f"{k}: got {got.get(k, 'nothing')}, model {want.get(k, 'nothing')}"
            for k in sorted(got.keys() | want.keys()) if got.get(k) != want.get(k)]
