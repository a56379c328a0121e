"""Image question answering on the procedural shapes (data/images.py): the data task data.task='vqa'.

Each example is a picture and one question about it, as bytes (the byte tokenizer's ids), answered by a
decoder that cross-attends to a ViT encoder of the picture (model.inputs='image_text'):

    "colour of the circle? red\n"     "where is the square? left\n"     "which shape is blue? triangle\n"

QUESTIONS: (asked attribute, about attribute, its value): the colour or position of a shape (3 x 2), the
shape of a colour (4). A question is asked only where its answer is defined: exactly one object of the
picture has the named shape (or colour). The loss grades the answer's bytes and the closing newline only
(the question's targets are IGNORED). The text-only chance line (`chance_accuracy`): the best answer per
question without the picture, i.e. the majority answer of each question on a training draw.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from transformer.data import images as pictures
from transformer.data.batches import IGNORED, host_rows
from transformer.data.tasks import DataTask

ATTRIBUTES = {"shape": pictures.SHAPES, "colour": pictures.COLOURS, "position": pictures.POSITIONS}
QUESTIONS = (*[(asked, "shape", s) for asked in ("colour", "position") for s in range(len(pictures.SHAPES))],
             *[("shape", "colour", c) for c in range(len(pictures.COLOURS))])  # (asked, about, value)
END = "\n"  # closes every answer: exact match needs the model to stop
EVAL_SEED = 10_000  # the validation pictures' seeds start here (training draws use the run's seed)


WORDS = {"colour": "colour of the {}? ", "position": "where is the {}? ", "shape": "which shape is {}? "}  # by asked


def question_text(question: int) -> str:
    """The words of QUESTIONS[question], with the space before the answer: 'colour of the circle? '."""
    asked, about, value = QUESTIONS[question]
    return WORDS[asked].format(ATTRIBUTES[about][value])


def draw(n: int, seed: Any) -> dict:
    """n pictures with a question each (`seed`: an int or a list of ints): the picture set's arrays plus
    question [n] (index into QUESTIONS), answer [n] (index into its attribute's names), target [n] (the
    object asked about, k) and prompt / answer_text [n] (str). A picture without a defined question
    (two objects alike in every named attribute) is replaced by a later draw."""
    rng = np.random.default_rng(seed)
    data = pictures.shapes(2 * n + 8, int(rng.integers(2**31)))
    about = np.stack([data[a] == v for _, a, v in QUESTIONS], axis=1)  # [m, Q, K]: object k named
    defined = about.sum(axis=-1) == 1  # [m, Q]
    keep = np.flatnonzero(defined.any(axis=1))[:n]
    if len(keep) < n:
        raise RuntimeError("too few pictures with a defined question; draw more")
    scores = np.where(defined[keep], rng.random((n, len(QUESTIONS))), -1.0)
    question = scores.argmax(axis=1)  # a defined question, uniformly
    target = about[keep, question].argmax(axis=1)  # [n]: the one object it names
    asked = np.array([QUESTIONS[q][0] for q in question])
    answer = np.array([data[a][i, k] for a, i, k in zip(asked, keep, target)])
    out = {key: value[keep] for key, value in data.items() if isinstance(value, np.ndarray)}
    out.update(question=question, answer=answer, target=target,
               prompt=np.array([question_text(q) for q in question]),
               answer_text=np.array([ATTRIBUTES[a][v] + END for a, v in zip(asked, answer)]))
    return out


def encode(drawn: dict, seq_len: int) -> tuple[dict, np.ndarray]:
    """(inputs {"image": [n, H, W, C] float32, "tokens": [n, T] int32}, targets [n, T] int32): the bytes
    of prompt + answer, shifted by one, padded with 0 (targets IGNORED but on the answer and END)."""
    n = len(drawn["prompt"])
    tokens, targets = np.zeros((n, seq_len), np.int32), np.full((n, seq_len), IGNORED, np.int32)
    for i, (prompt, answer) in enumerate(zip(drawn["prompt"], drawn["answer_text"])):
        p, a = np.frombuffer(prompt.encode(), np.uint8), np.frombuffer(answer.encode(), np.uint8)
        if len(p) + len(a) - 1 > seq_len:
            raise ValueError(f"the question {prompt!r} and its answer {answer!r} take {len(p) + len(a) - 1} tokens, "
                             f"past train.seq_len={seq_len}; raise train.seq_len (and model.max_seq_len)")
        text = np.concatenate([p, a])
        tokens[i, :len(text) - 1] = text[:-1]
        targets[i, len(p) - 1:len(text) - 1] = a  # the answer's bytes, each predicted from the bytes before
    return {"image": drawn["images"], "tokens": tokens}, targets


def batch_at(tokens: None, *, seed: int, step: int, batch_size: int, seq_len: int, host_index: int = 0,
             host_count: int = 1) -> tuple[dict, np.ndarray]:
    """Training batch `step` of run seed `seed`, a function of (seed, step) alone: this host's rows."""
    rows = host_rows(batch_size, host_index, host_count)
    return encode(draw(rows.stop - rows.start, [seed, step, host_index]), seq_len)


def eval_batches(tokens: None, *, num_batches: int, batch_size: int, seq_len: int, host_index: int = 0,
                 host_count: int = 1) -> list[tuple[dict, np.ndarray]]:
    """The validation batches: pictures from seeds EVAL_SEED + i, none of a training draw's seeds."""
    rows = host_rows(batch_size, host_index, host_count)
    return [encode(draw(rows.stop - rows.start, [EVAL_SEED + i, host_index]), seq_len) for i in range(num_batches)]


def majority_answers(question: np.ndarray, answer: np.ndarray) -> dict[int, int]:
    """{question: its most frequent answer} (ties: the smallest answer index) over a draw's [n] arrays."""
    counts: dict[int, Counter] = {}
    for q, a in zip(question.tolist(), answer.tolist()):
        counts.setdefault(q, Counter())[a] += 1
    return {q: min(c, key=lambda a: (-c[a], a)) for q, c in counts.items()}


def chance_accuracy(train: dict, test: dict) -> float:
    """The text-only chance line: the accuracy on `test` of answering each question with its majority
    answer on `train` (a question unseen there: wrong). Both: dicts with question, answer [n]."""
    best = majority_answers(train["question"], train["answer"])
    return float(np.mean([best.get(q, -1) == a for q, a in zip(test["question"].tolist(), test["answer"].tolist())]))


def vqa_task(config: Any) -> DataTask:
    """data.task='vqa': checked against the model (an image-and-text model whose encoder reads 32 x 32 x 3)."""
    model = config.model
    if model.get("inputs", "tokens") != "image_text":
        raise ValueError("data.task='vqa' needs a cross-attention model: set model.inputs='image_text', "
                         "model.cross_attention=True and model.encoder (configs/vqa.py)")
    return DataTask(batch_at, eval_batches, text=False)
