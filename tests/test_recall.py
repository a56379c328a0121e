"""Associative recall on the needle task (transformer/experiments/recall/needle.py, data.needle.facts = N > 1):
every fact sits where the document says, keys are distinct, the question names the asked key and the
answer is its value; `ask` asks another fact of the same document; the chance line of a model that
copies any value; the training rows grade the asked value; configs whose facts do not fit are refused."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer.experiments.recall import needle
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
        assert prompt[f.key_start: f.key_start + needle.KEY_LENGTH] == f.key
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


def test_the_cloze_asks_with_the_needles_own_words_and_ask_keeps_it():
    """question='cloze': the prompt ends with "\nThe code of KEY is ", so the answer follows the words it follows
    in the needle; the facts are drawn as with the question in words (the same keys, values and places for the
    same generator); `ask` asks another fact the same way; an unknown form is refused."""
    doc = needle.make_document(FILLER, np.random.default_rng(11), 150, 0.4, digits=3, facts=3, question="cloze")
    worded = needle.make_document(FILLER, np.random.default_rng(11), 150, 0.4, digits=3, facts=3)
    asked = doc.facts[doc.asked]
    cloze = needle.QUESTIONS["cloze"].format(key=asked.key)
    assert text(doc.prompt).endswith(cloze) and len(doc.prompt) == 150 and doc.question == "cloze"
    assert (text(doc.prompt[asked.start: asked.value_start]) == needle.NEEDLE.split("{value}")[0].format(key=asked.key)
            and cloze.endswith(text(doc.prompt[asked.start + 1: asked.value_start])))  # the needle's words up to the value
    assert [(f.key, text(f.value)) for f in doc.facts] == [(f.key, text(f.value)) for f in worded.facts]
    np.testing.assert_array_equal(doc.answer, asked.value)
    other = needle.ask(doc, (doc.asked + 1) % 3)
    assert text(other.prompt).endswith(needle.QUESTIONS["cloze"].format(key=other.facts[other.asked].key))
    assert len(other.prompt) == 150 and other.question == "cloze"
    assert needle.shortest_prompt(3, 3, "cloze") == 3 * 27 + 22
    with pytest.raises(ValueError, match="question='quiz' is not known"):
        needle.make_document(FILLER, np.random.default_rng(0), 150, 0.4, digits=3, facts=3, question="quiz")
    with pytest.raises(ValueError, match="data.needle.question='quiz' is not known"):
        needle.NeedleTask(min_length=150, max_length=150, digits=3, facts=3, question="quiz")


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


def test_more_questions_ask_drawn_facts_after_the_answer_and_grade_each_value():
    """questions=3: the row is the one-question row, then two clozes naming facts of the document, each
    followed by its value; exactly the three values' digits are graded; validation rows ask one."""
    task = needle.NeedleTask(min_length=130, max_length=170, digits=3, facts=3, question="cloze", questions=3)
    one = needle.NeedleTask(min_length=130, max_length=170, digits=3, facts=3, question="cloze")
    seq_len = task.row_length(task.max_length) - 1
    assert seq_len == one.row_length(task.max_length) - 1 + 2 * (len("\nThe code of Kelav is ") + 3)
    inputs, targets = needle.batch_at(FILLER, seed=0, step=2, batch_size=8, seq_len=seq_len, task=task)
    alone, _ = needle.batch_at(FILLER, seed=0, step=2, batch_size=8, seq_len=seq_len, task=one)
    asked_again = set()
    for b in range(8):
        rng = np.random.default_rng([0, 2, b])
        length = int(rng.integers(task.min_length, task.max_length, endpoint=True))
        depth = float(rng.uniform(task.min_depth, task.max_depth))
        doc = needle.make_document(FILLER, rng, length, depth, 3, 3, "cloze")
        np.testing.assert_array_equal(inputs[b, :length + 2], alone[b, :length + 2])  # the one-question row
        tail = text(inputs[b, length + 3:][inputs[b, length + 3:] != 0])
        asks = tail.split("\n")[1:]  # two more clozes, the last value less its last digit (the final target)
        assert len(asks) == 2
        keys = {f.key: text(f.value) for f in doc.facts}
        for q, cloze in enumerate(asks):
            key = cloze[len("The code of "): len("The code of ") + 5]
            assert cloze[:len("The code of Kelav is ")] == f"The code of {key} is " and key in keys
            assert cloze[len("The code of Kelav is "):] == (keys[key] if q == 0 else keys[key][:-1])
            asked_again.add(key == doc.facts[doc.asked].key)
        graded = np.flatnonzero(targets[b] != IGNORED)
        assert len(graded) == 9
        row = np.concatenate([inputs[b], [0]])
        row[graded[-1] + 1] = targets[b, graded[-1]]  # the last target is not an input
        np.testing.assert_array_equal(targets[b, graded], row[graded + 1])  # each graded target is the next byte
        assert text(targets[b, graded]) == text(doc.answer) + "".join(keys[c[12:17]] for c in asks)
    assert asked_again == {True, False}  # the asked fact may come again, or another
    val = needle.eval_batches(FILLER, num_batches=1, batch_size=4, seq_len=seq_len, task=task)[0][1]
    assert ((val != IGNORED).sum(axis=1) == 3).all()  # validation rows ask one question
    with pytest.raises(ValueError, match="questions=0 must be at least 1"):
        needle.NeedleTask(questions=0)
    with pytest.raises(ValueError, match="and 2 more questions with theirs; set train.seq_len >= "):
        task.check(seq_len - 1)


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
    from transformer.experiments.recall import retrieval
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


# --- The grid of many ablations, the causal score, the soft look-up --------------------------------

@pytest.fixture(scope="module")
def recall_model():
    from tests.helpers.decoder import random_params
    from transformer.model.config import ModelConfig
    from transformer.model.decoder import Decoder

    cfg = ModelConfig(vocab_size=128, max_seq_len=160, d_model=32, num_layers=2, num_heads=4, position="rope")
    return cfg, random_params(Decoder(cfg), seed=3, std=0.3)


def test_teacher_forced_grid_is_the_greedy_grid_under_every_mask(recall_model):
    """Cells where a known share of the documents carry the model's own greedy answer (right) and the
    others a wrong one: teacher_forced_grid gives the greedy accuracy_grid under each of two masks, in one
    call, and refuses masks of the wrong shape."""
    import dataclasses

    from transformer.experiments.recall import retrieval

    cfg, params = recall_model
    masks = np.stack([np.ones((2, 4), np.float32), np.asarray(retrieval.ablation_mask(cfg, [(0, 1), (1, 3)]))])
    grid = needle.document_grid(FILLER, [120, 150], [0.0, 1.0], per_cell=4, seed=5, digits=3, facts=2)
    for m, mask in enumerate(masks):
        own = [[[dataclasses.replace(d, answer=a.astype(np.int32)) if k < 1 + i + 2 * j else d  # i + 2j + 1 of 4 right
                 for k, (d, a) in enumerate(zip(cell, retrieval.answers(params, cfg, cell, mask)))]
                for j, cell in enumerate(row)] for i, row in enumerate(grid)]
        greedy = retrieval.accuracy_grid(params, cfg, own, head_mask=jnp.asarray(mask))
        forced = retrieval.teacher_forced_grid(params, cfg, own, masks)  # [2, lengths, depths]
        np.testing.assert_array_equal(forced[m], greedy)
        assert len(np.unique(greedy)) > 2  # cells differ: a transposed or constant grid would not match
    with pytest.raises(ValueError, match=r"\[M, 2, 4\]"):
        retrieval.teacher_forced_grid(params, cfg, grid, masks[0])


def test_the_value_log_prob_is_the_sum_of_the_answer_steps_log_softmax(recall_model):
    from transformer.experiments.recall import retrieval
    from transformer.model.edits import run

    cfg, params = recall_model
    docs = [needle.make_document(FILLER, np.random.default_rng([6, k]), 120, 0.5, digits=3, facts=3) for k in range(3)]
    tokens = np.stack([np.concatenate([d.prompt, d.answer[:-1]]) for d in docs])
    logits = np.asarray(run(params, cfg, jnp.asarray(tokens), [])[0], np.float64)
    by_hand = [sum(logits[b, 119 + i, d.answer[i]] - np.log(np.exp(logits[b, 119 + i]).sum()) for i in range(3))
               for b, d in enumerate(docs)]
    got = retrieval.value_log_prob(jnp.asarray(logits), jnp.asarray(np.stack([d.answer for d in docs])), 120)
    np.testing.assert_allclose(got, by_hand, rtol=1e-5)


def test_the_patching_pair_differs_only_in_the_questions_key():
    from transformer.experiments.recall import retrieval

    docs = [needle.make_document(FILLER, np.random.default_rng([7, k]), 120, 0.3, digits=3, facts=3) for k in range(2)]
    as_asked, as_other, asked, other = map(np.asarray, retrieval.patching_pair(docs, [(d.asked + 1) % 3 for d in docs]))
    assert as_asked.shape == as_other.shape == (4, 122)
    for b, d in enumerate(docs):
        o = d.facts[(d.asked + 1) % 3]
        np.testing.assert_array_equal(asked[b], d.answer)
        np.testing.assert_array_equal(other[b], o.value)
        np.testing.assert_array_equal(as_asked[b], np.concatenate([d.prompt, d.answer[:-1]]))
        np.testing.assert_array_equal(as_asked[2 + b, 120:], o.value[:-1])
        assert text(as_other[b, :120]) == text(d.prompt).replace(d.facts[d.asked].key + "? ", o.key + "? ")
    differ = np.nonzero((as_asked != as_other).any(axis=0))[0]
    assert len(differ) > 0 and differ.min() >= 120 - 2 - needle.KEY_LENGTH and differ.max() < 120 - 2
    with pytest.raises(ValueError, match="not the asked one"):
        retrieval.patching_pair(docs, [d.asked for d in docs])


@pytest.mark.slow  # make test-all only (the default set's time: docs/performance.md)
def test_the_causal_score_of_a_head_that_writes_nothing_is_zero_and_of_the_only_one_left_is_one():
    """One layer, two heads, head 1's W_o zeroed: the answer steps' logits are the embedding's path plus head 0
    (the tokens there are the same in both runs), so patching head 0 from the run asking the other fact gives
    that run's metric exactly (share 1) and patching head 1 changes nothing (share 0); clean and corrupted
    are the two runs' metrics."""
    from tests.helpers.decoder import random_params
    from transformer.experiments.recall import retrieval
    from transformer.model.config import ModelConfig
    from transformer.model.decoder import Decoder
    from transformer.model.edits import run

    cfg = ModelConfig(vocab_size=128, max_seq_len=160, d_model=32, num_layers=1, num_heads=2, position="rope")
    params = random_params(Decoder(cfg), seed=4, std=0.3)
    kernel = params["layers"]["attn"]["o"]["kernel"]  # [L, D, H, Kv]
    params["layers"]["attn"]["o"]["kernel"] = kernel.at[:, :, 1].set(0.0)
    docs = [needle.make_document(FILLER, np.random.default_rng([8, k]), n, 0.5, digits=3, facts=3)
            for k, n in enumerate([110, 110, 110, 130])]  # two prompt lengths: two batches, weighted by size
    got = retrieval.causal_scores(params, cfg, docs, batch_size=2)
    shares = np.asarray(got.normalised())
    assert shares.shape == (1, 2)
    np.testing.assert_allclose(shares, [[1.0, 0.0]], atol=1e-4)

    def metric(documents, asking):
        as_asked, as_other, asked, other = retrieval.patching_pair(documents, [(d.asked + 1) % 3 for d in documents])
        tokens = as_other if asking == "other" else as_asked
        return float(retrieval.recall_metric(asked, other, len(documents[0].prompt))(run(params, cfg, tokens, [])[0]))

    groups = [docs[:3], docs[3:]]
    for field, asking in (("clean", "other"), ("corrupted", "asked")):
        expected = sum(metric(g, asking) * len(g) for g in groups) / 4
        np.testing.assert_allclose(float(getattr(got, field)), expected, rtol=1e-4)
    assert abs(float(got.corrupted) - float(got.clean)) > 0.1  # the question's key matters: the share is defined


def test_lookup_weights_sum_the_heads_attention_over_each_entry(recall_model):
    from transformer.experiments.recall import retrieval
    from transformer.analysis.capture import attention_maps

    cfg, params = recall_model
    docs = [needle.make_document(FILLER, np.random.default_rng([9, k]), 120, 0.5, digits=3, facts=3) for k in range(3)]
    for over in ("key", "value"):
        got = retrieval.lookup_weights(params, cfg, docs, layer=1, head=2, over=over)
        assert got.shape == (3, 3)
        pattern = np.asarray(attention_maps(params, cfg, jnp.asarray(np.stack([d.prompt for d in docs]))))[1, :, 2, -1]
        for b, d in enumerate(docs):
            for f, fact in enumerate(d.facts):
                start, entry = (fact.key_start, fact.key) if over == "key" else (fact.value_start, text(fact.value))
                assert text(d.prompt[start: start + len(entry)]) == entry
                np.testing.assert_allclose(got[b, f], pattern[b, start: start + len(entry)].sum(), rtol=1e-5)
        assert (got.sum(axis=1) <= 1 + 1e-6).all()
    with pytest.raises(ValueError, match="'key' or 'value'"):
        retrieval.lookup_weights(params, cfg, docs, 1, 2, over="query")


def test_the_loops_exact_match_metric_is_teacher_forced_exact_match(recall_model):
    """The 'exact_match' evaluation metric, on for needle runs that grade the answer: over two validation
    batches of documents of two lengths, some carrying the model's own greedy answer (right) and the
    others a wrong one, it gives the fraction that `teacher_forced` answers exactly; text runs and
    runs grading every byte do not measure it."""
    import dataclasses

    import optax

    from configs import recall
    from transformer.experiments.recall import retrieval
    from transformer.experiments.catalog import eval_metrics as enabled_metrics
    from transformer.training.eval_metrics import compile_metric
    from transformer.training.sharding import make_mesh, make_rules
    from transformer.training.steps import create_state

    cfg, params = recall_model
    config = recall.get_config()
    metric = {m.name: m for m in enabled_metrics(config)}["exact_match"]
    config.data.needle.graded = "all"
    assert "exact_match" not in [m.name for m in enabled_metrics(config)]
    config.data.task = "text"
    assert "exact_match" not in [m.name for m in enabled_metrics(config)]

    seq_len, batches, right = 140, [], []
    for n, keep in ((120, 3), (130, 1)):  # `keep` of 4 documents carry the model's own answer
        docs = [needle.make_document(FILLER, np.random.default_rng([7, n, k]), n, 0.5, digits=3, facts=3)
                for k in range(4)]
        greedy = retrieval.answers(params, cfg, docs)
        docs = [dataclasses.replace(d, answer=greedy[k].astype(np.int32)) if k < keep else d for k, d in enumerate(docs)]
        right += retrieval.teacher_forced(params, cfg, docs).tolist()
        inputs = np.zeros((4, seq_len), np.int32)
        targets = np.full((4, seq_len), IGNORED, np.int32)
        for k, d in enumerate(docs):
            row = np.concatenate([d.prompt, d.answer])
            inputs[k, :len(row) - 1] = row[:-1]
            targets[k, n - 1: n + 2] = d.answer
        batches.append((jnp.asarray(inputs), jnp.asarray(targets)))
    assert 0 < np.mean(right) < 1
    mesh = make_mesh(devices=jax.devices()[:1])
    state = create_state(cfg, optax.sgd(0.1), 0, mesh, params=params)
    measure = compile_metric(metric, cfg, mesh, state, make_rules(cfg, mesh), batches[0][0])
    assert measure(params, batches) == {"val_exact_match": pytest.approx(np.mean(right))}
