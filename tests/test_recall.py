"""Associative recall on the needle task (transformer/data/needle.py, data.needle.facts = N > 1):
every fact sits where the document says, keys are distinct, the question names the asked key and the
answer is its value; `ask` asks another fact of the same document; the chance line of a model that
copies any value; the training rows grade the asked value; configs whose facts do not fit are refused."""

import numpy as np
import pytest

from transformer.data import needle
from transformer.data.batches import IGNORED

FILLER = np.frombuffer(b"the quick brown fox jumps over the lazy dog; " * 200, np.uint8).astype(np.int32)


def text(ids) -> str:
    return bytes(np.asarray(ids, np.uint8)).decode("ascii")


@pytest.mark.parametrize("facts", [2, 4, 8])
@pytest.mark.parametrize("depth", [0.0, 0.5, 1.0])
def test_every_fact_sits_where_the_document_says_and_the_question_asks_one(facts, depth):
    length = 400
    doc = needle.make_document(FILLER, np.random.default_rng([facts, int(depth * 10)]), length, depth, facts=facts)
    prompt = text(doc.prompt)
    assert len(doc.prompt) == length and len(doc.facts) == facts
    keys = [f.key for f in doc.facts]
    assert len(set(keys)) == facts  # distinct keys: the question has one answer
    starts = [f.start for f in doc.facts]
    assert starts == sorted(starts)  # in the order of the text
    for f in doc.facts:
        sentence = needle.NEEDLE.format(key=f.key, value=text(f.value))
        assert prompt[f.start: f.start + len(sentence)] == sentence and prompt.count(sentence) == 1
        assert text(doc.prompt[f.value_start: f.value_start + len(f.value)]) == text(f.value)
    asked = doc.facts[doc.asked]
    assert prompt.endswith(needle.QUESTION.format(key=asked.key))
    np.testing.assert_array_equal(doc.answer, asked.value)
    assert (doc.needle_start, doc.value_start) == (asked.start, asked.value_start)

    # The asked fact at its depth: round(depth * fill) filler bytes before it.
    needle_length = len(needle.NEEDLE.format(key=asked.key, value=text(asked.value)))
    fill = length - len(needle.QUESTION.format(key=asked.key)) - facts * needle_length
    before = sum(1 for f in doc.facts[: doc.asked]) * needle_length
    assert asked.start - before == round(depth * fill)
    haystack = prompt[: length - len(needle.QUESTION.format(key=asked.key))]
    for f in doc.facts:
        haystack = haystack.replace(needle.NEEDLE.format(key=f.key, value=text(f.value)), "", 1)
    assert len(haystack) == fill and haystack in text(FILLER)  # one window of the filler, cut by the needles


def test_ask_puts_the_question_on_another_fact_of_the_same_document():
    doc = needle.make_document(FILLER, np.random.default_rng(5), 300, 0.3, facts=4)
    for i, fact in enumerate(doc.facts):
        other = needle.ask(doc, i)
        assert len(other.prompt) == len(doc.prompt) and other.asked == i
        assert text(other.prompt).endswith(needle.QUESTION.format(key=fact.key))
        np.testing.assert_array_equal(other.answer, fact.value)
        question = len(needle.QUESTION.format(key=fact.key))
        np.testing.assert_array_equal(other.prompt[:-question], doc.prompt[:-question])  # the same haystack
        assert other.value_start == fact.value_start
    np.testing.assert_array_equal(needle.ask(doc, doc.asked).prompt, doc.prompt)


def test_the_chance_line_is_one_over_the_facts_and_counts_repeated_values():
    docs = [needle.make_document(FILLER, np.random.default_rng([9, k]), 300, 0.5, facts=4) for k in range(50)]
    assert all(len({text(f.value) for f in d.facts}) == 4 for d in docs)  # 5 random digits: no two alike here
    assert needle.copy_any_value_accuracy(docs) == pytest.approx(0.25)
    # By hand: values a, a, b with a asked -> a copy of a random fact's value is right 2 times in 3.
    a, b = np.array([49, 50]), np.array([51, 52])
    facts = tuple(needle.Fact(k, v, 0, 0) for k, v in [("Kelav", a), ("Morup", a), ("Tisek", b)])
    hand = needle.Document(prompt=np.zeros(4, np.int32), answer=a, needle_start=0, value_start=0, facts=facts, asked=0)
    one = needle.Document(prompt=np.zeros(4, np.int32), answer=b, needle_start=0, value_start=0, facts=facts, asked=2)
    assert needle.copy_any_value_accuracy([hand]) == pytest.approx(2 / 3)
    assert needle.copy_any_value_accuracy([hand, one]) == pytest.approx((2 / 3 + 1 / 3) / 2)


def test_a_recall_batch_grades_the_asked_value_only():
    task = needle.NeedleTask(min_length=160, max_length=200, digits=3, facts=3)
    seq_len = task.row_length(task.max_length) - 1
    inputs, targets = needle.batch_at(FILLER, seed=0, step=4, batch_size=6, seq_len=seq_len, task=task)
    for b in range(6):
        rng = np.random.default_rng([0, 4, b])  # the row's own generator, as batch_at draws it
        length = int(rng.integers(task.min_length, task.max_length, endpoint=True))
        depth = float(rng.uniform(task.min_depth, task.max_depth))
        doc = needle.make_document(FILLER, rng, length, depth, task.digits, task.facts)
        graded = np.flatnonzero(targets[b] != IGNORED)
        np.testing.assert_array_equal(graded, np.arange(length - 1, length - 1 + 3))  # the answer's 3 digits
        np.testing.assert_array_equal(targets[b, graded], doc.answer)
        np.testing.assert_array_equal(inputs[b, :length], doc.prompt)


def test_facts_that_do_not_fit_are_refused():
    with pytest.raises(ValueError, match="facts=0 must be in"):
        needle.NeedleTask(facts=0)
    with pytest.raises(ValueError, match="min_length=64 is below 144, the 4 needles and the question alone"):
        needle.NeedleTask(min_length=64, max_length=200, facts=4)  # 4 x 29 bytes of needles + a 28-byte question
    with pytest.raises(ValueError, match="the 3 needles and the question alone"):
        needle.make_document(FILLER, np.random.default_rng(0), 90, 0.5, facts=3)
    assert needle.NeedleTask.from_config({"min_length": 64, "max_length": 96, "min_depth": 0.0, "max_depth": 1.0,
                                          "digits": 5, "graded": "answer"}).facts == 1  # saved before facts existed


# --- Exact match in one forward pass --------------------------------------------------------------

def test_teacher_forced_exact_match_is_greedy_exact_match():
    """A document is answered exactly by greedy decoding iff every teacher-forced answer token is the
    argmax: with each document's answer set to the model's own greedy continuation all are right;
    with any one digit of it changed, none is; a head mask reaches the pass."""
    import dataclasses

    from tests.helpers.decoder import random_params
    from transformer.analysis import retrieval
    from transformer.model.config import ModelConfig
    from transformer.model.decoder import Decoder

    cfg = ModelConfig(vocab_size=128, max_seq_len=160, d_model=32, num_layers=2, num_heads=4, position="rope")
    params = random_params(Decoder(cfg), seed=3, std=0.3)
    docs = [needle.make_document(FILLER, np.random.default_rng([4, k]), 120, 0.5, digits=3, facts=2) for k in range(6)]
    for mask in (None, retrieval.ablation_mask(cfg, [(0, 1), (1, 3)])):
        greedy = retrieval.answers(params, cfg, docs, mask)  # [6, 3]
        own = [dataclasses.replace(d, answer=greedy[b].astype(np.int32)) for b, d in enumerate(docs)]
        assert retrieval.teacher_forced(params, cfg, own, mask).tolist() == [True] * 6
        for step in range(3):  # a wrong digit at any step, the others the model's own
            wrong = [dataclasses.replace(d, answer=d.answer.copy()) for d in own]
            for d in wrong:
                d.answer[step] = (d.answer[step] + 1) % cfg.vocab_size
            assert retrieval.teacher_forced(params, cfg, wrong, mask).tolist() == [False] * 6, step
    masked = retrieval.answers(params, cfg, docs, retrieval.ablation_mask(cfg, [(0, 1), (1, 3)]))
    assert masked.tolist() != retrieval.answers(params, cfg, docs).tolist()  # the mask changes the answers
    with pytest.raises(ValueError, match="one prompt length"):
        retrieval.teacher_forced(params, cfg, [docs[0], needle.make_document(FILLER, np.random.default_rng(0), 100,
                                                                             0.5, digits=3, facts=2)])
