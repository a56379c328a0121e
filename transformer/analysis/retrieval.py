"""Retrieval on the needle task (needle.py): accuracy over a grid of lengths x depths, the retrieval
score of each head, and head ablations.

    grid = needle.document_grid(filler, lengths, depths, per_cell)           # grid[i][j]: documents
    accuracy = accuracy_grid(params, cfg, grid)                              # [len(lengths), len(depths)]
    scores = retrieval_scores(params, cfg, documents)                        # [L, H]
    accuracy = accuracy_grid(params, cfg, grid, head_mask=ablation_mask(cfg, heads))

Accuracy is exact match: the model's greedy continuation of the prompt (`sampling.generate`, all
documents of a cell in one call) must equal the value, digit for digit.

The retrieval score of a head (Wu et al. 2024, "Retrieval Head Mechanistically Explains
Long-Context Factuality") counts, over the answer tokens the model copies from the needle, how
often the head's largest attention weight lands on that very token in the needle: at answer step i
(the query at the position whose output is answer token i), a step counts when the model's token
equals the value's i-th digit, and the head scores it when its argmax over keys is the position of
that digit in the needle (value_start + i). Score = hits / counted steps, in [0, 1]. Wu et al. add a
token to a head's set when the argmax lands on any needle position holding the same token; here it
must be the digit's own position, so a repeated digit elsewhere in the value does not count.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from transformer.model.config import ModelConfig
from transformer.analysis.capture import attention_maps
from transformer.model.edits import ablate_heads, run
from transformer.data.needle import Document
from transformer.sampling.sampler import generate

Array = jax.Array


def answers(params: dict, cfg: ModelConfig, documents: list[Document], head_mask: Array | None = None) -> np.ndarray:
    """The model's greedy answers to `documents` (one `generate` call): int32 [B, digits]."""
    digits = len(documents[0].answer)
    edits = [] if head_mask is None else [ablate_heads(cfg, head_mask)]
    out = generate(params, cfg, [d.prompt for d in documents], jax.random.key(0), digits, edits, temperature=0.0)
    return out.tokens


def accuracy(params: dict, cfg: ModelConfig, documents: list[Document], head_mask: Array | None = None) -> float:
    """Fraction of `documents` whose greedy answer equals the value exactly."""
    got = answers(params, cfg, documents, head_mask)
    return float(np.mean(np.all(got == np.stack([d.answer for d in documents]), axis=1)))


def accuracy_grid(params: dict, cfg: ModelConfig, grid: list[list[list[Document]]],
                  head_mask: Array | None = None) -> np.ndarray:
    """Accuracy of each cell of `grid` (needle.document_grid): float [lengths, depths]."""
    return np.array([[accuracy(params, cfg, cell, head_mask) for cell in row] for row in grid])


def teacher_forced(params: dict, cfg: ModelConfig, documents: list[Document], head_mask: Array | None = None
                   ) -> np.ndarray:
    """Whether each document is answered exactly, read in one forward pass: bool [B].

    Greedy decoding gives the value exactly if and only if, with the value fed back as the answer so
    far (teacher forcing), every answer token is the argmax at its step: both walk the same prefixes
    while they agree, and the first disagreement fails both. So one batched forward pass of prompt +
    value[:-1] ([B, n + A - 1]) decides a whole cell of equal-length documents, and head masks are
    data to the compiled pass (one compile for every mask).
    """
    n, digits = len(documents[0].prompt), len(documents[0].answer)
    if any(len(d.prompt) != n for d in documents):
        raise ValueError("teacher_forced reads documents of one prompt length in one batch; group them by length "
                         "(document_grid's cells are)")
    tokens = jnp.asarray(np.stack([np.concatenate([d.prompt, d.answer[:-1]]) for d in documents]))
    mask = jnp.ones((cfg.num_layers, cfg.num_heads), jnp.float32) if head_mask is None else jnp.asarray(head_mask)
    top = np.asarray(_answer_argmax(params, cfg, tokens, mask, n, digits))  # [B, A]
    return np.all(top == np.stack([d.answer for d in documents]), axis=1)


@functools.partial(jax.jit, static_argnames=("cfg", "n", "digits"))
def _answer_argmax(params: dict, cfg: ModelConfig, tokens: Array, head_mask: Array, n: int, digits: int) -> Array:
    """The argmax token at the answer steps (positions n - 1 .. n + digits - 2) with `head_mask`'s
    heads off -> int [B, digits]."""
    logits, _ = run(params, cfg, tokens, [ablate_heads(cfg, head_mask)])
    return jnp.argmax(logits[:, n - 1: n - 1 + digits], axis=-1)


def standard_error(accuracy: np.ndarray | float, per_cell: int) -> np.ndarray:
    """The standard error of an accuracy measured on `per_cell` documents: sqrt(p (1 - p) / n)."""
    p = np.asarray(accuracy, dtype=float)
    return np.sqrt(p * (1 - p) / per_cell)


# --- The retrieval score ------------------------------------------------------------------------


def score_from_attention(attention: Array, value_positions: np.ndarray, copied: np.ndarray,
                         per_step: bool = False) -> np.ndarray:
    """Retrieval scores from attention weights at the answer steps.

    Args:
      attention: [L, B, H, A, S] weights of A answer-step queries over S keys.
      value_positions: int [B, A], the key position of the digit that answer step a copies.
      copied: bool [B, A], whether the model's answer token at step a equals that digit (the steps
        that count).
      per_step: score each answer step apart.
    Returns:
      float [L, H]: per head, hits / counted steps (0 where no step counts); [L, H, A] per step.
    """
    top = np.asarray(jnp.argmax(attention, axis=-1))  # [L, B, H, A]
    hits = (top == value_positions[None, :, None, :]) & copied[None, :, None, :]  # [L, B, H, A]
    if per_step:
        return hits.sum(axis=1) / np.maximum(copied.sum(axis=0), 1)
    return hits.sum(axis=(1, 3)) / max(int(copied.sum()), 1)


def retrieval_scores(params: dict, cfg: ModelConfig, documents: list[Document], batch_size: int = 32,
                     head_mask: Array | None = None, per_step: bool = False) -> np.ndarray:
    """The retrieval score of every head over all the answer steps of `documents`: float [L, H]
    (per_step: [L, H, A], each answer step apart).

    The model answers greedily (`answers`); each prompt with its answer is then read in one forward
    pass capturing the attention weights (documents of one prompt length together, `batch_size` at a time), and
    each answer step's attention is scored (`score_from_attention`).
    """
    digits = len(documents[0].answer)
    hits, counted = np.zeros((cfg.num_layers, cfg.num_heads, digits)), np.zeros(digits)
    for n in sorted({len(d.prompt) for d in documents}):
        same = [d for d in documents if len(d.prompt) == n]
        for start in range(0, len(same), batch_size):
            batch = same[start: start + batch_size]
            got = answers(params, cfg, batch, head_mask)  # [B, A]
            tokens = np.concatenate([np.stack([d.prompt for d in batch]), got[:, :-1]], axis=1)  # [B, n + A - 1]
            steps = _attention(params, cfg, jnp.asarray(tokens), head_mask)[:, :, :, n - 1: n - 1 + digits]
            value_positions = np.array([[d.value_start + i for i in range(digits)] for d in batch])  # [B, A]
            copied = got == np.stack([d.answer for d in batch])  # the steps that count
            hits += score_from_attention(steps, value_positions, copied, per_step=True) * copied.sum(axis=0)
            counted += copied.sum(axis=0)
    if per_step:
        return hits / np.maximum(counted, 1)
    return hits.sum(axis=-1) / max(counted.sum(), 1)


@functools.partial(jax.jit, static_argnames="cfg")
def _attention(params: dict, cfg: ModelConfig, tokens: Array, head_mask: Array | None) -> Array:
    """tokens [B, T] -> every layer's attention weights [L, B, H, T, T], the heads of head_mask off."""
    return attention_maps(params, cfg, tokens, [] if head_mask is None else [ablate_heads(cfg, head_mask)])


# --- Ablation -------------------------------------------------------------------------------------


def top_heads(scores: np.ndarray, k: int) -> list[tuple[int, int]]:
    """The k heads with the highest scores [L, H], best first, as (layer, head)."""
    order = np.argsort(-scores, axis=None, kind="stable")[:k]
    return [tuple(int(i) for i in np.unravel_index(o, scores.shape)) for o in order]


def random_heads(cfg: ModelConfig, k: int, rng: np.random.Generator, exclude: list[tuple[int, int]] = ()
                 ) -> list[tuple[int, int]]:
    """k distinct heads drawn uniformly from the model's heads not in `exclude`, as (layer, head)."""
    pool = [(l, h) for l in range(cfg.num_layers) for h in range(cfg.num_heads) if (l, h) not in set(exclude)]
    if k > len(pool):
        raise ValueError(f"cannot draw {k} heads from the {len(pool)} left; lower k")
    return [pool[i] for i in rng.choice(len(pool), size=k, replace=False)]


def ablation_mask(cfg: ModelConfig, heads: list[tuple[int, int]]) -> Array:
    """A head mask [L, H] for `edits.ablate_heads`: 1 everywhere except 0 at the given (layer, head) pairs."""
    mask = np.ones((cfg.num_layers, cfg.num_heads), np.float32)
    for layer, head in heads:
        mask[layer, head] = 0.0
    return jnp.asarray(mask)
