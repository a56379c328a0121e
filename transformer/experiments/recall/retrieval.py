"""Retrieval on the needle task: exact-match accuracy over lengths x depths, and the heads that
retrieve, found by where they look (the retrieval score) and by what they cause (activation patching).

    grid = needle.document_grid(filler, lengths, depths, per_cell, facts=4)  # grid[i][j]: documents
    accuracy_grid(params, cfg, grid, head_mask)               # float [lengths, depths], greedy decoding
    teacher_forced_grid(params, cfg, grid, masks)             # float [M, lengths, depths], one compile
    retrieval_scores(params, cfg, documents)                  # [L, H], Wu et al. 2024
    causal_scores(params, cfg, documents).normalised()        # [L, H], patching
    lookup_weights(params, cfg, documents, layer, head)       # [B, facts]
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from transformer.analysis.capture import attention_maps
from transformer.analysis.patching import Patching, patch_heads, run_cells
from transformer.data.batches import IGNORED
from transformer.experiments.recall.needle import KEY_LENGTH, Document, ask
from transformer.model.config import ModelConfig
from transformer.model.edits import ablate_heads, run
from transformer.sampling.sampler import generate
from transformer.training.eval_metrics import EvalMetric

Array = jax.Array


def _edits(cfg: ModelConfig, head_mask: Array | None) -> list:
    return [] if head_mask is None else [ablate_heads(cfg, head_mask)]


def _values(documents: list[Document]) -> np.ndarray:
    return np.stack([d.answer for d in documents])  # [B, digits]


def answers(params: dict, cfg: ModelConfig, documents: list[Document], head_mask: Array | None = None) -> np.ndarray:
    """The model's greedy answers to `documents` (one `generate` call): int32 [B, digits]."""
    prompts, digits = [d.prompt for d in documents], len(documents[0].answer)
    return generate(params, cfg, prompts, jax.random.key(0), digits, _edits(cfg, head_mask), temperature=0.0).tokens


def accuracy_grid(params: dict, cfg: ModelConfig, grid: list[list[list[Document]]],
                  head_mask: Array | None = None) -> np.ndarray:
    """Exact-match accuracy of greedy decoding in each cell of `grid` (document_grid): float [lengths, depths]."""
    return np.array([[np.mean(np.all(answers(params, cfg, cell, head_mask) == _values(cell), axis=1)) for cell in row]
                     for row in grid])


def teacher_forced(params: dict, cfg: ModelConfig, documents: list[Document], head_mask: Array | None = None
                   ) -> np.ndarray:
    """Whether greedy decoding answers each document exactly, read in one forward pass: bool [B]. With
    the value fed back, every answer step's argmax is right iff greedy decoding walks the same prefixes."""
    mask = np.ones((cfg.num_layers, cfg.num_heads), np.float32) if head_mask is None else np.asarray(head_mask)
    return _exact(params, cfg, documents, mask[None])[0]


def _exact(params: dict, cfg: ModelConfig, documents: list[Document], head_masks: np.ndarray) -> np.ndarray:
    """`teacher_forced` under each of head_masks [M, L, H]: bool [M, B], every mask through one compile."""
    n, digits = len(documents[0].prompt), len(documents[0].answer)
    if any(len(d.prompt) != n for d in documents):
        raise ValueError("teacher_forced reads documents of one prompt length in one batch; group them by length "
                         "(document_grid's cells are)")
    tokens = jnp.asarray(np.stack([np.concatenate([d.prompt, d.answer[:-1]]) for d in documents]))  # [B, n + A - 1]
    top = _answer_argmax(params, cfg, tokens, jnp.asarray(head_masks, jnp.float32), n, digits)  # [M, B, A]
    return np.all(np.asarray(top) == _values(documents), axis=-1)


@functools.partial(jax.jit, static_argnames=("cfg", "n", "digits"))
def _answer_argmax(params: dict, cfg: ModelConfig, tokens: Array, head_masks: Array, n: int, digits: int) -> Array:
    """The argmax tokens at the answer steps (positions n - 1 .. n + digits - 2) under each mask: [M, B, digits]."""
    return run_cells(params, cfg, tokens, head_masks, lambda mask: [ablate_heads(cfg, mask)],
                     lambda logits: jnp.argmax(logits[:, n - 1: n - 1 + digits], axis=-1))


def teacher_forced_grid(params: dict, cfg: ModelConfig, grid: list[list[list[Document]]],
                        head_masks: Array | np.ndarray | None = None) -> np.ndarray:
    """`accuracy_grid` under each of head_masks [M, L, H] (None: the intact model, M = 1), read by
    `teacher_forced`: float [M, lengths, depths]. One forward pass per length serves every mask."""
    masks = np.ones((1, cfg.num_layers, cfg.num_heads), np.float32) if head_masks is None else np.asarray(head_masks)
    if masks.ndim != 3 or masks.shape[1:] != (cfg.num_layers, cfg.num_heads):
        raise ValueError(f"head_masks has shape {masks.shape}; give [M, {cfg.num_layers}, {cfg.num_heads}] "
                         "(one [L, H] mask per row: retrieval.ablation_mask)")
    out = np.zeros((len(masks), len(grid), len(grid[0])))
    for i, row in enumerate(grid):
        right = _exact(params, cfg, [d for cell in row for d in cell], masks)  # [M, cells x documents]
        cells = np.split(right, np.cumsum([len(cell) for cell in row])[:-1], axis=1)
        out[:, i] = np.stack([cell.mean(axis=1) for cell in cells], axis=1)
    return out


# --- The retrieval score ------------------------------------------------------------------------


def score_from_attention(attention: Array, value_positions: np.ndarray, copied: np.ndarray,
                         per_step: bool = False) -> np.ndarray:
    """Hits / counted steps [L, H] (per_step: [L, H, A]) from attention [L, B, H, A, S] of A answer steps,
    value_positions int [B, A] (the key of the digit step a copies) and copied bool [B, A] (the steps counted)."""
    top = np.asarray(jnp.argmax(attention, axis=-1))  # [L, B, H, A]
    hits = (top == value_positions[None, :, None, :]) & copied[None, :, None, :]  # [L, B, H, A]
    return _share(hits.sum(axis=1), copied.sum(axis=0), per_step)


def _share(hits: np.ndarray, counted: np.ndarray, per_step: bool) -> np.ndarray:
    """hits [L, H, A] / counted steps [A]: per answer step [L, H, A], or over all steps [L, H]."""
    return hits / np.maximum(counted, 1) if per_step else hits.sum(axis=-1) / max(counted.sum(), 1)


def retrieval_scores(params: dict, cfg: ModelConfig, documents: list[Document], batch_size: int = 32,
                     head_mask: Array | None = None, per_step: bool = False) -> np.ndarray:
    """Each head's retrieval score (Wu et al. 2024): over the answer steps i where the model's greedy token
    is the value's digit i, the share where its argmax key is that digit in the needle (not a repeat of
    it elsewhere, as Wu et al. allow): float [L, H] (per_step: [L, H, A])."""
    digits = len(documents[0].answer)
    hits, counted = np.zeros((cfg.num_layers, cfg.num_heads, digits)), np.zeros(digits)
    for n, at in by_length(documents, batch_size):
        batch = [documents[i] for i in at]
        got = answers(params, cfg, batch, head_mask)  # [B, A]
        tokens = np.concatenate([np.stack([d.prompt for d in batch]), got[:, :-1]], axis=1)  # [B, n + A - 1]
        steps = _attention(params, cfg, jnp.asarray(tokens), _edits(cfg, head_mask))[:, :, :, n - 1: n - 1 + digits]
        value_positions = np.array([[d.value_start + i for i in range(digits)] for d in batch])  # [B, A]
        copied = got == _values(batch)
        hits += score_from_attention(steps, value_positions, copied, per_step=True) * copied.sum(axis=0)
        counted += copied.sum(axis=0)
    return _share(hits, counted, per_step)


_attention = jax.jit(attention_maps, static_argnames=("cfg", "scores"))  # (params, cfg, tokens [B, T], edits)


def by_length(documents: list[Document], batch_size: int | None = None) -> list[tuple[int, list[int]]]:
    """[(n, indices)]: the documents of each prompt length n (one batch shape), shortest first, batch_size at a time."""
    lengths = [len(d.prompt) for d in documents]
    groups = [(n, [i for i, m in enumerate(lengths) if m == n]) for n in sorted(set(lengths))]
    return [(n, at[start: start + (batch_size or len(at))]) for n, at in groups
            for start in range(0, len(at), batch_size or len(at))]


# --- The causal score: patching each head from the document asking another fact -----------------


def value_log_prob(logits: Array, values: Array, n: int) -> Array:
    """log p(values [B, A]) after a prompt of n tokens, teacher forced: logits [B, n + A - 1, V] -> [B]."""
    steps = jax.nn.log_softmax(logits[:, n - 1: n - 1 + values.shape[1]].astype(jnp.float32), axis=-1)
    return jnp.take_along_axis(steps, values[..., None], axis=-1)[..., 0].sum(axis=-1)


def recall_metric(asked: Array, other: Array, n: int):
    """logits [2B, n + A - 1, V] (rows :B followed by the asked values `asked` [B, A], rows B: by `other`)
    -> the mean over documents of log p(asked value) - log p(other value)."""
    b = asked.shape[0]
    return lambda logits: (value_log_prob(logits[:b], asked, n) - value_log_prob(logits[b:], other, n)).mean()


def patching_pair(documents: list[Document], other: list[int]) -> tuple[Array, Array, Array, Array]:
    """(as_asked, as_other, asked_values [B, A], other_values [B, A]) for documents of one prompt length n,
    as asked and asking fact other[b] instead (`needle.ask`). Each input is [2B, n + A - 1]: every prompt
    followed by the asked value, then by the other value, so the two differ only in the question's key."""
    if len({len(d.prompt) for d in documents}) != 1:
        raise ValueError("patching_pair takes documents of one prompt length; group them by length")
    if any(o == d.asked or not 0 <= o < len(d.facts) for d, o in zip(documents, other)):
        raise ValueError("each document's other fact must be one of its facts, not the asked one: the causal "
                         "score needs documents with facts >= 2")
    swapped = [ask(d, o) for d, o in zip(documents, other)]
    asked_values, other_values = _values(documents), _values(swapped)

    def rows(docs: list[Document]) -> Array:
        prompts = np.stack([d.prompt for d in docs])
        return jnp.asarray(np.concatenate([np.concatenate([prompts, values[:, :-1]], axis=1)
                                           for values in (asked_values, other_values)]))

    return rows(documents), rows(swapped), jnp.asarray(asked_values), jnp.asarray(other_values)


def causal_scores(params: dict, cfg: ModelConfig, documents: list[Document], other: list[int] | None = None,
                  batch_size: int = 16) -> Patching:
    """Each head's share in choosing the asked value: the document as asked run with head (l, h)'s z from
    the one asking fact other[i] (default: the next), metric `recall_metric`: grid [L, H]. `clean`: the
    metric asking the other fact; `normalised()`: 1 where the head alone carries the question's key."""
    other = [(d.asked + 1) % len(d.facts) for d in documents] if other is None else list(other)
    parts, sizes = [], []
    for n, at in by_length(documents, batch_size):
        parts.append(_patch_heads(params, cfg, *patching_pair([documents[i] for i in at], [other[i] for i in at]), n))
        sizes.append(len(at))
    return jax.tree.map(lambda *got: np.asarray(sum(g * s for g, s in zip(got, sizes))) / sum(sizes), *parts)


@functools.partial(jax.jit, static_argnames=("cfg", "n"))
def _patch_heads(params: dict, cfg: ModelConfig, as_asked: Array, as_other: Array, asked: Array, other: Array,
                 n: int) -> Patching:
    return patch_heads(params, cfg, as_other, as_asked, recall_metric(asked, other, n))


# --- The soft look-up -----------------------------------------------------------------------------


def lookup_weights(params: dict, cfg: ModelConfig, documents: list[Document], layer: int, head: int,
                   over: str = "key") -> np.ndarray:
    """The soft dictionary look-up of one head: its weight from the prompt's last position on each fact's
    key (or value) tokens, summed: float [B, facts] in the order of the text."""
    if over not in ("key", "value"):
        raise ValueError(f"over={over!r}: use 'key' or 'value'")
    out = np.zeros((len(documents), len(documents[0].facts)))
    for n, at in by_length(documents):
        tokens = jnp.asarray(np.stack([documents[i].prompt for i in at]))
        weights = np.asarray(_attention(params, cfg, tokens)[layer, :, head, n - 1])  # [B, n]
        for row, i in enumerate(at):
            for f, fact in enumerate(documents[i].facts):
                start, width = (fact.key_start, KEY_LENGTH) if over == "key" else (fact.value_start, len(fact.value))
                out[i, f] = weights[row, start: start + width].sum()
    return out


def ablation_mask(cfg: ModelConfig, heads: list[tuple[int, int]]) -> Array:
    """A head mask [L, H] for `edits.ablate_heads`: 1 everywhere except 0 at the given (layer, head) pairs."""
    mask = np.ones((cfg.num_layers, cfg.num_heads), np.float32)
    for layer, head in heads:
        mask[layer, head] = 0.0
    return jnp.asarray(mask)


# --- The training loop's evaluation metric: val_exact_match -------------------------------------


def rows_exact(logits: Array, targets: Array) -> Array:
    """Whether every graded target of a row is the argmax: logits [B, T, V], targets [B, T] (IGNORED
    where not graded) -> bool [B], False for a row with nothing graded (`teacher_forced` on needle rows)."""
    graded = targets != IGNORED
    right = (jnp.argmax(logits, axis=-1) == targets) | ~graded
    return jnp.all(right, axis=-1) & jnp.any(graded, axis=-1)


def exact_match_counts(cfg: ModelConfig, inputs: Array):
    """(params, inputs [B, T], targets [B, T]) -> {right: rows exactly right, rows}."""
    def count(params: dict, inputs: Array, targets: Array) -> dict[str, Array]:
        logits, _ = run(params, cfg, inputs, [])
        return {"right": jnp.sum(rows_exact(logits, targets)), "rows": jnp.asarray(inputs.shape[0])}

    return count


def exact_match_report(cfg: ModelConfig, counts: list[dict]) -> dict[str, float]:
    return {"val_exact_match": sum(int(c["right"]) for c in counts) / sum(int(c["rows"]) for c in counts)}


EXACT_MATCH = EvalMetric("exact_match", exact_match_counts, exact_match_report)
