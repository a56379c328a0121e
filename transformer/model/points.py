"""Named points of the forward pass: the activations that can be captured and edited, with shapes.

The model marks each with `point` (edits: model/edits.py; capture: analysis/capture.py); a forward pass
that captures and edits nothing is the same program as one with no points at all. Names follow
TransformerLens's hook names, without the `hook_`:

    embed                       [B, T, D]   token embeddings E[tokens]
    pos_embed                   [B, T, D]   learned or sinusoidal position embeddings (RoPE: none)
    blocks.{l}.resid_pre        [B, T, D]   the residual stream entering layer l
    blocks.{l}.attn_norm.out    [B, T, D]   the attention's norm (post-norm: of x + attention)
    blocks.{l}.attn.q_norm.out  [B, T, H, K]     qk_norm: the queries' RMSNorm, before RoPE (MLA: the query latent's)
    blocks.{l}.attn.k_norm.out  [B, T, G, K]     qk_norm: the keys' RMSNorm, before RoPE
    blocks.{l}.attn.kv_norm.out [B, T, C]        MLA: the latent c = RMSNorm(W_DKV x)
    blocks.{l}.attn.latent      [B, T, C + Kr]   MLA: the cached latent [c, k_rope]
    blocks.{l}.attn.q           [B, T, H, K]     queries, after qk_norm and RoPE (MLA: [B, T, H, K + Kr])
    blocks.{l}.attn.k           [B, T, G, K]     this call's keys, likewise (MLA, naive form: [B, T, H, K + Kr])
    blocks.{l}.attn.v           [B, T, G, K]     this call's values (MLA, naive form: [B, T, H, Kv])
    blocks.{l}.attn.scores      [B, H, T, S]     pre-softmax logits: scaled scores plus the mask (float32)
    blocks.{l}.attn.pattern     [B, H, T, S]     attention weights (float32; rows sum to 1 with the sink)
    blocks.{l}.attn.sink_share  [B, H, T]        attention_sink: each row's weight on the sink
    blocks.{l}.attn.register_share [B, H, T]     num_registers > 0: each row's weight on the registers
    blocks.{l}.attn.z           [B, T, H, Kv]    each head's output, the input of W_o (after head_mask)
    blocks.{l}.attn.head_out    [B, T, H, D]     each head's contribution W_o[:, h] z_h (no bias)
    blocks.{l}.attn.out         [B, T, D]        the attention's output: the heads' sum plus W_o's bias
    blocks.{l}.attn_out_norm.out [B, T, D]  sublayer_out_norm: the attention's output normalised
    blocks.{l}.resid_mid        [B, T, D]   between attention and MLP (and cross-attention)
    blocks.{l}.cross_norm.out, cross.*      cross_attention: as attn's, queries from the tokens, keys and values
                                            from the encoder's S tokens (cross.k, cross.v [B, S, G, K]; cross.pattern
                                            [B, H, T, S]); a decoding step reads cached keys (no cross.k, cross.v)
    blocks.{l}.mlp_norm.out     [B, T, D]   the MLP's norm (post-norm: of x + MLP)
    blocks.{l}.mlp.hidden       [B, T, F]   the MLP's hidden activation (swiglu: the gated product)
    blocks.{l}.mlp.router_logits  [B, T, E]  num_experts = E > 0: the router's logits (float32), no mlp.hidden
    blocks.{l}.mlp.expert_weights [B, T, E]  each expert's weight, 0 for those not chosen (model/moe.py)
    blocks.{l}.mlp.out          [B, T, D]   the MLP's output
    blocks.{l}.mlp_out_norm.out [B, T, D]   sublayer_out_norm: the MLP's output normalised
    blocks.{l}.resid_post       [B, T, D]   the residual stream leaving layer l
    final_norm.out              [B, T, D]   the final norm (pre-norm models)
    logits                      [B, T, V]   float32, after the soft-cap

S is the keys a query sees: R register slots first, the cache's slots, this call's tokens, and one
more column last with a sink. Capturing scores or patterns runs the reference attention. Registers'
own rows are dropped from every point: T counts the tokens. MLA's absorbed form (decoding from a
cache) computes no per-head k and v. Every point can be edited but CAPTURE_ONLY's (edit z or the
pattern they come from) and MLA's per-head k and v (edit the latent).
"""

from __future__ import annotations

import flax.linen as nn
import jax

from transformer.model.config import ModelConfig
from transformer.model.positions import scheme

COLLECTION = "intermediates"  # Flax's own name for sown values (`Module.sow`)
EDITS = "edits"  # the variable collection of edits, {module path: {point: (scale, add)}} (model/edits.py)

# Each layer's point and its axes (b batch, t this call's tokens, h heads, s keys, d / f / c / k
# widths): the registers' rows are dropped along t, and an edit selects heads along h, positions along t.
LAYER = {
    "resid_pre": "btd", "attn_norm.out": "btd", "attn.q_norm.out": "bthk", "attn.k_norm.out": "bthk",
    "attn.kv_norm.out": "btc", "attn.latent": "btc", "attn.q": "bthk", "attn.k": "bthk", "attn.v": "bthk",
    "attn.scores": "bhts", "attn.pattern": "bhts", "attn.sink_share": "bht", "attn.register_share": "bht",
    "attn.z": "bthk", "attn.head_out": "bthd", "attn.out": "btd", "attn_out_norm.out": "btd", "resid_mid": "btd",
    # cross_attention: as attn's (cross.k, cross.v: their t is the encoder's S tokens)
    **{f"cross.{name}": axes for name, axes in (("q", "bthk"), ("k", "bthk"), ("v", "bthk"), ("scores", "bhts"),
                                                 ("pattern", "bhts"), ("z", "bthk"), ("head_out", "bthd"), ("out", "btd"))},
    "cross_norm.out": "btd", "cross_out_norm.out": "btd",
    "mlp_norm.out": "btd", "mlp.hidden": "btf", "mlp.router_logits": "bte", "mlp.expert_weights": "bte", "mlp.out": "btd",
    "mlp_out_norm.out": "btd", "resid_post": "btd",
}
TOP = {"embed": "btd", "pos_embed": "btd", "final_norm.out": "btd", "logits": "btv"}
# The key a point is sown under, where its public name (the last part of it) differs; a norm's output,
# sown as "output", is the point NAME.out. capture.PUBLIC is its inverse.
SOWN = {"embed": "token_embedding", "pos_embed": "position_embedding", "q": "queries", "k": "keys",
        "v": "values", "out": "output"}
# Points computed from others for the capture alone: edit the point they come from (z, the pattern).
CAPTURE_ONLY = ("attn.sink_share", "attn.register_share", "attn.head_out", "cross.head_out")
# A sparse autoencoder spliced in at a point P (the edits collection holds it under P's key + SPLICE)
# makes the point P.features [B, T, N] (axes "..n"), captured and edited like any other.
SPLICE, FEATURES = ".splice", ".features"


def point(module: nn.Module, name: str, value: jax.Array) -> jax.Array:
    """`value` marked as the point `name` of `module`, edited (scale * value + add) if the "edits"
    collection holds an edit for it; without an edit, `value` itself."""
    if module.has_variable(EDITS, name):
        scale, add = module.get_variable(EDITS, name)
        value = value * scale.astype(value.dtype) + add.astype(value.dtype)
    module.sow(COLLECTION, name, value)  # a no-op unless the collection is mutable (a capture)
    if module.has_variable(EDITS, name + SPLICE):  # an SAE in place of the value (analysis/sae/splice.py)
        mark = lambda features: point(module, name + FEATURES, features)  # noqa: E731
        value = module.get_variable(EDITS, name + SPLICE).spliced(value, mark)
    return value


def capturing(module: nn.Module) -> bool:
    """Whether this forward pass captures points (then the attention computes its weights)."""
    return module.is_mutable_collection(COLLECTION)


def touched(module: nn.Module, *names: str) -> bool:
    """Whether this forward pass captures points or edits one of `names` of `module`: then the
    attention computes what the fused kernels do not give (its weights, MLA's per-head queries)."""
    return capturing(module) or any(module.has_variable(EDITS, name) for name in names)


def layer_points(cfg: ModelConfig) -> list[str]:
    """The per-layer point names (without `blocks.{l}.`) that a model of `cfg` has, in LAYER's order."""
    mla = cfg.attention == "mla"
    present = {
        "attn.q_norm.out": cfg.q_latent_dim if mla else cfg.qk_norm,
        "attn.k_norm.out": cfg.qk_norm and not mla,
        "attn.kv_norm.out": mla, "attn.latent": mla,
        "attn.sink_share": cfg.attention_sink, "attn.register_share": cfg.num_registers,
        "mlp_norm.out": cfg.mlp_dim, "mlp.hidden": cfg.mlp_dim and not cfg.num_experts, "mlp.out": cfg.mlp_dim,
        "mlp.router_logits": cfg.num_experts, "mlp.expert_weights": cfg.num_experts,
        "attn_out_norm.out": cfg.sublayer_out_norm, "mlp_out_norm.out": cfg.sublayer_out_norm and cfg.mlp_dim,
        **{name: cfg.cross_attention for name in LAYER if name.startswith("cross")},
        "cross_out_norm.out": cfg.cross_attention and cfg.sublayer_out_norm,
    }
    return [name for name in LAYER if present.get(name, True)]


def point_axes(cfg: ModelConfig, name: str) -> str:
    """The axes of point `name` (`embed`, `blocks.3.attn.z`, `blocks.*.attn.z`) in a model of `cfg`,
    as LAYER's letters: "bthk" for z. MLA's query latent norm is "btc" (no heads)."""
    if name.endswith(FEATURES):  # an SAE's features at a point: its axes with N in place of the width
        return point_axes(cfg, name.removesuffix(FEATURES))[:-1] + "n"
    if name in TOP:
        return TOP[name]
    rest = name.split(".", 2)[2]
    return "btc" if rest == "attn.q_norm.out" and cfg.attention == "mla" else LAYER[rest]


def point_names(cfg: ModelConfig) -> list[str]:
    """Every point a model of `cfg` has, in forward order: `embed`, ..., `blocks.{l}.resid_post`, ..., `logits`."""
    top = ["embed"] + (["pos_embed"] if scheme(cfg).embed is not None else [])
    layers = [f"blocks.{l}.{name}" for l in range(cfg.num_layers) for name in layer_points(cfg)]
    return top + layers + (["final_norm.out"] if cfg.prenorm else []) + ["logits"]
