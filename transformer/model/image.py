"""Images as the decoder's input (ModelConfig.inputs='image'): a vision transformer (ViT, Dosovitskiy et al. 2021).

"Tokenize anything": cut the image into P x P patches, project each to D, and run the same blocks.

    images [B, H, W, C] float -> patches [B, N, P P C]   N = (H / P)^2, row by row (`patches`)
    x = W_patch patches + b                                [B, N, D]       `patch_embed` (the point embed)
    x = [cls, x]                                           [B, 1 + N, D]   with cls_token: a learned `cls` [D]
    x = x + positions                                      position='learned': `pos_embed` rows 0..S-1;
                                                           'sinusoidal' means 2-D here: a patch's row and
                                                           column each fill D / 2 (`sinusoidal_2d`), [CLS]
                                                           gets none; 'none': nothing
    ... registers (num_registers) in front, as for text; every token sees every token (mask='bidirectional')
    ... the decoder's blocks, final norm: h [B, S, D]
    logits = W_head pooled                                 [B, 1, C] float32: pooled = h of [CLS]
                                                           (pool='cls') or the patch tokens' mean (pool='mean')

The class head is a table's (`table.logits`). Another module reads the ViT's output tokens, the
final-normed h [B, S, D] ([CLS] first, then the patches row by row; the registers' rows dropped), with
`decoder.encode(module, cfg, images)` inside a module, or from trained parameters as the point `final_norm.out` (analysis/capture.py).
"""

from __future__ import annotations

import types

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer.model import ops, table
from transformer.model.config import ModelConfig
from transformer.model.linear import Linear
from transformer.model.points import point
from transformer.model.positions import learned_embedding

Array = jax.Array


def patches(images: Array, p: int) -> Array:
    """images [B, H, W, C] -> patches [B, N, P P C], N = (H / P) (W / P), row by row; a patch's pixels row
    by row, each pixel's C channels together."""
    b, h, w, c = images.shape
    grid = images.reshape(b, h // p, p, w // p, p, c).transpose(0, 1, 3, 2, 4, 5)  # [B, H/P, W/P, P, P, C]
    return grid.reshape(b, (h // p) * (w // p), p * p * c)


def unpatch(patched: Array, p: int, size: int) -> Array:
    """patches [B, N, P P C] of `size` x `size` images -> the images [B, H, W, C]: `patches` undone."""
    b, n, width = patched.shape
    side, c = size // p, width // (p * p)
    return patched.reshape(b, side, side, p, p, c).transpose(0, 1, 3, 2, 4, 5).reshape(b, size, size, c)


def sinusoidal_2d(cfg: ModelConfig) -> Array:
    """[N, D] float32: patch (i, j)'s row i encoded in the first D / 2 features, its column j in the last
    D / 2 (Vaswani et al.'s sines and cosines, `ops.sinusoidal_positions`, along each axis)."""
    side = cfg.image_size // cfg.patch_size
    rows, columns = jnp.divmod(jnp.arange(side * side), side)  # [N] each
    return jnp.concatenate([ops.sinusoidal_positions(rows, cfg.d_model // 2),
                            ops.sinusoidal_positions(columns, cfg.d_model // 2)], axis=-1)


def example(cfg: ModelConfig, length: int = 1) -> Array:
    return jnp.zeros((1, cfg.image_size, cfg.image_size, cfg.channels), jnp.float32)


def embed(module: nn.Module, cfg: ModelConfig, images: Array, positions: Array | None, cache, deterministic: bool
          ) -> tuple[Array, Array, None]:
    """images [B, H, W, C] -> (x [B, S, D] as the module docstring builds it, positions 0..S-1 [B, S], None:
    the mask kind, bidirectional, says what each token sees). S = cfg.image_tokens."""
    check_images(cfg, images)
    b = images.shape[0]
    pixels = 2.0 * patches(images, cfg.patch_size) - 1.0  # [B, N, P P C] in [-1, 1]: centred, as ViT's inputs
    init = nn.initializers.normal(pixels.shape[-1] ** -0.5)  # fan-in: a patch's embedding starts at about unit scale
    x = Linear(cfg.d_model, use_bias=True, dtype=cfg.dtype, kernel_init=init, name="patch_embed")(pixels)
    if cfg.cls_token:
        cls = module.param("cls", nn.initializers.normal(0.02), (cfg.d_model,)).astype(x.dtype)
        x = jnp.concatenate([jnp.broadcast_to(cls, (b, 1, cfg.d_model)), x], axis=1)  # [B, 1 + N, D]
    x = point(module, "token_embedding", x)  # the point embed
    positions = jnp.broadcast_to(jnp.arange(cfg.image_tokens), (b, cfg.image_tokens))  # [B, S]
    if cfg.position != "none":
        if cfg.position == "learned":
            at = learned_embedding(module, cfg, positions)  # [B, S, D]
        else:  # 2-D sinusoidal on the patches, none on [CLS]
            at = jnp.pad(sinusoidal_2d(cfg), ((cfg.cls_token, 0), (0, 0)))[None].astype(cfg.dtype)  # [1, S, D]
        x = x + point(module, "position_embedding", jnp.broadcast_to(at, x.shape))
    return nn.Dropout(cfg.dropout, deterministic=deterministic)(x), positions, None


def logits(module: nn.Module, cfg: ModelConfig, h: Array, images: Array, positions: Array, cache) -> Array:
    """h [B, S, D] -> class logits [B, 1, C] float32 (the head `head` [C, D]) from the [CLS] token's h or
    the patch tokens' mean (cfg.pool)."""
    pooled = h[:, :1] if cfg.pool == "cls" else h[:, int(cfg.cls_token):].mean(axis=1, keepdims=True)  # [B, 1, D]
    return table.logits(module, cfg, pooled, images, positions, cache)


def check_images(cfg: ModelConfig, images: Array) -> None:
    """Raises a clear error for images that are not [B, image_size, image_size, channels] (shapes are known under jit too)."""
    want = (cfg.image_size, cfg.image_size, cfg.channels)
    if images.ndim != 4 or tuple(images.shape[1:]) != want:
        channels_only = images.ndim == 4 and images.shape[1:3] == want[:2]
        problem, fix = ((f"{images.shape[-1]} channels", f"convert them to {cfg.channels} channels") if channels_only
                        else (f"shape {tuple(images.shape)}", "resize them"))
        raise ValueError(f"a ViT of image_size={cfg.image_size}, channels={cfg.channels} reads images [B, "
                         f"{cfg.image_size}, {cfg.image_size}, {cfg.channels}], got {problem}; {fix}, or train a "
                         "model for them")


PIXELS = types.SimpleNamespace(example=example, embed=embed, logits=logits)  # an input kind (model/inputs.py)
