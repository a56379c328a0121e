"""Edits at named points: the model run with chosen activations changed, under jit and in the sampler.

An edit sets a named point (model/points.py) to scale * value + add: `zero`, `mean`, `patch`, `steer`,
`ablate_heads` ([L, H] at attn.z), selecting by layer (blocks.3.attn.z, blocks.*.attn.z), head and
position. An `Edit` is a pytree with a leading L axis (1: alike in all layers), so a grid of edits
vmaps through one compile; edits of one point compose in order.

    logits, cache = run(params, cfg, tokens, [zero(cfg, "blocks.1.attn.z", head=3)])"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from transformer.model.config import ModelConfig
from transformer.model.decoder import Decoder
from transformer.model.inputs import num_tokens
from transformer.model.kv_cache import Cache, registers_to_run
from transformer.model.ops import MASK_VALUE
from transformer.model.points import CAPTURE_ONLY, EDITS, FEATURES, SOWN, SPLICE, TOP, layer_points, point_axes

Array = jax.Array


@flax.struct.dataclass
class Edit:
    """scale * value + add at the point `name`: "embed", ..., or "blocks.*.NAME" for a layer's point,
    whose scale and add then have a leading axis of L (or 1: alike in every layer) before the
    point's own axes (model/points.py), which they broadcast against."""

    name: str = flax.struct.field(pytree_node=False)
    scale: Array
    add: Array


def zero(cfg: ModelConfig, name: str, *, head: Any = None, position: Any = None, length: int | None = None) -> Edit:
    """Zero ablation: the selected part of point `name` set to 0. head, position: an index or a list
    of them (None: all); a position needs `length`, the input's number of tokens T."""
    select = selection(cfg, name, head, position, length)
    return at_layer(cfg, name, 1.0 - select, jnp.zeros_like(select))


def mean(cfg: ModelConfig, name: str, values: Array, *, head: Any = None, position: Any = None,
         length: int | None = None) -> Edit:
    """Mean ablation: the selected part of point `name` replaced by the mean over batch and tokens of
    `values`, the point captured on other inputs ([B, T, ...], or [L, B, T, ...] for blocks.*.NAME)."""
    axes = point_axes(cfg, name)
    stacked = _layer(name) == "*"
    over = tuple(i + stacked for i, a in enumerate(axes) if a in "bt")
    select = selection(cfg, name, head, position, length)
    average = jnp.mean(jnp.asarray(values, jnp.float32), axis=over, keepdims=True)
    return at_layer(cfg, name, 1.0 - select, average * select, stacked=stacked)


def patch(cfg: ModelConfig, name: str, source: Array, *, head: Any = None, position: Any = None) -> Edit:
    """Activation patching: the selected part of point `name` replaced by `source`, its value captured
    from another input of the same shape ([B, T, ...], or [L, B, T, ...] for blocks.*.NAME)."""
    check_editable(cfg, name)
    stacked, axes = _layer(name) == "*", point_axes(cfg, name)
    source = jnp.asarray(source)
    shape, widths = source.shape[stacked:], {"d": cfg.d_model, "v": cfg.vocab_size, "f": cfg.mlp_dim}
    wrong = len(shape) != len(axes) or any(n != widths.get(a, n) for n, a in zip(shape, axes))
    if wrong or shape[axes.index("t")] == 1:  # one position would be broadcast over every position
        raise ValueError(f"patch of {name!r}: a source of shape {source.shape} is not the point's "
                         f"[{', '.join('L' * stacked + axes.upper())}] (D={cfg.d_model}, V={cfg.vocab_size}, "
                         f"F={cfg.mlp_dim}) over more than one position; capture it on an input as long as the patched one")
    length = shape[axes.index("t")]
    select = selection(cfg, name, head, position, length)
    return at_layer(cfg, name, 1.0 - select, source * select, stacked=stacked)


def steer(cfg: ModelConfig, name: str, vector: Array, *, position: Any = None, length: int | None = None,
          alpha: float = 1.0) -> Edit:
    """Steering: alpha * `vector` (the point's last axis, e.g. [D] for the residual stream) added to
    point `name` at the selected positions (None: every position, also while sampling)."""
    select = selection(cfg, name, None, position, length)
    return at_layer(cfg, name, jnp.ones_like(select), alpha * jnp.asarray(vector, jnp.float32) * select)


def ablate_heads(cfg: ModelConfig, head_mask: Array, sublayer: str = "attn") -> Edit:
    """Head h of layer l scaled by head_mask[l, h] [L, H] at attn.z (1 keeps it, 0 switches it off),
    at every position, in every call (prefill and decoding alike); sublayer='cross': a cross-attention head."""
    head_mask = jnp.asarray(head_mask, jnp.float32)
    if head_mask.shape != (cfg.num_layers, cfg.num_heads):
        raise ValueError(f"head_mask has shape {head_mask.shape}; this model needs [L, H] = "
                         f"{(cfg.num_layers, cfg.num_heads)} (1 keeps a head, 0 switches it off)")
    scale = head_mask[:, None, None, :, None]  # [L, B=1, T=1, H, Kv=1] against z [B, T, H, Kv]
    return Edit(f"blocks.*.{sublayer}.z", scale, jnp.zeros_like(scale))


def switch_off_experts(cfg: ModelConfig, expert_mask: Array) -> Edit:
    """Expert e of layer l switched off where expert_mask[l, e] [L, E] is 0: MASK_VALUE is added to its
    router logit, so its probability is 0 and its tokens go to the next experts in the router's order
    (none is dropped; with renormalize_top_k=False the other probabilities grow too, as in torch)."""
    mask = jnp.asarray(expert_mask, jnp.float32)
    if not cfg.num_experts or mask.shape != (cfg.num_layers, cfg.num_experts):
        raise ValueError(f"expert_mask has shape {mask.shape}; this model needs [L, E] = "
                         f"{(cfg.num_layers, cfg.num_experts)} (1 keeps an expert, 0 switches it off)")
    add = ((1.0 - mask) * MASK_VALUE)[:, None, None, :]  # [L, B=1, T=1, E] against the logits [B, T, E]
    return Edit("blocks.*.mlp.router_logits", jnp.ones_like(add), add)


def selection(cfg: ModelConfig, name: str, head: Any, position: Any, length: int | None) -> Array:
    """1 where the edit applies, 0 elsewhere, broadcasting against point `name` (no L axis): size 1 on
    every axis but the heads' (H, with `head`) and the tokens' (T, with `position`)."""
    check_editable(cfg, name)
    axes = point_axes(cfg, name)
    select = np.ones([1] * len(axes), np.float32)
    if head is not None:
        if "h" not in axes:
            raise ValueError(f"{name!r} has no head axis (its axes are {axes}); select heads at attn.z, "
                             "attn.q / k / v, attn.scores or attn.pattern")
        heads = cfg.num_kv_heads if name.endswith(("attn.k", "attn.v", "cross.k", "cross.v", "k_norm.out")) else cfg.num_heads
        select = select * _one_hot(head, heads, axes.index("h"), len(axes), "head")
    if position is not None:
        if length is None:
            raise ValueError(f"position={position!r} needs length=T, the number of tokens of the input")
        select = select * _one_hot(position, length, axes.index("t"), len(axes), "position")
    return jnp.asarray(select)


def at_layer(cfg: ModelConfig, name: str, scale: Array, add: Array, stacked: bool = False) -> Edit:
    """An Edit of `name` from scale and add shaped as the point (`stacked`: either may be [L, ...]),
    held for every layer: identity (scale 1, add 0) outside the named layer."""
    if name.removesuffix(FEATURES) in TOP:  # a top point, or its SAE features
        return Edit(name, scale, add)
    layer, rest = _layer(name), name.split(".", 2)[2]
    if stacked or layer == "*":  # the L axis in front, where an array has none yet
        rank = len(point_axes(cfg, name))
        scale, add = (a if a.ndim > rank else a[None] for a in (jnp.asarray(scale), jnp.asarray(add)))
        return Edit(f"blocks.*.{rest}", scale, add)
    here = (np.arange(cfg.num_layers) == int(layer)).reshape(-1, *[1] * scale.ndim)  # [L, 1, ...]
    return Edit(f"blocks.*.{rest}", jnp.where(here, scale[None], 1.0), jnp.where(here, add[None], 0.0))


def compose(edits: Sequence[Edit]) -> dict[str, tuple[Array, Array]]:
    """{point name: (scale, add)}, the edits of each point applied in order: a second edit (s2, a2)
    after (s1, a1) is s2 (s1 v + a1) + a2 = (s1 s2) v + (s2 a1 + a2)."""
    out: dict[str, tuple[Array, Array]] = {}
    for edit in edits:
        if edit.name in out:
            scale, add = out[edit.name]
            out[edit.name] = (scale * edit.scale, add * edit.scale + edit.add)
        else:
            out[edit.name] = (edit.scale, edit.add)
    return out


def variables(cfg: ModelConfig, edits: Sequence[Edit], cache: Cache | None = None, num_tokens: int = 0) -> dict:
    """The "edits" collection for `Decoder.apply`: {module path: {sown key: (scale, add)}}, per layer
    (layers_{l}) or stacked [L, ...] (a scanned `layers`). A position-selected edit gets identity rows
    for the registers when they run, so positions count tokens."""
    tree: dict = {}
    r = registers_to_run(cfg, cache)
    for splice in [e for e in edits if not isinstance(e, Edit)]:  # an SAE in place of a point (analysis/sae/)
        _put(tree, _splice_path(cfg, splice.name), splice)
    for name, (scale, add) in compose([e for e in edits if isinstance(e, Edit)]).items():
        if name.removesuffix(FEATURES) in TOP:  # a top point, or its SAE features
            _put(tree, _sown_path(name), (scale, add))
            continue
        rest = name.split(".", 2)[2]
        t = 1 + point_axes(cfg, name).index("t")  # after the L axis
        length = max(scale.shape[t], add.shape[t])
        if num_tokens and length not in (1, num_tokens):  # else a broadcasting error deep inside the model
            raise ValueError(f"the edit of {name!r} covers {length} positions but this call has {num_tokens} tokens; "
                             f"make it for an input of {num_tokens} tokens (or for every position)")
        if r and length > 1:  # per-position: the registers' rows unedited
            scale, add = _pad(scale, t, length, r, 1.0), _pad(add, t, length, r, 0.0)
        shape = jnp.broadcast_shapes(scale.shape[:1], add.shape[:1], (1,))
        if shape[0] not in (1, cfg.num_layers):
            raise ValueError(f"the edit of {name!r} has {shape[0]} layers; the model has {cfg.num_layers}")
        if cfg.scan_layers:  # one [L, ...] array per leaf, sliced by nn.scan
            full = lambda a: jnp.broadcast_to(a, (cfg.num_layers, *a.shape[1:]))  # noqa: E731
            _put(tree, ("layers", *_sown_path(rest)), (full(scale), full(add)))
        else:
            for l in range(cfg.num_layers):
                pick = lambda a: a[l if a.shape[0] > 1 else 0]  # noqa: E731
                _put(tree, (f"layers_{l}", *_sown_path(rest)), (pick(scale), pick(add)))
    return tree


def run(params: Any, cfg: ModelConfig, tokens: Array, edits: Sequence[Edit], positions: Array | None = None,
        cache: Cache | None = None) -> tuple[Array, Cache | None]:
    """The model on `tokens` [B, T] with `edits` applied -> (logits [B, T, V], updated cache or None),
    as `Decoder.apply` returns them. Works under jax.jit (cfg static; edits are pytrees)."""
    return Decoder(cfg).apply({"params": params, EDITS: variables(cfg, edits, cache, num_tokens(cfg, tokens))}, tokens,
                              positions=positions, cache=cache)


def check_editable(cfg: ModelConfig, name: str) -> None:
    """Raises ValueError for a name that is no point of `cfg` or a point that cannot be edited."""
    if name.endswith(FEATURES):  # an SAE's features: editable where the SAE is spliced in
        return check_editable(cfg, name.removesuffix(FEATURES))
    if name in TOP:
        return
    layer = _layer(name)
    rest = None if layer is None else name.split(".", 2)[2]
    if rest not in layer_points(cfg):
        raise ValueError(f"{name!r} is not a point of this model; transformer.analysis.capture.list_points(cfg) "
                         "lists them (blocks.{l}.NAME or blocks.*.NAME for a layer's point)")
    if layer != "*" and int(layer) >= cfg.num_layers:
        raise ValueError(f"{name!r}: the model has layers 0..{cfg.num_layers - 1}")
    if rest in CAPTURE_ONLY or (cfg.attention == "mla" and rest in ("attn.k", "attn.v")):
        raise ValueError(f"{name!r} is computed for a capture alone and cannot be edited; edit attn.z (a head's "
                         "output), attn.pattern (the weights) or, for MLA's keys and values, attn.latent")


def check_for_sampling(edits: Sequence[Edit], cfg: ModelConfig) -> None:
    """Raises ValueError for an edit that selects positions: sampling runs one token at a time."""
    for edit in [e for e in edits if isinstance(e, Edit)]:
        t = (edit.name.removesuffix(FEATURES) not in TOP) + point_axes(cfg, edit.name).index("t")
        if max(edit.scale.shape[t], edit.add.shape[t]) > 1:
            raise ValueError(f"the edit of {edit.name!r} selects positions; the sampler's calls see one new token "
                             "each, so an edit there must apply at every position (position=None)")


def _layer(name: str) -> str | None:
    """The layer part of `blocks.{l}.NAME` ('3' or '*'), or None for another name."""
    parts = name.split(".", 2)
    return parts[1] if len(parts) == 3 and parts[0] == "blocks" else None


def _sown_path(name: str, suffix: str = "") -> tuple[str, ...]:
    """A point's path in the collections: attn.out -> ("attn", "output"), embed -> ("token_embedding",),
    an SAE's resid_post.features -> ("resid_post.features",); `suffix` joins the last key."""
    if name.endswith(FEATURES):
        return _sown_path(name.removesuffix(FEATURES), FEATURES + suffix)
    *modules, key = name.split(".")
    return (*modules, SOWN.get(key, key) + suffix)


def _splice_path(cfg: ModelConfig, name: str) -> tuple[str, ...]:
    """Where an SAE spliced in at point `name` goes in the edits collection (one layer, unrolled stack)."""
    check_editable(cfg, name)
    if name in TOP:
        return _sown_path(name, SPLICE)
    if _layer(name) == "*" or cfg.scan_layers:
        raise ValueError(f"an SAE splices into one layer's point of an unrolled stack, not {name!r}"
                         f"{' with scan_layers=True' if cfg.scan_layers else ''}; name the layer (blocks.1.resid_post) and "
                         "unroll a scanned model first (param_tree.unrolled(params, cfg))")
    return (f"layers_{_layer(name)}", *_sown_path(name.split(".", 2)[2], SPLICE))


def _put(tree: dict, path: tuple[str, ...], value: tuple[Array, Array]) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


def _pad(a: Array, axis: int, length: int, r: int, value: float) -> Array:
    """`a` broadcast to `length` along `axis`, then r rows of `value` in front of them."""
    a = jnp.broadcast_to(a, (*a.shape[:axis], length, *a.shape[axis + 1:]))
    pad = [(0, 0)] * a.ndim
    pad[axis] = (r, 0)
    return jnp.pad(a, pad, constant_values=value)


def _one_hot(index: Any, size: int, axis: int, ndim: int, what: str) -> np.ndarray:
    """1 at `index` (an int or a list of them) along `axis` of an array of `ndim` size-1 axes."""
    picked = np.atleast_1d(np.asarray(index))
    if picked.size == 0 or (picked < -size).any() or (picked >= size).any():
        raise ValueError(f"{what} {index!r} is out of range 0..{size - 1}")
    hot = np.zeros(size, np.float32)
    hot[picked] = 1.0
    shape = [1] * ndim
    shape[axis] = size
    return hot.reshape(shape)
