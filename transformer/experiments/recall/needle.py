"""The needle-in-a-haystack task: facts hidden in filler text, and a question about one of them at the end.

A document of length n (tokens of the prompt, question included) with one fact (facts=1) is

    filler ... " The code of Kelav is 48213. " ... filler "\nWhat is the code of Kelav? "   -> "48213"
    |<------------ haystack: n - len(question) tokens ------------>|<---- question ---->|   answer

The key (a made-up name such as "Kelav") and the value (`digits` random digits) are drawn per
document, so the answer cannot be guessed: it has to be read from the needle. The filler is a
contiguous window of a token stream (the corpus, `token_stream.load_corpus`), cut by the needles.
The asked needle starts at round(depth * (haystack - len(needles))): depth 0 puts it first, depth 1
right before the question (with the other facts' needles, if any, in between).

Associative recall (facts=N > 1): N facts with distinct keys and their own values, the asked one at
`depth` and the others at uniformly drawn places; the question names one key. With one fact a model
can answer by copying the only number in the document, without reading the key; with N it must match
the key, and a model that copies any fact's value scores about 1/N (`copy_any_value_accuracy`, the
chance line). `ask(document, i)` is the same document asking fact i instead: the corrupted input of
activation patching.

Tokens are bytes (data.tokenizer='bytes'), so the value's tokens in the needle are the answer's
tokens (a BPE would merge digits with their neighbours differently in the two places).

More questions per training row (questions=Q > 1): after the answer, Q - 1 more questions follow,
each naming a fact drawn uniformly from the document (repeats allowed, so no answer follows by
elimination) and followed by its value, graded like the first; Q times the graded answers per row for
the cost of Q - 1 questions' bytes (associative recall with several queries, as Zoology's MQAR). The
validation documents, and every analysis, ask one question.

Training batches (`batch_at`) are (inputs, targets) int32 [B, T] like `batches.batch_at`, from
(seed, step) alone: one document per row, its length and depth drawn from the task's ranges,
right-padded with IGNORED targets. `graded`: 'answer' grades only the value's digits (ln 10 = 2.30
nats per digit for a guess), 'all' every byte, filler included, whose next-byte loss would dominate
(~100 filler bytes per 5 answer bytes).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from transformer.data.batches import IGNORED, host_rows
from transformer.data.tasks import DataTask

NEEDLE = " The code of {key} is {value}. "
QUESTION = "\nWhat is the code of {key}? "
# How the document asks: data.needle.question names one. 'question' asks in words; 'cloze' repeats the
# needle's own words up to the value, so the answer follows the same context as in the needle (the
# shape an induction head completes; associative recall in the form of Zoology's MQAR).
QUESTIONS = {"question": QUESTION, "cloze": "\nThe code of {key} is "}
KEY_LENGTH = 5  # consonant-vowel-consonant-vowel-consonant, capitalised: "Kelav", "Morup"
CONSONANTS = "bcdfghjklmnprstvz"
VOWELS = "aeiou"
EVAL_SEED = 1_000_003  # validation documents draw from (EVAL_SEED, batch index): never a training step's
MAX_FACTS = 64  # distinct keys are drawn by rejection from 17 * 5 * 17 * 5 * 17 names: far more than this


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
    facts: int = 1  # facts per document (distinct keys); the question asks one
    question: str = "question"  # how the document asks: a key of QUESTIONS
    questions: int = 1  # questions per training row (the validation rows ask one)

    def __post_init__(self) -> None:
        if self.question not in QUESTIONS:
            raise ValueError(f"data.needle.question={self.question!r} is not known; use one of {sorted(QUESTIONS)}")
        if self.digits < 1:
            raise ValueError(f"data.needle.digits={self.digits} must be at least 1")
        if self.questions < 1:
            raise ValueError(f"data.needle.questions={self.questions} must be at least 1 (questions per training row)")
        if not 1 <= self.facts <= MAX_FACTS:
            raise ValueError(f"data.needle.facts={self.facts} must be in [1, {MAX_FACTS}]")
        shortest = shortest_prompt(self.digits, self.facts, self.question)
        if self.min_length < shortest:
            raise ValueError(f"data.needle.min_length={self.min_length} is below {shortest}, "
                             f"{_needles(self.facts)} and the question alone; raise it")
        if self.max_length < self.min_length:
            raise ValueError(f"data.needle.max_length={self.max_length} is below min_length={self.min_length}")
        if self.graded not in ("answer", "all"):
            raise ValueError(f"data.needle.graded={self.graded!r} is not known; use 'answer' or 'all'")
        if not 0.0 <= self.min_depth <= self.max_depth <= 1.0:
            raise ValueError(f"data.needle depths [{self.min_depth}, {self.max_depth}] must satisfy "
                             "0 <= min_depth <= max_depth <= 1")

    @classmethod
    def from_config(cls, needle: Any) -> NeedleTask:
        """From a config's data.needle section (a ConfigDict or a dict; one saved before `facts` existed
        has one fact, asked in words)."""
        fields = {k: needle[k] for k in ("min_length", "max_length", "min_depth", "max_depth", "digits", "graded")}
        return cls(**fields, facts=int(needle.get("facts", 1)), question=str(needle.get("question", "question")),
                   questions=int(needle.get("questions", 1)))

    def check(self, seq_len: int, tokenizer: str = "bytes") -> None:
        """Raises unless a batch of seq_len tokens holds the longest training row (`row_length`), in bytes."""
        if tokenizer != "bytes":
            raise ValueError(f"data.task='needle' needs data.tokenizer='bytes' (got {tokenizer!r}): the needle "
                             "is placed and graded in byte tokens")
        if seq_len < self.row_length(self.max_length) - 1:
            more = "" if self.questions == 1 else f" and {self.questions - 1} more questions with theirs"
            raise ValueError(f"train.seq_len={seq_len} cannot hold a document of data.needle.max_length="
                             f"{self.max_length} and its {self.digits}-digit answer{more}; set train.seq_len >= "
                             f"{self.row_length(self.max_length) - 1} or lower max_length")

    def row_length(self, length: int) -> int:
        """Tokens of a training row whose document has prompt length `length`: the prompt, its answer
        and the further questions with theirs."""
        asking = len(QUESTIONS[self.question].format(key="K" * KEY_LENGTH))
        return length + self.digits + (self.questions - 1) * (asking + self.digits)


def shortest_prompt(digits: int, facts: int = 1, question: str = "question") -> int:
    """The shortest prompt: the needles and the question with no filler."""
    key = "K" * KEY_LENGTH
    return facts * len(NEEDLE.format(key=key, value="0" * digits)) + len(QUESTIONS[question].format(key=key))


@dataclass(frozen=True)
class Fact:
    """One fact of a document: its key, its value (int32 [digits]), the index of its needle's first
    token in the prompt (`start`), of its key's (`key_start`) and of its value's first token
    (`value_start`)."""

    key: str
    value: np.ndarray
    start: int
    value_start: int

    @property
    def key_start(self) -> int:
        """The index of the key's first token in the prompt (KEY_LENGTH tokens from there)."""
        return self.start + len(NEEDLE.split("{key}")[0])


@dataclass(frozen=True)
class Document:
    """One document. prompt: int32 [n], the haystack with its needles, then the question; answer: int32
    [digits], the asked fact's value. needle_start: index of the asked needle's first token in prompt;
    value_start: index of its value's first token, so prompt[value_start : value_start + digits] ==
    answer. facts: every fact in the order of the text; asked: the index of the asked one there;
    question: how it asks (a key of QUESTIONS)."""

    prompt: np.ndarray
    answer: np.ndarray
    needle_start: int
    value_start: int
    facts: tuple[Fact, ...] = ()
    asked: int = 0
    question: str = "question"


def _needles(facts: int) -> str:
    return "the needle" if facts == 1 else f"the {facts} needles"


def _bytes(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("ascii"), dtype=np.uint8).astype(np.int32)


def random_key(rng: np.random.Generator) -> str:
    """A made-up name of KEY_LENGTH letters, alternating consonants and vowels: "Kelav"."""
    return "".join(rng.choice(list(CONSONANTS if i % 2 == 0 else VOWELS)) for i in range(KEY_LENGTH)).capitalize()


def make_document(filler: np.ndarray, rng: np.random.Generator, length: int, depth: float, digits: int = 5,
                  facts: int = 1, question: str = "question") -> Document:
    """A document of prompt length `length` with `facts` facts, the asked one at relative `depth` in
    [0, 1] (the others at places drawn uniformly).

    filler: the token stream [N] (bytes) the haystack is cut from, at an offset drawn from `rng`,
    which also draws the keys, the values and the other facts' places. question: how the document
    asks (QUESTIONS; the draws do not depend on it).
    """
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth={depth} must be in [0, 1] (0: the needle first, 1: right before the question)")
    if question not in QUESTIONS:
        raise ValueError(f"question={question!r} is not known; use one of {sorted(QUESTIONS)}")
    if length < shortest_prompt(digits, facts, question):
        raise ValueError(f"length={length} is below {shortest_prompt(digits, facts, question)}, {_needles(facts)} and "
                         "the question alone")
    keys = [random_key(rng)]
    values = ["".join(str(d) for d in rng.integers(0, 10, size=digits))]
    asking = _bytes(QUESTIONS[question].format(key=keys[0]))
    needle_length = len(NEEDLE.format(key=keys[0], value=values[0]))  # the same for every key and value
    haystack = length - len(asking)
    fill = haystack - facts * needle_length
    if len(filler) < fill:
        raise ValueError(f"the filler stream has {len(filler)} tokens, fewer than the {fill} a document of "
                         f"length {length} needs; use more text or shorter documents")
    offset = int(rng.integers(0, len(filler) - fill, endpoint=True))
    text = np.asarray(filler[offset: offset + fill], dtype=np.int32)
    places = [int(round(depth * fill))]  # where each needle goes into the filler, the asked one first
    while len(keys) < facts:  # the other facts, drawn after what a one-fact document draws
        key = random_key(rng)
        if key in keys:
            continue
        keys.append(key)
        values.append("".join(str(d) for d in rng.integers(0, 10, size=digits)))
        places.append(int(rng.integers(0, fill, endpoint=True)))

    order = sorted(range(facts), key=lambda i: (places[i], i))  # the needles in the order of the text
    parts, made, cut = [], [], 0
    for i in order:
        parts.append(text[cut: places[i]])
        cut = places[i]
        start = sum(len(p) for p in parts)
        needle = _bytes(NEEDLE.format(key=keys[i], value=values[i]))
        parts.append(needle)
        made.append(Fact(keys[i], _bytes(values[i]), start, start + len(NEEDLE.split("{value}")[0].format(key=keys[i]))))
    parts += [text[cut:], asking]
    asked = order.index(0)
    return Document(prompt=np.concatenate(parts), answer=made[asked].value, needle_start=made[asked].start,
                    value_start=made[asked].value_start, facts=tuple(made), asked=asked, question=question)


def ask(document: Document, i: int) -> Document:
    """The same document with its question naming fact i (in the order of the text) instead: the same
    length, a different answer."""
    fact = document.facts[i]
    asking = _bytes(QUESTIONS[document.question].format(key=fact.key))
    prompt = np.concatenate([document.prompt[: len(document.prompt) - len(asking)], asking])
    return Document(prompt=prompt, answer=fact.value, needle_start=fact.start, value_start=fact.value_start,
                    facts=document.facts, asked=i, question=document.question)


def copy_any_value_accuracy(documents: list[Document]) -> float:
    """The chance line of recall: the expected exact-match accuracy of a model that answers with the
    value of a fact drawn uniformly from its document (1 / facts when the values differ)."""
    return float(np.mean([np.mean([np.array_equal(f.value, d.answer) for f in d.facts]) for d in documents]))


def _row(doc: Document, seq_len: int, graded: str, more: list[int] = ()) -> tuple[np.ndarray, np.ndarray]:
    """A document as one training row: (inputs, targets) int32 [seq_len], the padding IGNORED and,
    unless graded == 'all', every target but the answers'. more: the facts (indices in doc.facts) that
    further questions ask after the answer, each followed by its value."""
    parts, answers = [doc.prompt, doc.answer], [(len(doc.prompt), doc.answer)]
    for i in more:
        fact = doc.facts[i]
        parts.append(_bytes(QUESTIONS[doc.question].format(key=fact.key)))
        answers.append((sum(len(p) for p in parts), fact.value))
        parts.append(fact.value)
    tokens = np.concatenate(parts)
    inputs = np.zeros(seq_len, np.int32)
    targets = np.full(seq_len, IGNORED, np.int32)
    inputs[: len(tokens) - 1] = tokens[:-1]
    if graded == "all":
        targets[: len(tokens) - 1] = tokens[1:]
    for n, value in answers:  # targets[t] follows inputs[t]: a value at n.. follows positions n-1 .. n+digits-2
        targets[n - 1: n - 1 + len(value)] = value
    return inputs, targets


def _rows(filler: np.ndarray, seeds: list[list[int]], task: NeedleTask, seq_len: int, questions: int = 1
          ) -> tuple[np.ndarray, np.ndarray]:
    """One document per seed, each drawing its length, depth, key, value and filler from its own generator,
    then the facts its further questions ask (`questions` - 1 of them)."""
    rows = []
    for seed in seeds:
        rng = np.random.default_rng(seed)
        length = int(rng.integers(task.min_length, task.max_length, endpoint=True))
        depth = float(rng.uniform(task.min_depth, task.max_depth))
        doc = make_document(filler, rng, length, depth, task.digits, task.facts, task.question)
        more = [int(i) for i in rng.integers(0, task.facts, size=questions - 1)]
        rows.append(_row(doc, seq_len, task.graded, more))
    inputs, targets = zip(*rows)
    return np.stack(inputs), np.stack(targets)


def batch_at(tokens: np.ndarray, *, seed: int, step: int, batch_size: int, seq_len: int, task: NeedleTask,
             host_index: int = 0, host_count: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Training batch `step`: one document per row, drawn from (seed, step, row) only; filler from
    `tokens` [N]. Returns (inputs, targets) int32 [batch_size // host_count, seq_len]; targets are
    IGNORED except at the answers' tokens (task.questions of them a row)."""
    task.check(seq_len)
    rows = range(batch_size)[host_rows(batch_size, host_index, host_count)]
    return _rows(tokens, [[seed, step, b] for b in rows], task, seq_len, task.questions)


def eval_batches(tokens: np.ndarray, *, num_batches: int, batch_size: int, seq_len: int, task: NeedleTask,
                 host_index: int = 0, host_count: int = 1) -> list[tuple[np.ndarray, np.ndarray]]:
    """Fixed validation batches of documents, filler from `tokens` [N] (the validation split), as
    `batches.eval_batches` returns them: `num_batches` (inputs, targets) pairs. Each asks one question,
    whatever task.questions, as the analyses do."""
    task.check(seq_len)
    rows = range(batch_size)[host_rows(batch_size, host_index, host_count)]
    return [_rows(tokens, [[EVAL_SEED, i, b] for b in rows], task, seq_len) for i in range(num_batches)]


def document_grid(filler: np.ndarray, lengths: list[int], depths: list[float], per_cell: int, seed: int = 0,
                  digits: int = 5, facts: int = 1, question: str = "question") -> list[list[list[Document]]]:
    """`per_cell` documents for each (length, depth) cell: grid[i][j][k] has prompt length lengths[i]
    and the asked fact at depth depths[j]; document k of a cell draws from (seed, i, j, k)."""
    return [[[make_document(filler, np.random.default_rng([seed, i, j, k]), n, d, digits, facts, question)
              for k in range(per_cell)]
             for j, d in enumerate(depths)] for i, n in enumerate(lengths)]


def needle_task(config: Any) -> DataTask:
    """data.task='needle': the documents of config.data.needle, checked against train.seq_len and
    data.tokenizer."""
    task = NeedleTask.from_config(config.data.needle)
    task.check(config.train.seq_len, config.data.tokenizer)
    return DataTask(functools.partial(batch_at, task=task), functools.partial(eval_batches, task=task))

