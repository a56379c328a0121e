"""The decoder: token embedding, positions, a stack of L blocks, a final norm, vocabulary logits.

    x = embed(tokens) [+ positions]
    for each of L blocks:                       pre-norm (default)       post-norm
        x = x + attention(norm(x))    or        x = norm(x + attention(x))
        x = x + mlp(norm(x))                    x = norm(x + mlp(x))
    logits = head(norm(x))                      (the final norm only with pre-norm)
    [logits = c tanh(logits / c)]               (logit_softcap = c > 0)

mlp_dim=0 leaves out each block's MLP line (and its norm): attention-only blocks.
num_registers=R > 0 puts R learned register rows before the tokens' x (at positions -R..-1) and
drops them before the final norm: they give no logits.

`Decoder.__call__` is that forward pass; its helpers below it hold the mechanics: `_embed`,
`_layers` (an nn.scan or a Python loop), `_logits`, and the out-of-range guard.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from transformer.model import kv_cache
from transformer.model import ops
from transformer.model import param_tree
from transformer.model.attention import Attention, LatentAttention
from transformer.model.kv_cache import Cache
from transformer.model.config import ModelConfig
from transformer.model.linear import Linear, dense_init
from transformer.model.norm import config_norm
from transformer.model.points import COLLECTION, EDITS, point
from transformer.model.positions import scheme
from transformer.model import table

Array = jax.Array
# A global layer's window in a scanned stack of local and global layers: wider than any distance.
NO_WINDOW = kv_cache.PAD_POSITION


def gelu_exact(x: Array) -> Array:
    """GELU x * Phi(x), as 0.5 x (1 + erf(x / sqrt(2))) (PyTorch's formula).

    The same function as nn.gelu(x, approximate=False), which uses erfc; XLA:CPU expands erfc into
    two branches with an exp, erf into one rational polynomial, which is faster (docs/performance.md).
    """
    return 0.5 * x * (1.0 + jax.lax.erf(x * 0.7071067811865476))


def relu_squared(x: Array) -> Array:
    """relu(x)^2 (Primer, So et al. 2021; modded-nanogpt's MLP)."""
    return jnp.square(nn.relu(x))


ACTIVATIONS = {
    "gelu": gelu_exact,
    "gelu_tanh": lambda x: nn.gelu(x, approximate=True),
    "relu": nn.relu,
    "relu2": relu_squared,
    "swiglu": nn.silu,  # applied to the gate of a gated MLP
}


class MLP(nn.Module):
    """Position-wise feed-forward network: [B, T, D] -> [B, T, F] -> [B, T, D].

    activation='swiglu' is gated: W_down (silu(W_gate x) * W_up x); otherwise W_out act(W_in x).
    """

    cfg: ModelConfig

    @nn.compact
    def __call__(self, x: Array) -> Array:
        cfg = self.cfg
        dense = lambda features, name, output=False: Linear(  # noqa: E731
            features, use_bias=cfg.use_bias, dtype=cfg.dtype,
            kernel_init=dense_init(cfg, output), name=name,
        )
        # Plain autodiff, no jax.checkpoint around the activation: recomputing it in the backward
        # pass kept less memory but, without biases, made XLA:CPU compute its gradient in a strided
        # layout (docs/performance.md, "The MLP's activation"); cfg.remat is the memory knob.
        act = ACTIVATIONS[cfg.activation]
        if cfg.activation == "swiglu":
            h = act(dense(cfg.mlp_dim, "gate")(x)) * dense(cfg.mlp_dim, "up")(x)
        else:
            h = act(dense(cfg.mlp_dim, "fc_in")(x))
        h = nn.with_logical_constraint(h, ("batch", "length", "mlp"))  # tensor parallel: split by F
        h = point(self, "hidden", h)  # mlp.hidden [B, T, F]
        return point(self, "output", dense(cfg.d_model, "fc_out", output=True)(h))  # mlp.out [B, T, D]


class Block(nn.Module):
    """One decoder layer: attention and MLP, each with a residual add and a norm (mlp_dim=0:
    attention alone, no `mlp` or `mlp_norm` parameters).

    x [B, T, D] -> x [B, T, D], plus this layer's new cache entries. The signature (carry, inputs)
    -> (carry, outputs) lets `nn.scan` stack the layers. window: the layer's sliding window W
    (cfg.layer_windows), or None for full attention; in a scanned stack of local and global layers,
    `layer_window` brings it per layer as a traced scalar instead (NO_WINDOW for a global layer).
    context: [B, T] bool, a table's training rows, which every row sees (model/table.py), or None.
    """

    cfg: ModelConfig
    deterministic: bool = True
    window: int | None = None

    @nn.compact
    def __call__(self, x: Array, positions: Array, cached: Cache | None,
                 layer_window: Array | None = None, context: Array | None = None) -> tuple[Array, Cache | None]:
        cfg = self.cfg
        window = self.window if layer_window is None else layer_window
        drop = nn.Dropout(cfg.dropout, deterministic=self.deterministic)
        attention = (LatentAttention if cfg.attention == "mla" else Attention)(cfg, name="attn")
        mlp = MLP(cfg, name="mlp")  # never called with mlp_dim=0, so it has no parameters then
        x = point(self, "resid_pre", x)  # the named points: model/points.py
        if cfg.prenorm:
            a, new = attention(config_norm(cfg, "attn_norm")(x), positions, cached, window, context)
            x = point(self, "resid_mid", x + drop(a))
            if cfg.mlp_dim:
                x = x + drop(mlp(config_norm(cfg, "mlp_norm")(x)))
        else:
            a, new = attention(x, positions, cached, window, context)
            x = point(self, "resid_mid", config_norm(cfg, "attn_norm")(x + drop(a)))
            if cfg.mlp_dim:
                x = config_norm(cfg, "mlp_norm")(x + drop(mlp(x)))
        x = nn.with_logical_constraint(x, ("batch", "length", "embed"))  # the residual stream: whole D
        x = point(self, "resid_post", x)
        return x, new if cached is not None else None


class Decoder(nn.Module):
    """A decoder-only transformer language model.

    __call__(tokens [B, T], positions [B, T] = None, cache = None, deterministic = True)
      -> (logits [B, T, V] float32, updated cache or None)

    Inside, the named points (model/points.py) can be captured (analysis/capture.py: the attention
    weights are among them) and edited (model/edits.py: head ablation is an edit at attn.z). With the
    sink/register options the attention's key axis grows; its query axis stays T:
      registers (num_registers = R): R more keys first, one per register (S_total + R); with a
        cache they are its R leading slots, written by the call that fills an empty cache;
      sink (attention_sink): one more column last in the weights, the sink's share.
    Registers sit at positions -R..-1, whatever the tokens' positions: causally first, with no
    position embedding (learned or sinusoidal: a table has no negative rows) and, with RoPE, rotated
    by their positions like R tokens just before the window. The real tokens keep their positions
    (0..T-1 by default), so their embeddings and rotations are the plain model's; logits [B, T, V].

    positions default to 0..T-1 (the cache-free forward). With a cache, this call's keys/values are
    written at slots `positions`, and each token attends to the cached slots before its row's first
    position plus this call's tokens up to itself: the same code serves prefill (T tokens) and
    decoding (T = 1), and rows may sit at different positions. S_total is T without a cache and
    S + T with one (cached slots first).

    Out-of-range inputs: a token id outside [0, vocab_size), or a position at or past max_seq_len
    (with a cache: at or past its S slots; a cache of ring buffers only, with RoPE or no positions,
    takes positions past max_seq_len: `position_limit`). Padding at kv_cache.PAD_POSITION is seen by
    no real token and written nowhere. Concrete tokens and positions (not traced by jit)
    raise a ValueError naming the id or position and where it is. Under jit nothing can raise;
    instead a row's logits are NaN from its first out-of-range token onwards (later tokens attend
    to it), while its earlier positions and the other rows are exactly what they would be without
    it (a bad id is looked up clipped into range, so nothing non-finite enters the attention). Its
    cache entries are written from that clipped id (a position past the cache writes nothing), so
    a later call whose queries see that slot is not flagged: validate ids before a jitted call.
    """

    cfg: ModelConfig

    @nn.compact
    def __call__(
        self,
        tokens: Array,
        positions: Array | None = None,
        cache: Cache | None = None,
        deterministic: bool = True,
    ) -> tuple[Array, Cache | None]:
        cfg = self.cfg
        cfg.check_resolved()  # dtype / attention_impl 'auto' are chosen before any model is built
        if cfg.inputs == "table":  # rows of a table [B, T, F + 1], not tokens (model/table.py)
            return self._classify_rows(tokens, cache, deterministic), None
        if positions is None:
            positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)  # [B, T]: 0..T-1
        check_tokens(cfg, tokens)  # ids in [0, V), when they are known (not traced)
        check_positions(cfg, positions, cache)  # positions < max_seq_len and < S, likewise
        embed = nn.Embed(cfg.vocab_size, cfg.d_model, embedding_init=nn.initializers.normal(0.02),
                         dtype=cfg.dtype, name="embed")  # E [V, D]
        x = self._embed(embed, tokens, positions, deterministic)  # [B, T, D]: E[tokens] + positions
        x = nn.with_logical_constraint(x, ("batch", "length", "embed"))  # logical axes (sharding.py)
        # Registers go through the layers in the cache-free forward and in the call that fills an
        # empty cache; later calls read their keys and values from the cache.
        r = cfg.num_registers if cache is None or not cache.registers_written else 0
        x_all, positions_all = self._prepend_registers(x, positions) if r else (x, positions)  # [B, R + T, ...]
        x, new = self._layers(x_all, positions_all, cache, deterministic)
        x = x[:, r:]  # [B, T, D]: the registers give no logits
        if cfg.prenorm:
            x = config_norm(cfg, "final_norm")(x)  # [B, T, D]
        h = nan_from_out_of_range(cfg, x, tokens, positions, cache)  # [B, T, D]: jit's stand-in for the checks
        logits = self._logits(embed, h)  # [B, T, V] float32
        if cache is not None:
            cache = kv_cache.write(cache, new, positions_all, after=x)  # x, not h: 0 * NaN would poison every row
            cache = cache.replace(registers_written=cache.registers_written or bool(r))
        return logits, cache

    @nn.nowrap  # a helper of __call__, not a call of its own: no name scope in the profile
    def _classify_rows(self, rows: Array, cache: Cache | None, deterministic: bool) -> Array:
        """rows [B, T, F + 1] -> class logits [B, T, C] float32 (cfg.inputs='table', model/table.py):
        the rows embedded, the blocks with the table's mask (a row sees the training rows and
        itself), the final norm and the class head. The points are the text model's (embed: the
        rows' vectors; logits [B, T, C])."""
        cfg = self.cfg
        if cache is not None:
            raise ValueError("a table model reads a table in one forward pass, without a KV cache; pass cache=None")
        table.check_rows(cfg, rows)
        x = point(self, "token_embedding", table.embed_rows(self, cfg, rows))  # [B, T, D]: the point embed
        x = nn.Dropout(cfg.dropout, deterministic=deterministic)(x)
        x = nn.with_logical_constraint(x, ("batch", "length", "embed"))
        positions = jnp.broadcast_to(jnp.arange(rows.shape[1]), rows.shape[:2])  # [B, T]: tells a row from another
        x, _ = self._layers(x, positions, None, deterministic, context=table.training_rows(rows))
        if cfg.prenorm:
            x = config_norm(cfg, "final_norm")(x)  # [B, T, D]
        logits = table.class_logits(self, cfg, x)  # [B, T, C] float32
        return point(self, "logits", nn.with_logical_constraint(logits, ("batch", "length", "vocab")))

    @nn.nowrap  # a helper of __call__, not a call of its own: no name scope in the profile
    def _embed(self, embed: nn.Embed, tokens: Array, positions: Array, deterministic: bool) -> Array:
        """tokens, positions [B, T] -> x [B, T, D]: token embeddings plus learned or sinusoidal
        position embeddings (RoPE rotates inside the attention; 'none' adds nothing), then dropout."""
        cfg = self.cfg
        # Clipped: nn.Embed looks up an id >= V as NaN, which the attention would spread to every
        # position of the row. A bad id's logits are set to NaN after the layers instead.
        x = point(self, "token_embedding", embed(jnp.clip(tokens, 0, cfg.vocab_size - 1)))  # [B, T, D]: point embed
        embed_positions = scheme(cfg).embed
        if embed_positions is not None:  # + P[positions], learned or sinusoidal: the point pos_embed
            x = x + point(self, "position_embedding", embed_positions(self, cfg, positions))
        return nn.Dropout(cfg.dropout, deterministic=deterministic)(x)  # [B, T, D]

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
    def _layers(
        self, x: Array, positions: Array, cache: Cache | None, deterministic: bool, context: Array | None = None
    ) -> tuple[Array, Cache | None]:
        """x [B, T, D] through the L blocks -> (x [B, T, D], the layers' new cache entries (tuples of
        L, as the cache holds them) or None).

        scan_layers: one `nn.scan` over a block whose params (and captured points and edits) have a
        leading L axis (`layers`); otherwise a Python loop over layers_0 ... layers_{L-1}. Each
        layer's sliding window (cfg.layer_windows) is static, except in a scan over local and
        global layers: there it is a scanned input [L] (NO_WINDOW for a global layer), so the stack
        still compiles one layer. Such a stack's cache mixes rings with full buffers, which do not
        stack: it is read by unrolled layers (`param_tree.unrolled`; the sampler does so). context:
        [B, T] bool, a table's training rows (model/table.py), which every row sees; None for text.
        """
        cfg = self.cfg
        block = nn.remat(Block) if cfg.remat else Block
        windows = cfg.layer_windows()
        if cfg.scan_layers:
            mixed = len(set(windows)) > 1  # local and global layers
            if mixed and cache is not None:
                raise ValueError(
                    "a scanned stack of local and global layers cannot read a cache (ring buffers and full "
                    "buffers do not stack): unroll it first, params, cfg = param_tree.unrolled(params, cfg)"
                )
            layer_windows = jnp.array([NO_WINDOW if w is None else w for w in windows], jnp.int32) if mixed else None
            layers = nn.scan(
                block,
                variable_axes={"params": 0, COLLECTION: 0, EDITS: 0},  # points and edits stack along L too
                split_rngs={"params": True, "dropout": True},
                in_axes=(nn.broadcast, 0, 0, nn.broadcast),
                length=cfg.num_layers,
            )(cfg, deterministic, None if mixed else windows[0], name="layers")
            stack = None if cache is None else param_tree.stack_cache(cache)  # the scan takes [L, ...] arrays
            x, new = layers(x, positions, stack, layer_windows, context)
            return x, None if cache is None else param_tree.unstack_cache(new)
        news = []  # unscanned: a Python loop, each layer its own params and cache buffers
        for i in range(cfg.num_layers):
            x, new_i = block(cfg, deterministic, windows[i], name=f"layers_{i}")(
                x, positions, None if cache is None else param_tree.cache_layer(cache, i), None, context)
            news.append(new_i)
        return x, None if cache is None else param_tree.join_cache(news)  # tuples of L

    @nn.nowrap  # a helper of __call__, not a call of its own: no name scope in the profile
    def _logits(self, embed: nn.Embed, h: Array) -> Array:
        """h [B, T, D] -> logits [B, T, V] float32: h E^T with tied embeddings, else a head W [V, D];
        then soft-capped at cfg.logit_softcap when it is > 0."""
        cfg = self.cfg
        if cfg.tie_embeddings:
            # h E^T, contracting E's rows in place: Flax's embed.attend transposes E first, and
            # XLA:CPU then fuses the final norm into a slow loop over E (docs/performance.md).
            logits = jnp.einsum("btd,vd->btv", h, embed.embedding.astype(cfg.dtype))
        else:
            init = nn.initializers.zeros if cfg.zero_init_head else nn.initializers.normal(0.02)
            logits = Linear(cfg.vocab_size, use_bias=False, dtype=cfg.dtype, kernel_init=init, name="head")(h)
        logits = logits.astype(jnp.float32)
        if cfg.logit_softcap:
            logits = ops.softcap(logits, cfg.logit_softcap)  # c tanh(logits / c): |logits| <= c
        return point(self, "logits", nn.with_logical_constraint(logits, ("batch", "length", "vocab")))


def nan_from_out_of_range(cfg: ModelConfig, x: Array, tokens: Array, positions: Array, cache: Cache | None) -> Array:
    """x [B, T, D] with NaN from each row's first out-of-range input on, so all its logits are NaN.

    Under jit check_tokens and check_positions cannot run: what they would reject gets a NaN hidden
    state (D numbers per token rather than V logits). An input is out of range when its token id
    is outside [0, vocab_size) or its position is at or past the context (max_seq_len) or the cache
    (S slots: the write is dropped). Positions increase along a row, so every later token of the
    row attends to it; earlier ones and other rows do not.

    Args:
      x: [B, T, D] hidden states. tokens, positions: [B, T] integers.
    """
    t = tokens.shape[1]
    limit = position_limit(cfg, cache)
    bad = (tokens < 0) | (tokens >= cfg.vocab_size) | (positions >= limit)
    index = jnp.arange(t)
    first_bad = jnp.where(bad, index, t).min(axis=1, keepdims=True, initial=t)  # [B, 1], T if none
    return jnp.where((index >= first_bad)[..., None], jnp.nan, x)


def check_tokens(cfg: ModelConfig, tokens: Array) -> None:
    """Raises a clear error for token ids outside [0, vocab_size), when they are known."""
    if isinstance(tokens, jax.core.Tracer):
        return
    tokens = np.asarray(tokens)
    bad = np.argwhere((tokens < 0) | (tokens >= cfg.vocab_size))
    if len(bad):
        row, t = bad[0]
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise ValueError(
            f"token id {tokens[row, t]} at row {row}, position {t}{more} is outside the vocabulary "
            f"of vocab_size={cfg.vocab_size} (ids 0..{cfg.vocab_size - 1}); encode the text with "
            "the model's tokenizer, or use a model whose vocab_size covers every id"
        )


def position_limit(cfg: ModelConfig, cache: Cache | None) -> int:
    """The first position a call may not use: the context (max_seq_len) or the cache's slots; a cache
    of ring buffers only (every layer windowed, or `init_rolling_cache`) rolls past the context
    when positions are relative (RoPE) or absent."""
    if cache is None:
        return cfg.max_seq_len
    if cache.max_len >= kv_cache.PAD_POSITION and scheme(cfg).relative:
        return kv_cache.PAD_POSITION
    return min(cfg.max_seq_len, cache.max_len)


def check_positions(cfg: ModelConfig, positions: Array, cache: Cache | None) -> None:
    """Raises a clear error for positions past the context or the cache, when they are known."""
    if isinstance(positions, jax.core.Tracer):
        return
    real = np.asarray(positions)[np.asarray(positions) != kv_cache.PAD_POSITION]  # padding is never written
    top = int(real.max()) if real.size else -1
    if top >= cfg.max_seq_len and position_limit(cfg, cache) < kv_cache.PAD_POSITION:
        raise ValueError(
            f"position {top} is past the model's context (max_seq_len={cfg.max_seq_len}); "
            "shorten the input or use a model with a longer context"
        )
    if cache is not None and top >= cache.max_len:
        raise ValueError(
            f"position {top} does not fit in the cache of {cache.max_len} slots; "
            "init_cache with a larger max_len (prompt length + new tokens)"
        )


def example_input(cfg: ModelConfig, length: int = 1) -> Array:
    """Zeros a model of `cfg` reads, to build its parameters: tokens int32 [1, length], or a table's
    rows float32 [1, length, F + 1] (cfg.inputs='table')."""
    if cfg.inputs == "table":
        return jnp.zeros((1, length, cfg.row_width), jnp.float32)
    return jnp.zeros((1, length), jnp.int32)


def count_params(params) -> int:
    """Total number of parameters in a pytree."""
    return sum(x.size for x in jax.tree.leaves(params))
