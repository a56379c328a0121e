"""Reading an SAE's features: where each fires, what it writes, a rule that judges it, and steering.

    f = activations(params, cfg, sae, windows)        # [B, T, N]: the point P.features, the SAE spliced in
    values, where = top_contexts(f, k=10)             # [N, k]: each feature's largest activations, at b * T + t
    effect = logit_effect(params, cfg, sae)           # [N, V]: W_dec through the final norm's gain and W_U
    rate = density(f)                                 # [N]: the share of tokens it fires on
    judged = token_rule(where, values, windows)       # [N] bool: the rule below
    edits = [Splice(sae), ablate(cfg, sae, [3])]      # feature 3 off (steer(cfg, sae.point + ".features", v): on)
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from transformer.analysis.capture import capture
from transformer.analysis.lens import unembedding
from transformer.analysis.sae.autoencoder import SAE
from transformer.analysis.sae.splice import Splice
from transformer.model.config import ModelConfig
from transformer.model.edits import Edit, at_layer
from transformer.model.points import FEATURES

Array = jax.Array
SAME_TOKEN = 0.8  # the rule: this share of a feature's top contexts on one token, or after one token


def activations(params: Any, cfg: ModelConfig, sae: SAE, windows: np.ndarray, rows: int = 32) -> np.ndarray:
    """The feature activations [B, T, N] on token windows [B, T], read at the point P.features with the
    SAE spliced in (with its error term, so the model's own activations), `rows` windows a call."""
    name = sae.point + FEATURES
    read = jax.jit(lambda p, t: capture(p, cfg, t, [name], edits=[Splice(sae)])[2][name])
    return np.concatenate([np.asarray(read(params, windows[i:i + rows])) for i in range(0, len(windows), rows)])


def top_contexts(f: np.ndarray, k: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """Each feature's k largest activations [N, k] and where they are [N, k] (b * T + t) in f [B, T, N]."""
    values, where = jax.lax.top_k(jnp.asarray(f).reshape(-1, f.shape[-1]).T, k)
    return np.asarray(values), np.asarray(where)


def density(f: np.ndarray) -> np.ndarray:
    """[N]: the share of the tokens of f [B, T, N] on which each feature is active (> 0)."""
    return (f.reshape(-1, f.shape[-1]) > 0).mean(0)


def logit_effect(params: Any, cfg: ModelConfig, sae: SAE) -> np.ndarray:
    """[N, V]: each feature's decoder row written into the residual stream, read directly by the head:
    (W_dec * g) W_U^T, g the final norm's gain (a pre-norm model; the norm's division is left out)."""
    gain = params.get("final_norm", {}).get("scale", 1.0) if cfg.prenorm else 1.0
    return np.asarray((sae.W_dec * gain) @ unembedding(params, cfg).astype(jnp.float32).T)


def ablate(cfg: ModelConfig, sae: SAE, features: list[int]) -> Edit:
    """Zero ablation of `features` at the point P.features (use with Splice(sae))."""
    keep = jnp.ones((1, 1, sae.num_features)).at[..., jnp.asarray(features)].set(0.0)  # against [B, T, N]
    return at_layer(cfg, sae.point + FEATURES, keep, jnp.zeros_like(keep))


def token_rule(where: np.ndarray, values: np.ndarray, windows: np.ndarray) -> np.ndarray:
    """[N] bool, the stated rule for "interpretable": of a feature's top contexts (where [N, k], at b * T + t
    of windows [B, T]), at least SAME_TOKEN share one token, or share the token before it (t = 0: none);
    a feature active on fewer than k tokens (values [N, k] not all > 0) fails."""
    flat = windows.reshape(-1)
    before = np.concatenate([np.full((len(windows), 1), -1), windows[:, :-1]], axis=1).reshape(-1)
    judged = []
    for w, v in zip(where, values):
        shares = [Counter(tokens[w].tolist()).most_common(1)[0][1] / len(w) for tokens in (flat, before)]
        judged.append(bool((v > 0).all() and max(shares) >= SAME_TOKEN))
    return np.array(judged)


def context(tokenizer: Any, windows: np.ndarray, at: int, before: int = 24, after: int = 4) -> str:
    """The text around token `at` (b * T + t of windows [B, T]), that token in [brackets]."""
    b, t = divmod(int(at), windows.shape[1])
    row = windows[b].tolist()
    text = [tokenizer.decode(row[max(t - before, 0):t]), tokenizer.decode(row[t:t + 1]), tokenizer.decode(row[t + 1:t + 1 + after])]
    return repr(f"{text[0]}[{text[1]}]{text[2]}")[1:-1]
