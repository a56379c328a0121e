"""The needle-in-a-haystack task: facts hidden in filler text, and a question about one of them at the end.

    filler ... " The code of Kelav is 48213. " ... filler "\nWhat is the code of Kelav? "   -> "48213"
    |<------------ haystack: n - len(question) tokens ------------>|<---- question ---->|   answer

Keys (made-up names) and values (random digits) are drawn per document, so the answer has to be read
from the needle. With facts=N > 1 the question must be matched to its key: copying any fact's value
scores about 1/N (`copy_any_value_accuracy`). Tokens are bytes (data.tokenizer='bytes'), so the value's
tokens in the needle are the answer's tokens (a BPE would merge digits differently in the two places).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from transformer.data.batches import IGNORED, host_rows
from transformer.data.tasks import DataTask

NEEDLE = " The code of {key} is {value}. "
QUESTION = "\nWhat is the code of {key}? "
# 'cloze' repeats the needle's words up to the value: the answer follows the needle's context (Zoology's MQAR).
QUESTIONS = {"question": QUESTION, "cloze": "\nThe code of {key} is "}
KEY_LENGTH = 5  # consonant-vowel-consonant-vowel-consonant, capitalised: "Kelav", "Morup"
EVAL_SEED = 1_000_003  # validation documents draw from (EVAL_SEED, batch index): never a training step's
MAX_FACTS = 64  # distinct keys are drawn by rejection from 17 * 5 * 17 * 5 * 17 names: far more than this


@dataclass(frozen=True)
class NeedleTask:
    """The documents a run trains on (`config.data.needle`), lengths and depths drawn uniformly."""

    min_length: int = 64
    max_length: int = 256
    min_depth: float = 0.0
    max_depth: float = 1.0
    digits: int = 5
    graded: str = "answer"  # 'answer': only the answers' tokens are graded; 'all': every token of the row
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
        """From a config's data.needle (a ConfigDict or a dict; one saved without `facts` asks one fact in words)."""
        return cls(**{f.name: needle[f.name] for f in dataclasses.fields(cls) if f.name in needle})

    def check(self, seq_len: int, tokenizer: str = "bytes") -> None:
        """Raises unless a batch of seq_len byte tokens holds the longest training row."""
        if tokenizer != "bytes":
            raise ValueError(f"data.task='needle' needs data.tokenizer='bytes' (got {tokenizer!r}): the needle "
                             "is placed and graded in byte tokens")
        if seq_len < self.row_length(self.max_length) - 1:
            more = "" if self.questions == 1 else f" and {self.questions - 1} more questions with theirs"
            raise ValueError(f"train.seq_len={seq_len} cannot hold a document of data.needle.max_length="
                             f"{self.max_length} and its {self.digits}-digit answer{more}; set train.seq_len >= "
                             f"{self.row_length(self.max_length) - 1} or lower max_length")

    def row_length(self, length: int) -> int:
        """Tokens of a training row of prompt length `length`: its answer, the further questions and theirs."""
        asking = len(QUESTIONS[self.question].format(key="K" * KEY_LENGTH))
        return length + self.digits + (self.questions - 1) * (asking + self.digits)


def shortest_prompt(digits: int, facts: int = 1, question: str = "question") -> int:
    """The needles and the question with no filler."""
    key = "K" * KEY_LENGTH
    return facts * len(NEEDLE.format(key=key, value="0" * digits)) + len(QUESTIONS[question].format(key=key))


@dataclass(frozen=True)
class Fact:
    """A fact's key, its value int32 [digits], where its needle and its value begin in the prompt."""

    key: str
    value: np.ndarray
    start: int
    value_start: int

    @property
    def key_start(self) -> int:
        """Where the key's KEY_LENGTH tokens begin in the prompt."""
        return self.start + len(NEEDLE.split("{key}")[0])


@dataclass(frozen=True)
class Document:
    """prompt int32 [n] (haystack, needles, question); answer int32 [digits] at prompt[value_start:] in the
    needle of facts[asked] (facts in the order of the text), which starts at needle_start."""

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
    letters = ["bcdfghjklmnprstvz" if i % 2 == 0 else "aeiou" for i in range(KEY_LENGTH)]  # consonants, vowels
    return "".join(rng.choice(list(choices)) for choices in letters).capitalize()


def make_document(filler: np.ndarray, rng: np.random.Generator, length: int, depth: float, digits: int = 5,
                  facts: int = 1, question: str = "question") -> Document:
    """A document of prompt length `length`, its asked needle at round(depth * filler) (0: first, 1: last),
    the others at drawn places, the filler a window of filler [N] at an offset drawn from `rng`."""
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
    fill = length - len(asking) - facts * len(NEEDLE.format(key=keys[0], value=values[0]))  # needles: one length
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
        parts.append(_bytes(NEEDLE.format(key=keys[i], value=values[i])))
        value_start = start + len(NEEDLE.split("{value}")[0].format(key=keys[i]))
        made.append(Fact(keys[i], _bytes(values[i]), start, value_start))
    asked = order.index(0)
    return Document(prompt=np.concatenate(parts + [text[cut:], asking]), answer=made[asked].value,
                    needle_start=made[asked].start, value_start=made[asked].value_start, facts=tuple(made),
                    asked=asked, question=question)


def ask(document: Document, i: int) -> Document:
    """The same document with its question naming fact i instead: the same length, another answer."""
    fact = document.facts[i]
    asking = _bytes(QUESTIONS[document.question].format(key=fact.key))
    prompt = np.concatenate([document.prompt[: len(document.prompt) - len(asking)], asking])
    return Document(prompt=prompt, answer=fact.value, needle_start=fact.start, value_start=fact.value_start,
                    facts=document.facts, asked=i, question=document.question)


def copy_any_value_accuracy(documents: list[Document]) -> float:
    """The chance line of recall: the expected exact match of answering with a uniformly drawn fact's value."""
    return float(np.mean([np.mean([np.array_equal(f.value, d.answer) for f in d.facts]) for d in documents]))


def _row(filler: np.ndarray, seed: list[int], task: NeedleTask, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Row `seed`: (inputs, targets) int32 [seq_len], a document, then task.questions - 1 questions of facts
    drawn uniformly, each followed by its value; targets IGNORED but on the values (graded='all': the row)."""
    rng = np.random.default_rng(seed)
    length = int(rng.integers(task.min_length, task.max_length, endpoint=True))
    depth = float(rng.uniform(task.min_depth, task.max_depth))
    doc = make_document(filler, rng, length, depth, task.digits, task.facts, task.question)
    parts, answers = [doc.prompt, doc.answer], [(len(doc.prompt), doc.answer)]
    for i in rng.integers(0, task.facts, size=task.questions - 1):
        fact = doc.facts[int(i)]
        parts.append(_bytes(QUESTIONS[doc.question].format(key=fact.key)))
        answers.append((sum(len(p) for p in parts), fact.value))
        parts.append(fact.value)
    tokens = np.concatenate(parts)
    inputs = np.zeros(seq_len, np.int32)
    targets = np.full(seq_len, IGNORED, np.int32)
    inputs[: len(tokens) - 1] = tokens[:-1]
    if task.graded == "all":
        targets[: len(tokens) - 1] = tokens[1:]
    for n, value in answers:  # targets[t] follows inputs[t]: a value at n.. follows positions n-1 .. n+digits-2
        targets[n - 1: n - 1 + len(value)] = value
    return inputs, targets


def batch_at(tokens: np.ndarray, *, seed: int, step: int, batch_size: int, seq_len: int, task: NeedleTask,
             host_index: int = 0, host_count: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Training batch `step` from (seed, step, row) alone, filler from tokens [N]: (inputs, targets) int32
    [batch_size / host_count, seq_len], task.questions graded answers a row."""
    task.check(seq_len)
    rows = range(batch_size)[host_rows(batch_size, host_index, host_count)]
    inputs, targets = zip(*(_row(tokens, [seed, step, b], task, seq_len) for b in rows))
    return np.stack(inputs), np.stack(targets)


def eval_batches(tokens: np.ndarray, *, num_batches: int, batch_size: int, seq_len: int, task: NeedleTask,
                 host_index: int = 0, host_count: int = 1) -> list[tuple[np.ndarray, np.ndarray]]:
    """`num_batches` validation batches: `batch_at` of EVAL_SEED, one question a row as the analyses ask."""
    task.check(seq_len)
    one = dataclasses.replace(task, questions=1)
    return [batch_at(tokens, seed=EVAL_SEED, step=i, batch_size=batch_size, seq_len=seq_len, task=one,
                     host_index=host_index, host_count=host_count) for i in range(num_batches)]


def document_grid(filler: np.ndarray, lengths: list[int], depths: list[float], per_cell: int, seed: int = 0,
                  digits: int = 5, facts: int = 1, question: str = "question") -> list[list[list[Document]]]:
    """grid[i][j][k]: document k of prompt length lengths[i], asked fact at depths[j], drawn from (seed, i, j, k)."""
    return [[[make_document(filler, np.random.default_rng([seed, i, j, k]), n, d, digits, facts, question)
              for k in range(per_cell)]
             for j, d in enumerate(depths)] for i, n in enumerate(lengths)]


def needle_task(config: Any) -> DataTask:
    """data.task='needle': the documents of config.data.needle, checked against train.seq_len and data.tokenizer."""
    task = NeedleTask.from_config(config.data.needle)
    task.check(config.train.seq_len, config.data.tokenizer)
    return DataTask(functools.partial(batch_at, task=task), functools.partial(eval_batches, task=task))
