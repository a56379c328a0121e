"""Answers and where they look: greedy exact match through the sampler (the loop's metric VQA_ACCURACY)
and the answer bytes' cross-attention over the image patches (`answer_attention`, `object_shares`).

    tokens = greedy_answers(params, cfg, inputs, targets)            # [B, N]: the sampler's cached path
    weights = answer_attention(params, cfg, inputs, targets)         # [L, B, H, N, S] over the encoder's S tokens
    shares = object_shares(weights, answered, drawn, cfg.encoder)    # per layer and head, against the area share
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from transformer.analysis.capture import capture
from transformer.data.batches import IGNORED
from transformer.experiments.vqa.questions import END
from transformer.model.config import ModelConfig
from transformer.sampling.sampler import SamplingOptions, decode, prefill, row_keys
from transformer.training.eval_metrics import EvalMetric

Array = jax.Array
LONGEST_ANSWER = len("triangle" + END)  # N: the bytes greedy decoding draws (the longest answer and END)


def answer_span(targets: Array) -> tuple[Array, Array, Array]:
    """targets [B, T] (IGNORED but on each row's answer) -> (its first graded index a_b [B], the answer's
    bytes [B, N] read from a_b on, graded [B, N]: the answer's bytes, not what follows them)."""
    graded = targets != IGNORED
    first = jnp.argmax(graded, axis=1)  # [B]: a_b, where the prompt's last byte predicts the answer's first
    index = first[:, None] + jnp.arange(LONGEST_ANSWER)  # [B, N]
    inside = index < targets.shape[1]
    index = jnp.minimum(index, targets.shape[1] - 1)
    return first, jnp.take_along_axis(targets, index, 1), jnp.take_along_axis(graded, index, 1) & inside


def greedy_answers(params: Any, cfg: ModelConfig, inputs: dict, targets: Array) -> Array:
    """The answers drawn greedily [B, N] after each row's prompt (inputs' tokens before a_b + 1): the
    sampler's prefill (the image encoded once) then its decoding steps from the cache; jit-able."""
    first, _, _ = answer_span(targets)
    options = SamplingOptions(temperature=0.0, stop_tokens=tuple(END.encode()))
    keys = row_keys(jax.random.key(0), first.shape[0])  # unused by greedy draws
    state = prefill(params, cfg, inputs["tokens"], (first + 1).astype(jnp.int32), keys, cfg.max_seq_len, options,
                    images=inputs["image"])
    _, rest, _ = decode(params, cfg, state, LONGEST_ANSWER - 1, options)
    return jnp.concatenate([state.tokens[:, None], rest], axis=1)  # [B, N]


def exact_match(params: Any, cfg: ModelConfig, inputs: dict, targets: Array) -> Array:
    """[B] bool: the greedy answer equals the target answer, END included (so the model stops)."""
    _, answer, graded = answer_span(targets)
    drawn = greedy_answers(params, cfg, inputs, targets)
    return jnp.all((drawn == answer) | ~graded, axis=1)


def answer_attention(params: Any, cfg: ModelConfig, inputs: dict, targets: Array) -> Array:
    """The cross-attention pattern of the queries that give the answer's bytes (at a_b .. a_b + N - 1),
    per layer and head: [L, B, H, N, S] over the encoder's S output tokens (rows past an answer: zeros)."""
    _, _, pattern = capture(params, cfg, inputs, ["blocks.*.cross.pattern"])  # [L, B, H, T, S]
    first, _, graded = answer_span(targets)
    pattern = pattern["blocks.*.cross.pattern"]
    index = jnp.minimum(first[:, None] + jnp.arange(LONGEST_ANSWER), targets.shape[1] - 1)  # [B, N]
    rows = jnp.take_along_axis(pattern, index[None, :, None, :, None], axis=3)  # [L, B, H, N, S]
    return rows * graded[None, :, None, :, None]


def object_patches(masks: np.ndarray, patch: int) -> np.ndarray:
    """masks bool [B, H, W] -> bool [B, N]: the P x P patches (row-major, as the ViT reads them) that
    hold a pixel of the object."""
    b, h, w = masks.shape
    blocks = masks.reshape(b, h // patch, patch, w // patch, patch)
    return blocks.any(axis=(2, 4)).reshape(b, -1)


def object_shares(weights: np.ndarray, graded: np.ndarray, drawn: dict, encoder: ModelConfig) -> dict[str, Any]:
    """The answer bytes' cross-attention on the asked object's patches: weights [L, B, H, N, S]
    (`answer_attention`), graded [B, N], drawn: the pictures (`questions.draw`: masks, target) ->
    {"share": [L, H] mean over answer bytes, "chance": the mean area share (object patches / S)}."""
    b = len(drawn["target"])
    masks = drawn["masks"][np.arange(b), drawn["target"]]  # [B, H, W]: the object asked about
    on_object = object_patches(masks, encoder.patch_size).astype(np.float32)  # [B, N_patches]
    lead = weights.shape[-1] - on_object.shape[1]  # a [CLS] token first: no patch
    on_object = np.pad(on_object, [(0, 0), (lead, 0)])  # [B, S]
    share = np.einsum("lbhns,bs->lbhn", weights, on_object)  # [L, B, H, N]
    count = graded.sum()
    return {"share": (share * graded[None, :, None]).sum(axis=(1, 3)) / count,  # [L, H]
            "chance": float(on_object.sum(axis=1).mean() / weights.shape[-1])}


def plot_answer_maps(weights: np.ndarray, graded: np.ndarray, drawn: dict, encoder: ModelConfig, rows: int = 4,
                     per_head: bool = False):
    """A matplotlib figure: for each of the first `rows` pictures, the picture (the question and the
    answer above it), then each layer's cross-attention of the answer's bytes over the patches drawn on
    it (the mean over the answer bytes; over the heads too, or one column per head with per_head).
    weights [L, B, H, N, S], graded [B, N]: as `answer_attention` gives them; drawn: `questions.draw`'s."""
    import matplotlib.pyplot as plt

    layers, _, heads, _, s = weights.shape
    side = encoder.image_size // encoder.patch_size
    mean = (weights * graded[None, :, None, :, None]).sum(3) / graded.sum(1)[None, :, None, None]  # [L, B, H, S]
    maps = mean[..., s - side * side:].reshape(layers, -1, heads, side, side)  # the patches: [CLS] left out
    columns = [(l, h) for l in range(layers) for h in (range(heads) if per_head else [None])]
    fig, axes = plt.subplots(rows, 1 + len(columns), figsize=(1.6 * (1 + len(columns)), 1.7 * rows), squeeze=False)
    size = encoder.image_size
    for b in range(rows):
        axes[b, 0].imshow(drawn["images"][b])
        axes[b, 0].set_title(f"{drawn['prompt'][b]}{drawn['answer_text'][b].strip()}", fontsize=6)
        for c, (l, h) in enumerate(columns, start=1):
            heat = maps[l, b].mean(0) if h is None else maps[l, b, h]
            axes[b, c].imshow(drawn["images"][b])
            axes[b, c].imshow(heat, cmap="magma", alpha=0.6, vmin=0, extent=(-0.5, size - 0.5, size - 0.5, -0.5))
            axes[b, c].contour(drawn["masks"][b, drawn["target"][b]], levels=[0.5], colors="cyan", linewidths=0.6)
            if b == 0:
                axes[b, c].set_title(f"layer {l}" + ("" if h is None else f" head {h}"), fontsize=7)
    for ax in axes.flat:
        ax.set_xticks([]), ax.set_yticks([])
    fig.tight_layout()
    return fig


def accuracy_counts(cfg: ModelConfig, inputs: Any):
    """(params, inputs, targets) -> {right, graded}: the rows answered exactly, by greedy decoding."""
    def count(params: Any, inputs: dict, targets: Array) -> dict[str, Array]:
        right = exact_match(params, cfg, inputs, targets)
        return {"right": jnp.sum(right), "graded": jnp.asarray(right.shape[0])}

    return count


def accuracy_report(cfg: ModelConfig, counts: list[dict]) -> dict[str, float]:
    right, graded = (sum(int(c[k]) for c in counts) for k in ("right", "graded"))
    return {"val_exact_match": float(right / max(graded, 1))}


VQA_ACCURACY = EvalMetric("vqa_exact_match", accuracy_counts, accuracy_report)
