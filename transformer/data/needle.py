"""The needle-in-a-haystack task: one fact hidden in filler text, and a question about it at the end.

A document of length n (tokens of the prompt, question included) is

    filler ... " The code of Kelav is 48213. " ... filler "\\nWhat is the code of Kelav? "   -> "48213"
    |<------------ haystack: n - len(question) tokens ------------>|<---- question ---->|   answer

The key (a made-up name such as "Kelav") and the value (`digits` random digits) are drawn per
document, so the answer cannot be guessed: it has to be read from the needle. The filler is a
contiguous window of a token stream (the corpus, `token_cache.load_corpus`), cut in two by the
needle. The needle starts at round(depth * (haystack - len(needle))): depth 0 puts it first, depth 1
right before the question.

Tokens are bytes (the run's tokenizer must be 'bytes'): a document's length in tokens is its length
in bytes, the needle sits at an exact token position whatever the text around it, and the value's
tokens in the needle are the answer's tokens (a BPE would merge digits with their neighbours
differently in the needle and after the question).

Training batches (`batch_at`) are (inputs, targets) int32 [B, T] like `batches.batch_at`: one
document per row, its length and depth drawn uniformly from the task's ranges, right-padded (padding
targets are `batches.IGNORED`, which the loss leaves out). `graded` says which other targets count:
'answer' grades only the value's digits (the loss is then the answer's cross-entropy, ln 10 = 2.30
per digit for a guess), 'all' every byte of the document, filler included. configs/needle.py grades
the answer only: the filler's next-byte loss would dominate the loss (~100 filler bytes per 5 answer
bytes), and in a comparison on this task (README, "Retrieval heads") grading every byte left the
answer's digits at chance for longer.
Batch `step` depends only on (seed, step), so a resumed run sees the batches an unbroken run would.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from transformer.data.batches import IGNORED, _host_rows
from transformer.data.tasks import DataTask, register_task

NEEDLE = " The code of {key} is {value}. "
QUESTION = "\nWhat is the code of {key}? "
KEY_LENGTH = 5  # consonant-vowel-consonant-vowel-consonant, capitalised: "Kelav", "Morup"
CONSONANTS = "bcdfghjklmnprstvz"
VOWELS = "aeiou"
EVAL_SEED = 1_000_003  # validation documents draw from (EVAL_SEED, batch index): never a training step's


@dataclass(frozen=True)
class NeedleTask:
    """The documents a run trains on: prompt lengths in [min_length, max_length], needle depths in
    [min_depth, max_depth] (both uniform), values of `digits` digits. `config.data.needle`."""

    min_length: int = 64
    max_length: int = 256
    min_depth: float = 0.0
    max_depth: float = 1.0
    digits: int = 5
    graded: str = "answer"  # 'answer': only the answer's tokens are graded; 'all': every token of the document

    def __post_init__(self) -> None:
        if self.digits < 1:
            raise ValueError(f"data.needle.digits={self.digits} must be at least 1")
        if self.min_length < shortest_prompt(self.digits):
            raise ValueError(f"data.needle.min_length={self.min_length} is below {shortest_prompt(self.digits)}, "
                             "the needle and the question alone; raise it")
        if self.max_length < self.min_length:
            raise ValueError(f"data.needle.max_length={self.max_length} is below min_length={self.min_length}")
        if self.graded not in ("answer", "all"):
            raise ValueError(f"data.needle.graded={self.graded!r} is not known; use 'answer' or 'all'")
        if not 0.0 <= self.min_depth <= self.max_depth <= 1.0:
            raise ValueError(f"data.needle depths [{self.min_depth}, {self.max_depth}] must satisfy "
                             "0 <= min_depth <= max_depth <= 1")

    @classmethod
    def from_config(cls, needle: Any) -> NeedleTask:
        """From a config's data.needle section (a ConfigDict or a dict)."""
        return cls(**{k: needle[k] for k in ("min_length", "max_length", "min_depth", "max_depth", "digits", "graded")})

    def check(self, seq_len: int, tokenizer: str = "bytes") -> None:
        """Raises unless a batch of seq_len tokens holds the longest document and its answer, in bytes."""
        if tokenizer != "bytes":
            raise ValueError(f"data.task='needle' needs data.tokenizer='bytes' (got {tokenizer!r}): the needle "
                             "is placed and graded in byte tokens")
        if seq_len < self.row_length(self.max_length) - 1:
            raise ValueError(f"train.seq_len={seq_len} cannot hold a document of data.needle.max_length="
                             f"{self.max_length} and its {self.digits}-digit answer; set train.seq_len >= "
                             f"{self.row_length(self.max_length) - 1} or lower max_length")

    def row_length(self, length: int) -> int:
        """Tokens of a document of prompt length `length` with its answer."""
        return length + self.digits


def shortest_prompt(digits: int) -> int:
    """The shortest prompt: the needle and the question with no filler."""
    key = "K" * KEY_LENGTH
    return len(NEEDLE.format(key=key, value="0" * digits)) + len(QUESTION.format(key=key))


@dataclass(frozen=True)
class Document:
    """One document. prompt: int32 [n], the haystack with its needle, then the question; answer: int32
    [digits], the value. needle_start: index of the needle's first token in prompt; value_start: index
    of the value's first token, so prompt[value_start : value_start + digits] == answer."""

    prompt: np.ndarray
    answer: np.ndarray
    needle_start: int
    value_start: int


def _bytes(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("ascii"), dtype=np.uint8).astype(np.int32)


def random_key(rng: np.random.Generator) -> str:
    """A made-up name of KEY_LENGTH letters, alternating consonants and vowels: "Kelav"."""
    return "".join(rng.choice(list(CONSONANTS if i % 2 == 0 else VOWELS)) for i in range(KEY_LENGTH)).capitalize()


def make_document(filler: np.ndarray, rng: np.random.Generator, length: int, depth: float, digits: int = 5
                  ) -> Document:
    """A document of prompt length `length` with its needle at relative `depth` in [0, 1].

    filler: the token stream [N] (bytes) the haystack is cut from, at an offset drawn from `rng`,
    which also draws the key and the value.
    """
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth={depth} must be in [0, 1] (0: the needle first, 1: right before the question)")
    if length < shortest_prompt(digits):
        raise ValueError(f"length={length} is below {shortest_prompt(digits)}, the needle and the question alone")
    key = random_key(rng)
    value = "".join(str(d) for d in rng.integers(0, 10, size=digits))
    needle, question = _bytes(NEEDLE.format(key=key, value=value)), _bytes(QUESTION.format(key=key))
    haystack = length - len(question)
    fill = haystack - len(needle)
    if len(filler) < fill:
        raise ValueError(f"the filler stream has {len(filler)} tokens, fewer than the {fill} a document of "
                         f"length {length} needs; use more text or shorter documents")
    offset = int(rng.integers(0, len(filler) - fill, endpoint=True))
    text = np.asarray(filler[offset: offset + fill], dtype=np.int32)
    start = int(round(depth * fill))
    prompt = np.concatenate([text[:start], needle, text[start:], question])
    value_start = start + len(NEEDLE.split("{value}")[0].format(key=key))
    return Document(prompt=prompt, answer=_bytes(value), needle_start=start, value_start=value_start)


def _row(doc: Document, seq_len: int, graded: str) -> tuple[np.ndarray, np.ndarray]:
    """A document as one training row: (inputs, targets) int32 [seq_len], the padding IGNORED and,
    unless graded == 'all', every target but the answer's."""
    tokens = np.concatenate([doc.prompt, doc.answer])
    inputs = np.zeros(seq_len, np.int32)
    targets = np.full(seq_len, IGNORED, np.int32)
    inputs[: len(tokens) - 1] = tokens[:-1]
    if graded == "all":
        targets[: len(tokens) - 1] = tokens[1:]
    n = len(doc.prompt)  # targets[t] follows inputs[t]: the answer follows positions n-1 .. n+digits-2
    targets[n - 1: n - 1 + len(doc.answer)] = doc.answer
    return inputs, targets


def _rows(filler: np.ndarray, seeds: list[list[int]], task: NeedleTask, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """One document per seed, each drawing its length, depth, key, value and filler from its own generator."""
    rows = []
    for seed in seeds:
        rng = np.random.default_rng(seed)
        length = int(rng.integers(task.min_length, task.max_length, endpoint=True))
        depth = float(rng.uniform(task.min_depth, task.max_depth))
        rows.append(_row(make_document(filler, rng, length, depth, task.digits), seq_len, task.graded))
    inputs, targets = zip(*rows)
    return np.stack(inputs), np.stack(targets)


def batch_at(tokens: np.ndarray, *, seed: int, step: int, batch_size: int, seq_len: int, task: NeedleTask,
             host_index: int = 0, host_count: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Training batch `step`: one document per row, drawn from (seed, step, row) only; filler from
    `tokens` [N]. Returns (inputs, targets) int32 [batch_size // host_count, seq_len]; targets are
    IGNORED except at the answer's tokens."""
    task.check(seq_len)
    rows = range(batch_size)[_host_rows(batch_size, host_index, host_count)]
    return _rows(tokens, [[seed, step, b] for b in rows], task, seq_len)


def eval_batches(tokens: np.ndarray, *, num_batches: int, batch_size: int, seq_len: int, task: NeedleTask,
                 host_index: int = 0, host_count: int = 1) -> list[tuple[np.ndarray, np.ndarray]]:
    """Fixed validation batches of documents, filler from `tokens` [N] (the validation split), as
    `batches.eval_batches` returns them: `num_batches` (inputs, targets) pairs."""
    task.check(seq_len)
    rows = range(batch_size)[_host_rows(batch_size, host_index, host_count)]
    return [_rows(tokens, [[EVAL_SEED, i, b] for b in rows], task, seq_len) for i in range(num_batches)]


def document_grid(filler: np.ndarray, lengths: list[int], depths: list[float], per_cell: int, seed: int = 0,
                  digits: int = 5) -> list[list[list[Document]]]:
    """`per_cell` documents for each (length, depth) cell: grid[i][j][k] has prompt length lengths[i]
    and depth depths[j]; document k of a cell draws from (seed, i, j, k)."""
    return [[[make_document(filler, np.random.default_rng([seed, i, j, k]), n, d, digits) for k in range(per_cell)]
             for j, d in enumerate(depths)] for i, n in enumerate(lengths)]


def needle_task(config: Any) -> DataTask:
    """data.task='needle': the documents of config.data.needle, checked against train.seq_len and
    data.tokenizer."""
    task = NeedleTask.from_config(config.data.needle)
    task.check(config.train.seq_len, config.data.tokenizer)
    return DataTask(functools.partial(batch_at, task=task), functools.partial(eval_batches, task=task))


register_task("needle", needle_task)
