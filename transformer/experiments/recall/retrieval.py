"""Retrieval on the needle task (experiments/recall/needle.py): accuracy over a grid of lengths x depths, and the
heads that retrieve, found two ways: by where they look (the retrieval score) and by what they cause
(activation patching); the soft dictionary look-up of one head.

    grid = needle.document_grid(filler, lengths, depths, per_cell, facts=4)  # grid[i][j]: documents
    accuracy = accuracy_grid(params, cfg, grid)                               # [lengths, depths], greedy
    accuracy = teacher_forced_grid(params, cfg, grid, masks)                  # [M, lengths, depths], M masks
    scores = retrieval_scores(params, cfg, documents)                         # [L, H], Wu et al.
    causal = causal_scores(params, cfg, documents).normalised()               # [L, H], patching
    weights = lookup_weights(params, cfg, documents, layer, head)             # [B, facts]
    accuracy_grid(params, cfg, grid, head_mask=ablation_mask(cfg, heads))    # heads removed

Accuracy is exact match: the model's greedy continuation of the prompt must equal the value, digit
for digit. `accuracy_grid` decodes (`sampling.generate`, all documents of a cell in one call);
`teacher_forced_grid` reads the same thing from one forward pass (`teacher_forced`), with many head
masks through one compile: what an ablation experiment (analysis/ablation.py) needs.

The retrieval score of a head (Wu et al. 2024, "Retrieval Head Mechanistically Explains
Long-Context Factuality") counts, over the answer tokens the model copies from the needle, how
often the head's largest attention weight lands on that very token in the needle: at answer step i
(the query at the position whose output is answer token i), a step counts when the model's token
equals the value's i-th digit, and the head scores it when its argmax over keys is the position of
that digit in the needle (value_start + i). Score = hits / counted steps, in [0, 1]. Wu et al. add a
token to a head's set when the argmax lands on any needle position holding the same token; here it
must be the digit's own position, so a repeated digit elsewhere in the value does not count.

The causal score of a head (`causal_scores`) patches its output z, at every position, from the same
document asking another of its facts (`needle.ask`), and measures the share of the metric that moves;
the metric is the teacher-forced log-probability of the asked value minus that of the other value.

EXACT_MATCH, the loop's metric for needle runs that grade the answer: `val_exact_match`, the
fraction of validation documents answered exactly, read as `teacher_forced` reads it.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from transformer.analysis.capture import attention_maps
from transformer.analysis.patching import Patching, patch_heads
from transformer.data.batches import IGNORED
from transformer.experiments.recall.needle import KEY_LENGTH, Document, ask
from transformer.model.config import ModelConfig
from transformer.model.edits import ablate_heads, run
from transformer.sampling.sampler import generate
from transformer.training.eval_metrics import EvalMetric

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


def teacher_forced_grid(params: dict, cfg: ModelConfig, grid: list[list[list[Document]]],
                        head_masks: Array | np.ndarray | None = None) -> np.ndarray:
    """Exact-match accuracy of each cell of `grid` (needle.document_grid) under each head mask of
    `head_masks` [M, L, H] (None: the intact model, M = 1): float [M, lengths, depths].

    Read by `teacher_forced` (the same numbers as greedy decoding): the cells of one length (every
    depth) are one forward pass, and every mask shares that length's compiled pass.
    """
    masks = np.ones((1, cfg.num_layers, cfg.num_heads), np.float32) if head_masks is None else np.asarray(head_masks)
    if masks.ndim != 3 or masks.shape[1:] != (cfg.num_layers, cfg.num_heads):
        raise ValueError(f"head_masks has shape {masks.shape}; give [M, {cfg.num_layers}, {cfg.num_heads}] "
                         "(one [L, H] mask per row: retrieval.ablation_mask)")
    out = np.zeros((len(masks), len(grid), len(grid[0])))
    for i, row in enumerate(grid):
        documents = [d for cell in row for d in cell]
        sizes = np.cumsum([0] + [len(cell) for cell in row])
        for m, mask in enumerate(masks):
            right = teacher_forced(params, cfg, documents, mask)
            out[m, i] = [right[a:b].mean() for a, b in zip(sizes[:-1], sizes[1:])]
    return out


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


def by_length(documents: list[Document]) -> list[tuple[int, list[int]]]:
    """The documents' indices grouped by prompt length, shortest first: [(n, indices)], one batch shape each."""
    lengths = [len(d.prompt) for d in documents]
    return [(n, [i for i, m in enumerate(lengths) if m == n]) for n in sorted(set(lengths))]


# --- The causal score: patching each head from the document asking another fact -----------------


def value_log_prob(logits: Array, values: Array, n: int) -> Array:
    """The teacher-forced log-probability of `values` [B, A] as the answer after a prompt of n tokens:
    logits [B, n + A - 1, V] of prompt + values[:, :-1] -> [B], the sum over the A answer steps."""
    steps = jax.nn.log_softmax(logits[:, n - 1: n - 1 + values.shape[1]].astype(jnp.float32), axis=-1)
    return jnp.take_along_axis(steps, values[..., None], axis=-1)[..., 0].sum(axis=-1)


def recall_metric(asked: Array, other: Array, n: int):
    """The patching metric of recall: logits [2B, n + A - 1, V] (rows 0..B-1 followed by the asked value,
    rows B..2B-1 by the other value, `asked`, `other` [B, A]) -> the mean over documents of log p(asked
    value) - log p(other value)."""
    def metric(logits: Array) -> Array:
        b = asked.shape[0]
        return (value_log_prob(logits[:b], asked, n) - value_log_prob(logits[b:], other, n)).mean()

    return metric


def patching_pair(documents: list[Document], other: list[int]) -> tuple[Array, Array, Array, Array]:
    """The two inputs of the causal score for documents of one prompt length n, each asking fact
    `document.asked` and, in the corrupted copy, fact other[b] (`needle.ask`): (as_asked, as_other,
    asked_values, other_values). Each input is [2B, n + A - 1]: every prompt followed by the asked
    value (rows 0..B-1), then by the other value (rows B..2B-1), so the two inputs differ only in the
    question's key."""
    if len({len(d.prompt) for d in documents}) != 1:
        raise ValueError("patching_pair takes documents of one prompt length; group them by length")
    if any(o == d.asked or not 0 <= o < len(d.facts) for d, o in zip(documents, other)):
        raise ValueError("each document's other fact must be one of its facts, not the asked one: the causal "
                         "score needs documents with facts >= 2")
    swapped = [ask(d, o) for d, o in zip(documents, other)]
    asked_values = np.stack([d.answer for d in documents])
    other_values = np.stack([d.answer for d in swapped])

    def rows(docs: list[Document]) -> np.ndarray:
        prompts = np.stack([d.prompt for d in docs])
        return np.concatenate([np.concatenate([prompts, asked_values[:, :-1]], axis=1),
                               np.concatenate([prompts, other_values[:, :-1]], axis=1)])

    return (jnp.asarray(rows(documents)), jnp.asarray(rows(swapped)), jnp.asarray(asked_values),
            jnp.asarray(other_values))


def causal_scores(params: dict, cfg: ModelConfig, documents: list[Document], other: list[int] | None = None,
                  batch_size: int = 16) -> Patching:
    """Each head's share in choosing the asked fact's value, by activation patching: float grid [L, H].

    For each document asking fact a, the corrupted input asks fact b = other[i] (default: the fact
    after a in the text, cyclically) of the same document. The metric (`recall_metric`) is log p(value
    of a) - log p(value of b) under teacher forcing; the document as asked is run with head (l, h)'s
    z, at every position, taken from the run asking b (`patching.patch_heads`). Returned as a
    Patching whose `clean` is the metric of the run asking b, `corrupted` that of the document as
    asked, and `grid` the patched runs' (each the mean over all documents, batched by prompt length):
    `normalised()` is the share of the metric each head's patch moves, 0 where the head carries none
    of the question's key, 1 where it alone carries all of it.
    """
    other = [(d.asked + 1) % len(d.facts) for d in documents] if other is None else list(other)
    grid, clean, corrupted, count = 0.0, 0.0, 0.0, 0
    for n, at in by_length(documents):
        for start in range(0, len(at), batch_size):
            batch = at[start: start + batch_size]
            as_asked, as_other, asked_values, other_values = patching_pair([documents[i] for i in batch],
                                                                           [other[i] for i in batch])
            got = _patch_heads(params, cfg, as_other, as_asked, asked_values, other_values, n)
            grid, clean, corrupted = (grid + got.grid * len(batch), clean + got.clean * len(batch),
                                      corrupted + got.corrupted * len(batch))
            count += len(batch)
    return Patching(np.asarray(grid) / count, np.asarray(clean) / count, np.asarray(corrupted) / count)


@functools.partial(jax.jit, static_argnames=("cfg", "n"))
def _patch_heads(params: dict, cfg: ModelConfig, source: Array, target: Array, asked: Array, other: Array,
                 n: int) -> Patching:
    return patch_heads(params, cfg, source, target, recall_metric(asked, other, n))


# --- The soft look-up -----------------------------------------------------------------------------


def lookup_weights(params: dict, cfg: ModelConfig, documents: list[Document], layer: int, head: int,
                   over: str = "key") -> np.ndarray:
    """The lecture's soft dictionary look-up, read off one head: the attention weight that head `head`
    of layer `layer` puts, from the query that writes the answer's first token (the prompt's last
    position), on each fact's key tokens (over='key', KEY_LENGTH of them) or value tokens
    (over='value'), summed over the entry's tokens: float [B, facts], facts in the order of the text
    (`document.asked` is the asked one's index). A row sums to at most 1; the rest is elsewhere."""
    if over not in ("key", "value"):
        raise ValueError(f"over={over!r}: use 'key' or 'value'")
    out = np.zeros((len(documents), len(documents[0].facts)))
    for n, at in by_length(documents):
        tokens = jnp.asarray(np.stack([documents[i].prompt for i in at]))
        weights = np.asarray(_attention(params, cfg, tokens, None)[layer, :, head, n - 1])  # [B, n]
        for row, i in enumerate(at):
            for f, fact in enumerate(documents[i].facts):
                start, width = (fact.key_start, KEY_LENGTH) if over == "key" else (fact.value_start, len(fact.value))
                out[i, f] = weights[row, start: start + width].sum()
    return out


# --- Ablation (the experiment: analysis/ablation.py) ----------------------------------------------


def ablation_mask(cfg: ModelConfig, heads: list[tuple[int, int]]) -> Array:
    """A head mask [L, H] for `edits.ablate_heads`: 1 everywhere except 0 at the given (layer, head) pairs."""
    mask = np.ones((cfg.num_layers, cfg.num_heads), np.float32)
    for layer, head in heads:
        mask[layer, head] = 0.0
    return jnp.asarray(mask)


# --- The training loop's evaluation metric -------------------------------------------------------


def rows_exact(logits: Array, targets: Array) -> Array:
    """Whether every graded target of a row is the argmax of its logits: logits [B, T, V], targets
    [B, T] (IGNORED where not graded) -> bool [B]; False for a row with nothing graded. On needle
    rows grading the answer this is `teacher_forced`'s exact match."""
    graded = targets != IGNORED
    right = (jnp.argmax(logits, axis=-1) == targets) | ~graded
    return jnp.all(right, axis=-1) & jnp.any(graded, axis=-1)


def exact_match_counts(cfg: ModelConfig, inputs: Array):
    """The loop's measure: (params, inputs [B, T], targets [B, T]) -> {right, rows}: the rows whose
    graded targets are all the argmax (`rows_exact`), and the rows."""

    def count(params: dict, inputs: Array, targets: Array) -> dict[str, Array]:
        logits, _ = run(params, cfg, inputs, [])
        return {"right": jnp.sum(rows_exact(logits, targets)), "rows": jnp.asarray(inputs.shape[0])}

    return count


def exact_match_report(cfg: ModelConfig, counts: list[dict]) -> dict[str, float]:
    """{val_exact_match}: the fraction of validation rows exactly right, over every validation batch."""
    return {"val_exact_match": sum(int(c["right"]) for c in counts) / sum(int(c["rows"]) for c in counts)}


EXACT_MATCH = EvalMetric("exact_match", exact_match_counts, exact_match_report)
