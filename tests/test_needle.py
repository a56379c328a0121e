"""Tests for transformer/experiments/recall/needle.py (the documents and their batches), transformer/experiments/recall/retrieval.py
(accuracy grid, retrieval score, ablation) and configs/needle.py (its batches, and train.py on it)."""

import json
import math
import os
import re
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import needle as needle_config
from tests.helpers.cli import run
from tests.helpers.decoder import random_params
from transformer.experiments.recall import retrieval
from transformer.analysis.capture import capture
from transformer.experiments.recall import needle
from transformer.data.batches import IGNORED
from transformer.experiments.catalog import data_task
from transformer.model.config import ModelConfig
from transformer.model.decoder import Decoder
from transformer.model.edits import ablate_heads
from transformer.sampling.sampler import GenerateOutput
from transformer.training.loop import training_batches

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FILLER = np.frombuffer(b"the quick brown fox jumps over the lazy dog; " * 200, np.uint8).astype(np.int32)
TASK = needle.NeedleTask(min_length=64, max_length=96, digits=5)


def text(ids) -> str:
    return bytes(np.asarray(ids, np.uint8)).decode("ascii")


def ascii_ids(s: str) -> np.ndarray:
    return np.frombuffer(s.encode("ascii"), np.uint8).astype(np.int32)


def pattern(template: str, **groups: str) -> str:
    """A regex of a needle.py template, its {fields} replaced by the given groups."""
    parts = re.split(r"\{(\w+)\}", template)  # literal, field, literal, ...
    return "".join(re.escape(p) if i % 2 == 0 else groups[p] for i, p in enumerate(parts))


QUESTION_RE = re.compile(pattern(needle.QUESTION, key=r"([A-Z][a-z]+)"))


def find_value(document: str) -> tuple[int, int, str]:
    """Reads a document as its text: the key its question asks about, then the value the needle of that
    key states. Returns (the prompt's length: where the question ends, where the value starts, its digits)."""
    (question,) = list(QUESTION_RE.finditer(document))  # one question per document
    (fact,) = list(re.finditer(pattern(needle.NEEDLE, key=question.group(1), value=r"(\d+)"), document))
    return question.end(), fact.start(1), fact.group(1)


def assert_only_the_answer_is_graded(x, y, min_length, max_length):
    """Each row of a training batch (inputs x, targets y) holds one document; the positions carrying loss
    are exactly those whose next token is one of the value's digits, read from the document's text:
    targets[t] follows inputs[t], so with a prompt of n tokens they are n - 1 .. n + digits - 2."""
    lengths = []
    for row_x, row_y in zip(x, y):
        n, _, value = find_value(text(row_x))
        positions = np.arange(n - 1, n - 1 + len(value))
        np.testing.assert_array_equal(np.flatnonzero(row_y != IGNORED), positions)
        np.testing.assert_array_equal(row_y[positions], ascii_ids(value))
        np.testing.assert_array_equal(row_x[n: n + len(value) - 1], ascii_ids(value)[:-1])  # teacher forcing
        lengths.append(n)
    assert min_length <= min(lengths) and max(lengths) <= max_length
    assert len(set(lengths)) > 1  # the rows' lengths are drawn: the graded positions move with them


@pytest.mark.parametrize("length", [64, 97, 300])
@pytest.mark.parametrize("depth", [0.0, 0.25, 0.5, 1.0])
def test_the_fact_sits_at_the_asked_depth(length, depth):
    doc = needle.make_document(FILLER, np.random.default_rng(3), length, depth, digits=5)
    prompt = text(doc.prompt)
    assert len(doc.prompt) == length
    value = text(doc.answer)
    assert len(value) == 5 and value.isdigit()
    key = prompt[-len(needle.QUESTION.format(key="Kxxxx")):].split("code of ")[1][:needle.KEY_LENGTH]
    assert prompt.endswith(needle.QUESTION.format(key=key))  # the question names the key
    fact = needle.NEEDLE.format(key=key, value=value)
    assert prompt.count(fact) == 1 and prompt.index(fact) == doc.needle_start
    assert text(doc.prompt[doc.value_start: doc.value_start + 5]) == value
    fill = length - len(needle.QUESTION.format(key=key)) - len(fact)  # filler tokens around the needle
    assert doc.needle_start == round(depth * fill)
    haystack = prompt.replace(fact, "", 1)[:fill]
    assert haystack in text(FILLER)  # the filler is one contiguous window of the stream, cut by the needle


def test_documents_are_deterministic_and_keys_and_values_vary():
    a = needle.make_document(FILLER, np.random.default_rng([0, 1]), 80, 0.5)
    b = needle.make_document(FILLER, np.random.default_rng([0, 1]), 80, 0.5)
    np.testing.assert_array_equal(a.prompt, b.prompt)
    docs = [needle.make_document(FILLER, np.random.default_rng([0, i]), 80, 0.5) for i in range(20)]
    assert len({text(d.answer) for d in docs}) == 20
    assert len({text(d.prompt[-len("Kelav? "):]) for d in docs}) > 10


def test_bad_documents_are_refused():
    with pytest.raises(ValueError, match="depth=1.5 must be in"):
        needle.make_document(FILLER, np.random.default_rng(0), 80, 1.5)
    with pytest.raises(ValueError, match="below .*the needle and the question alone"):
        needle.make_document(FILLER, np.random.default_rng(0), 20, 0.5)
    with pytest.raises(ValueError, match="max_length=60 is below min_length=64"):
        needle.NeedleTask(min_length=64, max_length=60)
    with pytest.raises(ValueError, match="train.seq_len=50 cannot hold"):
        TASK.check(50, "bytes")
    with pytest.raises(ValueError, match="needs data.tokenizer='bytes'"):
        TASK.check(200, "bpe")


def test_batch_at_grades_only_the_answer_and_is_a_function_of_seed_and_step():
    """Exactly the answer's digits carry loss, where the document each row holds puts them; batch `step`
    depends on (seed, step) only, and the hosts' rows make up the whole batch."""
    x, y = needle.batch_at(FILLER, seed=0, step=4, batch_size=6, seq_len=100, task=TASK)
    assert x.shape == y.shape == (6, 100) and x.dtype == y.dtype == np.int32
    assert_only_the_answer_is_graded(x, y, TASK.min_length, TASK.max_length)
    np.testing.assert_array_equal(x, needle.batch_at(FILLER, seed=0, step=4, batch_size=6, seq_len=100, task=TASK)[0])
    assert not np.array_equal(x, needle.batch_at(FILLER, seed=0, step=5, batch_size=6, seq_len=100, task=TASK)[0])
    halves = [needle.batch_at(FILLER, seed=0, step=4, batch_size=6, seq_len=100, task=TASK, host_index=h,
                              host_count=2)[0] for h in (0, 1)]
    np.testing.assert_array_equal(np.concatenate(halves), x)
    evals = needle.eval_batches(FILLER, num_batches=2, batch_size=6, seq_len=100, task=TASK)
    assert len(evals) == 2 and not np.array_equal(evals[0][0], evals[1][0])
    assert_only_the_answer_is_graded(*evals[0], TASK.min_length, TASK.max_length)
    np.testing.assert_array_equal(evals[1][1], needle.eval_batches(FILLER, num_batches=2, batch_size=6, seq_len=100,
                                                                   task=TASK)[1][1])


def test_graded_all_grades_every_byte_of_the_document_and_not_the_padding():
    everything = needle.NeedleTask(min_length=64, max_length=96, graded="all")
    x, y = needle.batch_at(FILLER, seed=0, step=4, batch_size=6, seq_len=100, task=everything)
    np.testing.assert_array_equal(x, needle.batch_at(FILLER, seed=0, step=4, batch_size=6, seq_len=100,
                                                     task=TASK)[0])  # the same documents as graded='answer'
    for row_x, row_y in zip(x, y):
        n, _, value = find_value(text(row_x))
        end = n + len(value) - 1  # the inputs hold the prompt and the answer but its last digit
        np.testing.assert_array_equal(row_y[: end - 1], row_x[1:end])  # every next byte is graded
        np.testing.assert_array_equal(row_y[n - 1: end], ascii_ids(value))  # the answer's digits too
        assert np.all(row_y[end:] == IGNORED)  # the padding is not
    with pytest.raises(ValueError, match="graded='some' is not known"):
        needle.NeedleTask(graded="some")


def test_document_grid_cells_have_their_length_and_depth():
    grid = needle.document_grid(FILLER, [64, 100], [0.0, 1.0], per_cell=3, seed=1)
    assert len(grid) == 2 and all(len(row) == 2 and all(len(cell) == 3 for cell in row) for row in grid)
    assert {len(d.prompt) for d in grid[1][0]} == {100}
    assert all(d.needle_start == 0 for d in grid[0][0])
    assert all(text(d.prompt[d.value_start + 5:]).startswith(". \nWhat is") for d in grid[1][1])  # depth 1


# --- configs/needle.py ---------------------------------------------------------------------------


def test_configs_needle_trains_on_the_answer_digits_only():
    """The batches a configs/needle.py run trains on (the loop's own `training_batches`, with whatever the
    config's data section adds to the task's rows) carry loss at exactly the answer's digits."""
    config = needle_config.get_config()
    fake_run = types.SimpleNamespace(config=config, task=data_task(config), train_tokens=FILLER, host=0, hosts=1)
    with training_batches(fake_run, 0) as batches:
        x, y = next(batches)
    assert x.shape == (config.train.batch_size, config.train.seq_len)
    assert_only_the_answer_is_graded(x, y, config.data.needle.min_length, config.data.needle.max_length)


def test_a_needle_config_needs_byte_tokens_and_room_for_the_answer():
    """configs/needle.py's task refuses a BPE tokenizer and a train.seq_len short of its longest row."""
    config = needle_config.get_config()
    config.data.tokenizer = "bpe"
    with pytest.raises(ValueError, match="data.task='needle' needs data.tokenizer='bytes'"):
        data_task(config)
    config = needle_config.get_config()
    config.train.seq_len = 131  # the longest prompt (128) and its 5 digits, less the last one, need 132
    with pytest.raises(ValueError, match="train.seq_len=131 cannot hold .* set train.seq_len >= 132"):
        data_task(config)


TINY = ["--config.model.d_model=32", "--config.model.num_layers=2", "--config.model.num_heads=2",
        "--config.model.mlp_dim=64", "--config.model.max_seq_len=128", "--config.data.needle.max_length=96",
        "--config.train.seq_len=100", "--config.train.batch_size=4", "--config.train.steps=3",
        "--config.train.log_every=1", "--config.train.eval_every=3", "--config.train.eval_batches=1",
        "--config.train.checkpoint_every=3", "--config.optim.warmup_steps=1"]


@pytest.mark.slow
def test_configs_needle_trains_from_the_command_line(tmp_path):
    """train.py runs configs/needle.py end to end: it logs each step's loss, evaluates and saves the
    config it ran. (Which targets carry the loss: test_configs_needle_trains_on_the_answer_digits_only.)"""
    out = run(tmp_path / "run", *TINY, config=os.path.join(ROOT, "configs", "needle.py"))
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3]
    assert all(math.isfinite(r["loss"]) for r in rows if "loss" in r)
    assert any("val_loss" in r and math.isfinite(r["val_loss"]) for r in rows)
    saved = json.load(open(tmp_path / "run" / "config.json"))
    assert saved["data"]["task"] == "needle" and saved["data"]["needle"]["graded"] == "answer"
    assert saved["model"]["position"] == "rope"


# --- retrieval.py ----------------------------------------------------------------------------

# 3 layers, so that an ablation in the middle one has layers before and after it. max_seq_len 64 keeps
# every prompt (56-59 tokens) and its answer in generate's smallest bucket: one compiled program.
CFG = ModelConfig(vocab_size=256, max_seq_len=64, d_model=32, num_layers=3, num_heads=2, mlp_dim=64,
                  position="rope")


@pytest.fixture(scope="module")
def params():
    return random_params(Decoder(CFG))  # far from the initialiser's scale: attention is far from uniform


# A retriever that reads only the first SINK and the last WINDOW tokens of a prompt (attention sinks and a
# sliding window). With the needle (29 bytes: the value at offsets 22-26) and the question (28 bytes):
#   length 57 (no filler): the value at 22..26, all read (22-25 in the sink, 23-26 in the window);
#   length 97 (40 filler bytes): depth 0, the value at 22..26: digit 4 (at 26) is missed;
#                                depth 0.5, at 42..46: every digit is missed;
#                                depth 1, at 62..66: digit 0 (at 62, the window starts at 63) is missed.
SINK, WINDOW = 26, 34
LENGTHS, DEPTHS = [57, 97], [0.0, 0.5, 1.0]
MISSED = [[[], [], []], [[4], [0, 1, 2, 3, 4], [0]]]  # [length][depth]: the digits the reader cannot see
GUESS = ord("0")  # what it writes for a digit it cannot see


def windowed_reader(asked_mask):
    """A stand-in for `generate` (its signature and output) whose greedy answer is the windowed
    retriever's: it finds the needle of the question's key in the prompt's text and copies the value's
    digits it can see, writing GUESS for the others. Checks it is asked for greedy answers of the value's
    length under `asked_mask`."""

    def generate(params, cfg, prompts, key, max_new_tokens, edits=(), **sampling):
        assert sampling == {"temperature": 0.0} and [e.name for e in edits] == ["blocks.*.attn.z"]
        np.testing.assert_array_equal(edits[0].scale[:, 0, 0, :, 0], asked_mask)  # ablate_heads(cfg, asked_mask)
        rows = []
        for prompt in prompts:
            _, start, value = find_value(text(prompt))
            assert max_new_tokens == len(value)
            rows.append([prompt[p] if p < SINK or p >= len(prompt) - WINDOW else GUESS
                         for p in range(start, start + len(value))])
        return GenerateOutput(tokens=np.array(rows, np.int32), lengths=np.full(len(rows), max_new_tokens, np.int32))

    return generate


def test_accuracy_grid_counts_exact_matches_of_the_greedy_answers(params, monkeypatch):
    """accuracy_grid over documents of two lengths x three depths, answered by the windowed reader, against a
    count by construction: a document is answered right when every digit the reader misses happens to be
    GUESS. The grid is right in some cells, wrong in others, and in between in the cells where it misses one
    digit (the first or the last): a constant, transposed or per-digit grid, or one that grades some of the
    digits only, differs."""
    mask = retrieval.ablation_mask(CFG, [(1, 0)])
    monkeypatch.setattr(retrieval, "generate", windowed_reader(mask))
    grid = needle.document_grid(FILLER, LENGTHS, DEPTHS, per_cell=20)  # no model reads them: 97 > 64 is fine
    expected = np.array([[np.mean([all(d.answer[i] == GUESS for i in MISSED[r][c]) for d in cell])
                          for c, cell in enumerate(row)] for r, row in enumerate(grid)])
    # Some values but not all end (start) in GUESS, and the two cells differ: a grid with its depths reversed does too.
    assert 0 < expected[1, 0] < 1 and 0 < expected[1, 2] < 1 and expected[1, 0] != expected[1, 2]
    np.testing.assert_array_equal(retrieval.accuracy_grid(params, CFG, grid, head_mask=mask), expected)


# The references below read the model by full forward passes without a cache, on rows right-padded to
# max_seq_len (one compiled program): the model is causal, so the padding changes nothing before it.
NO_MASK = np.ones((CFG.num_layers, CFG.num_heads), np.float32)


@jax.jit
def padded_forward(params, tokens, head_mask):
    """tokens int32 [B, max_seq_len] -> logits [B, T, V] and attention weights [L, B, H, T, T]."""
    logits, _, got = capture(params, CFG, tokens, ["blocks.*.attn.pattern"], edits=[ablate_heads(CFG, head_mask)])
    return logits, got["blocks.*.attn.pattern"]


def padded(rows) -> jax.Array:
    out = np.zeros((len(rows), CFG.max_seq_len), np.int32)
    for b, row in enumerate(rows):
        out[b, : len(row)] = row
    return jnp.asarray(out)


def greedy_reference(params, prompts, steps: int, head_mask=NO_MASK) -> list[list[int]]:
    """Greedy decoding, each next token the argmax of a full forward pass: the reference for `generate`."""
    rows = [list(p) for p in prompts]
    for _ in range(steps):
        logits = np.asarray(padded_forward(params, padded(rows), head_mask)[0])
        for b, row in enumerate(rows):
            row.append(int(np.argmax(logits[b, len(row) - 1])))
    return [row[len(p):] for row, p in zip(rows, prompts)]


def test_answers_are_greedy_decoding_of_the_masked_model(params):
    """`answers` (what accuracy_grid grades) is each prompt's greedy continuation by the value's number
    of digits, under the head mask; prompts of two lengths share the call."""
    docs = [needle.make_document(FILLER, np.random.default_rng(1), 59, 0.3),
            needle.make_document(FILLER, np.random.default_rng(2), 57, 0.8)]
    mask = retrieval.ablation_mask(CFG, [(0, 1), (2, 0)])
    want = greedy_reference(params, [d.prompt for d in docs], 5, mask)
    got = retrieval.answers(params, CFG, docs, mask)
    assert got.shape == (2, 5) and got.tolist() == want
    unmasked = retrieval.answers(params, CFG, docs, NO_MASK)  # (a mask of ones: the program compiled above)
    assert unmasked.tolist() == greedy_reference(params, [d.prompt for d in docs], 5)
    assert unmasked.tolist() != want  # the ablation changes these answers: the mask reached the model


def test_the_score_of_a_hand_built_pattern():
    # 1 layer, 2 documents, 3 heads, 2 answer steps, 6 keys. The value's digits sit at keys 2, 3 (doc 0)
    # and 4, 5 (doc 1). Doc 1's second step is not a copy (the model wrote another digit): it never counts.
    L, B, H, A, S = 1, 2, 3, 2, 6
    attention = np.full((L, B, H, A, S), 0.01, np.float32)
    value_positions = np.array([[2, 3], [4, 5]])
    copied = np.array([[True, True], [True, False]])
    argmax = {  # head -> the key each (document, step) attends to most
        0: [[2, 3], [4, 5]],  # always on the copied digit: 3 of 3 counted steps
        1: [[2, 0], [0, 5]],  # one hit; its hit at doc 1 step 1 is not a counted step: 1 of 3
        2: [[3, 2], [5, 4]],  # on the value, but the other digit: 0 of 3
    }
    for h, rows in argmax.items():
        for b in range(B):
            for a in range(A):
                attention[0, b, h, a, rows[b][a]] = 0.9
    scores = retrieval.score_from_attention(jnp.asarray(attention), value_positions, copied)
    np.testing.assert_allclose(scores, [[1.0, 1 / 3, 0.0]])
    per_step = retrieval.score_from_attention(jnp.asarray(attention), value_positions, copied, per_step=True)
    np.testing.assert_allclose(per_step, [[[1.0, 1.0], [0.5, 0.0], [0.0, 0.0]]])  # step 1 counts once: doc 0


def argmax_on_the_digit(params, docs, said) -> np.ndarray:
    """Whether each head's largest attention weight at answer step i lands on the value's i-th digit in
    the needle, each prompt read with the model's answer `said` [B, digits] fed after it: bool [L, B, H, digits]."""
    _, attention = padded_forward(params, padded([np.concatenate([d.prompt, s[:-1]]) for d, s in zip(docs, said)]),
                                  NO_MASK)
    hits = []
    for b, (doc, answer) in enumerate(zip(docs, said)):
        n, digits = len(doc.prompt), len(answer)  # queries n - 1 .. n + digits - 2 write the answer's digits
        top = np.argmax(np.asarray(attention)[:, b, :, n - 1: n - 1 + digits], axis=-1)  # [L, H, digits]
        hits.append(top == doc.value_start + np.arange(digits))
    return np.stack(hits, axis=1)


def test_retrieval_scores_read_the_answer_steps(params, monkeypatch):
    """Against each head's argmax read from the Decoder's attention: the score is the fraction of the
    answer steps the model copies (its token is the value's digit) at which the head looks at that digit."""
    docs = needle.document_grid(FILLER, [58], [0.5], per_cell=4)[0][0]
    more = needle.document_grid(FILLER, [57], [0.5], per_cell=2)[0][0]

    def model_says(answer_of):  # the random model rarely writes a right digit: it is made to answer answer_of(d)
        monkeypatch.setattr(retrieval, "answers", lambda p, c, batch, mask=None: np.stack(list(map(answer_of, batch))))
        return [answer_of(d) for d in docs + more]

    # Right at every step: every step counts, and each step of each document weighs the same.
    said = model_says(lambda d: d.answer)
    hits = argmax_on_the_digit(params, docs + more, said)  # [L, 6, H, 5]
    assert hits.any() and not hits.all()
    scores = retrieval.retrieval_scores(params, CFG, docs, batch_size=2)
    assert scores.shape == (3, 2)
    np.testing.assert_allclose(scores, hits[:, :4].mean(axis=(1, 3)))
    np.testing.assert_allclose(retrieval.retrieval_scores(params, CFG, docs, batch_size=2, per_step=True),
                               hits[:, :4].mean(axis=1))
    np.testing.assert_allclose(retrieval.retrieval_scores(params, CFG, docs + more, batch_size=2),
                               hits.mean(axis=(1, 3)))  # two lengths: documents, not length groups, weigh

    # Digit 2 wrong in every document, digit 4 wrong in the first: only the steps copied count.
    def mistaken(d):
        wrong = d.answer.copy()
        for i in [2, 4] if d is docs[0] else [2]:
            wrong[i] = ord("0") + (wrong[i] - ord("0") + 1) % 10  # another digit
        return wrong

    said = model_says(mistaken)
    copied = np.stack([s == d.answer for s, d in zip(said, docs + more)])[None, :, None]  # [1, 6, 1, 5]
    hits = argmax_on_the_digit(params, docs + more, said) & copied
    np.testing.assert_allclose(retrieval.retrieval_scores(params, CFG, docs + more, batch_size=2),
                               hits.sum(axis=(1, 3)) / copied.sum())
    per_step = retrieval.retrieval_scores(params, CFG, docs + more, batch_size=2, per_step=True)
    np.testing.assert_allclose(per_step, hits.sum(axis=1) / np.maximum(copied.sum(axis=1), 1))
    assert not per_step[..., 2].any()

    # Wrong everywhere: no step counts.
    model_says(lambda d: (d.answer + 1) % 256)
    np.testing.assert_array_equal(retrieval.retrieval_scores(params, CFG, docs, batch_size=2), np.zeros((3, 2)))


def test_ablating_a_head_changes_what_uses_it_and_nothing_else(params):
    tokens = jnp.asarray(needle.make_document(FILLER, np.random.default_rng(0), 59, 0.5).prompt[None])
    forward = jax.jit(lambda mask: capture(params, CFG, tokens, ["blocks.*.attn.pattern"], edits=[ablate_heads(CFG, mask)]))
    logits, _, attention = forward(jnp.ones((3, 2)))
    mask = retrieval.ablation_mask(CFG, [(1, 0)])
    assert mask.tolist() == [[1, 1], [0, 1], [1, 1]]
    ablated_logits, _, ablated = forward(mask)
    attention, ablated = attention["blocks.*.attn.pattern"], ablated["blocks.*.attn.pattern"]
    np.testing.assert_array_equal(ablated[:2], attention[:2])  # layers 0 and 1 read nothing layer 1's head writes
    assert not np.allclose(ablated[2], attention[2])  # layer 2 reads the residual stream that lost it
    assert not np.allclose(ablated_logits, logits)
