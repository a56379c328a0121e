"""Capture any named point of the forward pass (transformer/model/points.py lists them), under jit.

    logits, cache, got = capture(params, cfg, tokens, ["blocks.*.attn.pattern", "blocks.0.resid_post"])
    capture(params, cfg, tokens, names, edits=[zero(cfg, "blocks.1.attn.z", head=3)])  # model/edits.py
    got["blocks.*.attn.pattern"]    # [L, B, H, T, S]: every layer's weights, stacked
    got["blocks.0.resid_post"]      # [B, T, D]: layer 0's output
    list_points(cfg)                # every name a model of cfg has
    attention_maps(params, cfg, tokens)  # [L, B, H, T, S]: the weights, as above
    loss(params, cfg, tokens, edits)     # []: mean next-token cross-entropy, e.g. with a head ablated

`*` stacks every layer along a leading L axis. The model's own forward pass with "intermediates"
mutable: points not asked for are dropped, free under jit. With a cache, the points are this call's."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax.traverse_util import flatten_dict

from transformer.model.config import ModelConfig
from transformer.model.decoder import Decoder
from transformer.model.kv_cache import Cache, registers_to_run
from transformer.model.edits import Edit
from transformer.model.edits import run, variables as edit_variables
from transformer.model.inputs import as_tokens, num_tokens
from transformer.training.loss import cross_entropy
from transformer.model.points import COLLECTION, EDITS, FEATURES, LAYER, SOWN, layer_points, point_names

Array = jax.Array

PUBLIC = {sown: public for public, sown in SOWN.items()}  # a sown key -> its point's name
_LAYER_NAME = re.compile(r"^blocks\.(\*|\d+)\.(.+)$")


def list_points(cfg: ModelConfig) -> list[str]:
    """Every point name a model of `cfg` has (`points.point_names`), in forward order."""
    return point_names(cfg)


def capture(params: Any, cfg: ModelConfig, tokens: Array, names: Sequence[str], positions: Array | None = None,
            cache: Cache | None = None, edits: Sequence[Edit] = ()) -> tuple[Array, Cache | None, dict[str, Array]]:
    """The model on `tokens` [B, T] with `edits` (model/edits.py) -> (logits [B, T, V], the updated
    cache or None, {name: array} for each of `names`, as edited). Works under jax.jit (cfg and names
    static). The registers' rows are left out of every point (T counts the tokens); their keys stay in S."""
    tokens = as_tokens(tokens) if cfg.inputs == "tokens" else tokens  # a list or [T]: one row
    wanted = list(names)
    known = point_names(cfg)
    for name in wanted:
        check_name(name, cfg, known)
    variables = {"params": params, EDITS: edit_variables(cfg, edits, cache, num_tokens(cfg, tokens))}
    (logits, new_cache), state = Decoder(cfg).apply(variables, tokens, positions=positions, cache=cache,
                                                    mutable=[COLLECTION])
    r = registers_to_run(cfg, cache)
    found = sown_points(state.get(COLLECTION, {}), cfg, r)
    got = {}
    for name in wanted:
        match = _LAYER_NAME.match(name)
        if match and match[1] == "*":
            got[name] = jnp.stack([found[f"blocks.{l}.{match[2]}"] for l in range(cfg.num_layers)])
        elif name in found:
            got[name] = found[name]
        elif name.endswith(FEATURES):
            raise ValueError(f"the point {name!r} exists only with an SAE spliced in at {name.removesuffix(FEATURES)!r}: "
                             "pass edits=[transformer.analysis.sae.splice.Splice(...)] (analysis/sae/splice.py)")
        else:  # e.g. attn.k of MLA's absorbed decoding
            raise ValueError(f"the point {name!r} is not computed by this call (MLA decoding from a cache uses "
                             "the absorbed form, which has no per-head keys and values)")
    return logits, new_cache, got


def attention_maps(params: Any, cfg: ModelConfig, tokens: Array, edits: Sequence[Edit] = (), scores: bool = False
                   ) -> Array:
    """Every layer's attention weights [L, B, H, T, S_total] (blocks.*.attn.pattern; with `scores`, the
    pre-softmax blocks.*.attn.scores), with `edits` applied."""
    name = "blocks.*.attn.scores" if scores else "blocks.*.attn.pattern"
    return capture(params, cfg, tokens, [name], edits=edits)[2][name]


def loss(params: Any, cfg: ModelConfig, tokens: Array, edits: Sequence[Edit] = ()) -> Array:
    """[] float32: the mean next-token cross-entropy (nats) of `tokens` [B, T] (a list or [T]: one
    row; text: tokenizer.encode(text)) with `edits` (model/edits.py) applied."""
    tokens = as_tokens(tokens)
    logits, _ = run(params, cfg, tokens, list(edits))
    return cross_entropy(logits[:, :-1], tokens[:, 1:])


def check_name(name: str, cfg: ModelConfig, known: list[str]) -> None:
    """Raises ValueError for a name that is no point of `cfg`, listing the points it has."""
    if name.endswith(FEATURES):  # an SAE's features at a point (analysis/sae/splice.py)
        return check_name(name.removesuffix(FEATURES), cfg, known)
    match = _LAYER_NAME.match(name)
    if match:
        layer, rest = match[1], match[2]
        if layer != "*" and int(layer) >= cfg.num_layers:
            raise ValueError(f"{name!r}: the model has layers 0..{cfg.num_layers - 1}; use blocks.*.{rest} for all")
        if rest in layer_points(cfg):
            return
    elif name in known:
        return
    per_layer = sorted({n.split(".", 2)[2] for n in known if n.startswith("blocks.0.")})
    top = [n for n in known if not n.startswith("blocks.")]
    raise ValueError(f"{name!r} is not a point of this model; it has {', '.join(top)} and, per layer "
                     f"(blocks.{{l}}. or blocks.*.), {', '.join(per_layer)} (transformer/model/points.py)")


def sown_points(tree: dict, cfg: ModelConfig, registers: int) -> dict[str, Array]:
    """{point name: array} from the sown "intermediates" tree (`sow` keeps a tuple of the values sown,
    one here): layers_{l} or a stacked `layers` (nn.scan) become blocks.{l}, without the registers'
    rows (the first `registers` along the layer point's query axis t)."""
    out = {}
    for path, (leaf,) in flatten_dict(tree).items():
        *modules, key = path
        key, features = key.removesuffix(FEATURES), FEATURES * key.endswith(FEATURES)  # an SAE's features
        first, name = path[0], ".".join([*modules, PUBLIC.get(key, key) + features])
        if first == "layers" or first.startswith("layers_"):
            rest = name.split(".", 1)[1]  # the name within a layer, e.g. attn.q
            stacked = first == "layers"  # nn.scan: one array with a leading L axis
            axis = LAYER[rest.removesuffix(FEATURES)].index("t")
            for l in range(cfg.num_layers) if stacked else [int(first.removeprefix("layers_"))]:
                value = leaf[l] if stacked else leaf
                if registers:
                    value = jax.lax.slice_in_dim(value, registers, value.shape[axis], axis=axis)
                out[f"blocks.{l}.{rest}"] = value
        else:
            out[name] = leaf
    return out

