"""The decoder: token embedding, positions, a stack of L blocks, a final norm, vocabulary logits.

    x = embed(tokens) [+ positions]
    for each of L blocks:                       pre-norm (default)       post-norm
        x = x + attention(norm(x))    or        x = norm(x + attention(x))
        x = x + mlp(norm(x))                    x = norm(x + mlp(x))
    logits = head(norm(x))                      (the final norm only with pre-norm)
    [logits = c tanh(logits / c)]               (logit_softcap = c > 0)
    sublayer_out_norm (Gemma): x = x + norm(attention(norm(x))), x = x + norm(mlp(norm(x)))

mlp_dim=0 leaves out each block's MLP line: attention-only blocks. num_registers=R > 0 puts R learned
rows before the tokens' x (at positions -R..-1), dropped before the final norm: they give no logits.
The input kind (model/inputs.py) embeds token ids or a table's rows and gives their logits.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer.model import kv_cache
from transformer.model.attention import Attention, LatentAttention, layer_rope_theta
from transformer.model.kv_cache import Cache
from transformer.model.config import ModelConfig
from transformer.model.inputs import INPUTS
from transformer.model.linear import dense
from transformer.model.moe import ROUTER_STATS, MoE
from transformer.model.norm import config_norm
from transformer.model.points import COLLECTION, EDITS, point

Array = jax.Array
# A global layer's window in a scanned stack of local and global layers: wider than any distance.
NO_WINDOW = kv_cache.PAD_POSITION


def gelu_exact(x: Array) -> Array:
    """GELU x * Phi(x) = 0.5 x (1 + erf(x / sqrt(2))): nn.gelu(x, approximate=False) uses erfc, which
    XLA:CPU expands into two branches with an exp, erf into one faster polynomial (docs/performance.md)."""
    return 0.5 * x * (1.0 + jax.lax.erf(x * 0.7071067811865476))


ACTIVATIONS = {
    "gelu": gelu_exact,
    "gelu_tanh": lambda x: nn.gelu(x, approximate=True),
    "relu": nn.relu,
    "relu2": lambda x: jnp.square(nn.relu(x)),  # Primer (So et al. 2021), modded-nanogpt's MLP
    "swiglu": nn.silu,  # applied to the gate of a gated MLP
    "geglu": lambda x: nn.gelu(x, approximate=True),  # likewise, tanh GELU (Gemma)
}
GATED = ("swiglu", "geglu")


class MLP(nn.Module):
    """Position-wise feed-forward network [B, T, D] -> [B, T, F] -> [B, T, D]: W_out act(W_in x), or
    gated with activation='swiglu' / 'geglu': W_down (act(W_gate x) * W_up x), act silu / tanh GELU."""

    cfg: ModelConfig

    @nn.compact
    def __call__(self, x: Array) -> Array:
        cfg = self.cfg
        # No jax.checkpoint around the activation: without biases it made XLA:CPU compute the gradient in a
        # strided layout (docs/performance.md); cfg.remat is the memory knob.
        act = ACTIVATIONS[cfg.activation]
        if cfg.activation in GATED:
            h = act(dense(cfg, cfg.mlp_dim, "gate")(x)) * dense(cfg, cfg.mlp_dim, "up")(x)
        else:
            h = act(dense(cfg, cfg.mlp_dim, "fc_in")(x))
        h = nn.with_logical_constraint(h, ("batch", "length", "mlp"))  # tensor parallel: split by F
        h = point(self, "hidden", h)  # mlp.hidden [B, T, F]
        return point(self, "output", dense(cfg, cfg.d_model, "fc_out", output=True)(h))  # mlp.out [B, T, D]


class Block(nn.Module):
    """One decoder layer: attention and MLP, each with a residual add and a norm (mlp_dim=0: no MLP).
    x [B, T, D] -> x [B, T, D] and this layer's new cache entries, as (carry, outputs) for `nn.scan`.
    window: W or None; in a scanned stack of local and global layers the traced `layer_window`
    (NO_WINDOW for a global layer). order: the input's own order of keys [B, 1, T, T], or None.
    memory: cross_attention's encoder tokens [B, S, D_e] (None: those the cache holds), read by the
    `cross` sublayer between attention and MLP."""

    cfg: ModelConfig
    deterministic: bool = True
    window: int | None = None

    @nn.compact
    def __call__(self, x: Array, positions: Array, cached: Cache | None, layer_window: Array | None = None,
                 order: Array | None = None, memory: Array | None = None) -> tuple[Array, Cache | None]:
        cfg = self.cfg
        window = self.window if layer_window is None else layer_window
        drop = nn.Dropout(cfg.dropout, deterministic=self.deterministic)
        attention = (LatentAttention if cfg.attention == "mla" else Attention)(cfg, name="attn")
        mlp = (MoE if cfg.num_experts else MLP)(cfg, name="mlp")  # never called with mlp_dim=0: no parameters then
        x = point(self, "resid_pre", x)  # the named points: model/points.py
        cross = Attention(cfg, cross=True, name="cross") if cfg.cross_attention else None
        out_norm = lambda name, y: config_norm(cfg, name)(y) if cfg.sublayer_out_norm else y  # noqa: E731
        if cfg.prenorm:  # with sublayer_out_norm each sublayer's output is normalised too (Gemma)
            a, new = attention(config_norm(cfg, "attn_norm")(x), positions, cached, window, order)
            x = point(self, "resid_mid", x + drop(out_norm("attn_out_norm", a)))
            if cross:  # x + cross(norm(x), e)
                c, encoded = cross(config_norm(cfg, "cross_norm")(x), positions, cached, memory=memory)
                x = x + drop(out_norm("cross_out_norm", c))
            if cfg.mlp_dim:
                x = x + drop(out_norm("mlp_out_norm", mlp(config_norm(cfg, "mlp_norm")(x))))
        else:
            a, new = attention(x, positions, cached, window, order)
            x = point(self, "resid_mid", config_norm(cfg, "attn_norm")(x + drop(a)))
            if cross:  # norm(x + cross(x, e))
                c, encoded = cross(x, positions, cached, memory=memory)
                x = config_norm(cfg, "cross_norm")(x + drop(c))
            if cfg.mlp_dim:
                x = config_norm(cfg, "mlp_norm")(x + drop(mlp(x)))
        x = nn.with_logical_constraint(x, ("batch", "length", "embed"))  # the residual stream: whole D
        x = point(self, "resid_post", x)
        if cross and encoded is not None:  # the encoder's keys and values [B, G, S, K], cached once
            new = new.replace(cross_k=encoded[0], cross_v=encoded[1])
        return x, new if cached is not None else None


class Decoder(nn.Module):
    """A decoder-only transformer language model.

    tokens [B, T], positions [B, T] (default 0..T-1) -> (logits [B, T, V] float32, the updated cache or None).

    With a cache, this call's keys and values go to slots `positions` and each token sees the cached
    slots before its row's first position plus this call's tokens up to itself: prefill and decoding
    are one code path, and rows may sit at different positions. Padding at kv_cache.PAD_POSITION is
    seen by no token and written nowhere. Out-of-range ids or positions raise a ValueError when known;
    under jit a row's logits are NaN from its first bad token on (model/inputs.py)."""

    cfg: ModelConfig

    @nn.compact
    def __call__(self, tokens: Array, positions: Array | None = None, cache: Cache | None = None,
                 deterministic: bool = True, hidden: bool = False) -> tuple[Array, Cache | None]:
        """hidden=True: the final-normed x [B, T, D] in place of the logits (an encoder's output tokens)."""
        cfg = self.cfg
        cfg.check_resolved()  # dtype / attention_impl 'auto' are chosen before any model is built
        kind = INPUTS[cfg.inputs]  # token ids -> vocabulary logits, or a table's rows -> class logits
        x, positions, order = kind.embed(self, cfg, tokens, positions, cache, deterministic)  # [B, T, D], [B, T]
        x = nn.with_logical_constraint(x, ("batch", "length", "embed"))  # logical axes (sharding.py)
        r = kv_cache.registers_to_run(cfg, cache)  # R without a cache or filling an empty one, else 0
        x_all, positions_all = self._prepend_registers(x, positions) if r else (x, positions)  # [B, R + T, ...]
        image = kind.encoder_input(cfg, tokens, cache) if cfg.cross_attention else None  # None: its keys are cached
        memory = None if image is None else encode(self, cfg.encoder_config(), image, deterministic)  # e [B, S, D_e]
        x, new = self._layers(x_all, positions_all, cache, deterministic, order, memory)
        x = x[:, r:]  # [B, T, D]: the registers give no logits
        if cfg.prenorm:
            x = config_norm(cfg, "final_norm")(x)  # [B, T, D]
        if hidden:
            return x, None
        logits = kind.logits(self, cfg, x, tokens, positions, cache)  # [B, T, V] float32
        if cache is not None:
            thetas = tuple(layer_rope_theta(cfg, w) for w in cfg.layer_windows())  # a rolling ring's kept slots turn
            cache = kv_cache.write(cache, new, positions_all, after=x, thetas=thetas)  # x: a NaN logit row would poison every row
            cache = tuple(c.replace(registers_written=c.registers_written or bool(r)) for c in cache)
        return logits, cache

    @nn.nowrap  # a helper of __call__, not a call of its own: no name scope in the profile
    def _prepend_registers(self, x: Array, positions: Array) -> tuple[Array, Array]:
        """x [B, T, D], positions [B, T] -> [B, R + T, D], [B, R + T]: the R learned registers
        first, at positions -R..-1 (no position embedding; RoPE rotates them by those positions)."""
        cfg = self.cfg
        registers = self.param("registers", nn.initializers.normal(0.02), (cfg.num_registers, cfg.d_model))
        b = x.shape[0]
        x = jnp.concatenate([jnp.broadcast_to(registers.astype(x.dtype), (b, *registers.shape)), x], axis=1)
        first = jnp.broadcast_to(jnp.arange(-cfg.num_registers, 0, dtype=positions.dtype), (b, cfg.num_registers))
        return x, jnp.concatenate([first, positions], axis=1)

    @nn.nowrap  # a helper of __call__, not a call of its own: no name scope in the profile
    def _layers(self, x: Array, positions: Array, cache: Cache | None, deterministic: bool,
                order: Array | None = None, memory: Array | None = None) -> tuple[Array, Cache | None]:
        """x [B, T, D] through the L blocks -> (x [B, T, D], the L layers' new cache entries or None).

        scan_layers: one `nn.scan` over a block whose params, points and edits have a leading L axis
        (`layers`), else a Python loop over layers_0 ... layers_{L-1}. Over local and global layers the
        scan takes the windows [L] as an input, so one layer still compiles."""
        cfg = self.cfg
        block = nn.remat(Block) if cfg.remat else Block
        windows = cfg.layer_windows()
        if cfg.scan_layers:
            mixed = len(set(windows)) > 1  # local and global layers
            if mixed and cache is not None:
                raise ValueError("a scanned stack of local and global layers cannot read a cache (ring buffers and "
                                 "full buffers do not stack): unroll it first, params, cfg = "
                                 "param_tree.unrolled(params, cfg)")
            layer_windows = jnp.array([NO_WINDOW if w is None else w for w in windows], jnp.int32) if mixed else None
            layers = nn.scan(
                block,
                variable_axes={"params": 0, COLLECTION: 0, EDITS: 0, ROUTER_STATS: 0},  # points, edits, loads too
                split_rngs={"params": True, "dropout": True},
                in_axes=(nn.broadcast, 0, 0, nn.broadcast, nn.broadcast),
                length=cfg.num_layers,
            )(cfg, deterministic, None if mixed else windows[0], name="layers")
            # The scanned layout's one boundary: the L layers' caches in as one of [L, ...] arrays, and out.
            x, new = layers(x, positions, None if cache is None else kv_cache.stacked(cache), layer_windows, order,
                            memory)
            return x, None if cache is None else kv_cache.per_layer(new, cfg.num_layers)
        news = []  # unscanned: a Python loop, each layer its own params and cache buffers
        for i in range(cfg.num_layers):
            x, new_i = block(cfg, deterministic, windows[i], name=f"layers_{i}")(
                x, positions, None if cache is None else cache[i], None, order, memory)
            news.append(new_i)
        return x, None if cache is None else tuple(news)


def example_input(cfg: ModelConfig, length: int = 1) -> Array:
    """Zeros a model of `cfg` reads, to build its parameters: tokens [1, length] or table rows."""
    return INPUTS[cfg.inputs].example(cfg, length)


def encode(module: nn.Module, cfg: ModelConfig, data: Array, deterministic: bool = True, name: str = "encoder"
           ) -> Array:
    """An encoder's output tokens: a Decoder of `cfg` made inside `module` (in a compact method) as its
    submodule `name` reads `data` (images [B, H, W, C] for a ViT) -> the final-normed h [B, T, D], the
    registers' rows dropped. Its parameters are module's params[name]: a trained model's, without its head."""
    return Decoder(cfg, name=name)(data, deterministic=deterministic, hidden=True)[0]


def count_params(params) -> int:
    return sum(x.size for x in jax.tree.leaves(params))
