"""Tests for transformer/data/needle.py (the documents and their batches), transformer/analysis/retrieval.py
(accuracy grid, retrieval score, ablation) and configs/needle.py through train.py."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers.cli import run
from tests.helpers.decoder import random_params
from transformer.analysis import retrieval
from transformer.data import needle
from transformer.data.batches import IGNORED
from transformer.model.config import ModelConfig
from transformer.model.decoder import Decoder
from transformer.sampling.sampler import generate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FILLER = np.frombuffer(b"the quick brown fox jumps over the lazy dog; " * 200, np.uint8).astype(np.int32)
TASK = needle.NeedleTask(min_length=64, max_length=96, digits=5)


def text(ids) -> str:
    return bytes(np.asarray(ids, np.uint8)).decode("ascii")


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
    x, y = needle.batch_at(FILLER, seed=0, step=4, batch_size=6, seq_len=100, task=TASK)
    assert x.shape == y.shape == (6, 100) and x.dtype == y.dtype == np.int32
    for row_x, row_y in zip(x, y):
        graded = np.flatnonzero(row_y != IGNORED)
        assert len(graded) == 5 and np.all(np.diff(graded) == 1)  # the answer's digits, in a row
        n = graded[0] + 1  # the prompt's length: its last token predicts the first digit
        assert TASK.min_length <= n <= TASK.max_length
        assert text(row_x[n - len("? "): n]) == "? "  # the prompt ends with the question
        np.testing.assert_array_equal(row_x[graded[1:]], row_y[graded[:-1]])  # teacher forcing
        assert text(row_y[graded]) in text(row_x[:n])  # the answer is written in the document
    np.testing.assert_array_equal(x, needle.batch_at(FILLER, seed=0, step=4, batch_size=6, seq_len=100, task=TASK)[0])
    assert not np.array_equal(x, needle.batch_at(FILLER, seed=0, step=5, batch_size=6, seq_len=100, task=TASK)[0])
    halves = [needle.batch_at(FILLER, seed=0, step=4, batch_size=6, seq_len=100, task=TASK, host_index=h,
                              host_count=2)[0] for h in (0, 1)]
    np.testing.assert_array_equal(np.concatenate(halves), x)
    evals = needle.eval_batches(FILLER, num_batches=2, batch_size=6, seq_len=100, task=TASK)
    assert len(evals) == 2 and not np.array_equal(evals[0][0], evals[1][0])
    np.testing.assert_array_equal(evals[1][1], needle.eval_batches(FILLER, num_batches=2, batch_size=6, seq_len=100,
                                                                   task=TASK)[1][1])


def test_graded_all_grades_every_byte_of_the_document_and_not_the_padding():
    everything = needle.NeedleTask(min_length=64, max_length=96, graded="all")
    x, y = needle.batch_at(FILLER, seed=0, step=4, batch_size=6, seq_len=100, task=everything)
    _, answer_only = needle.batch_at(FILLER, seed=0, step=4, batch_size=6, seq_len=100, task=TASK)
    for row_x, row_y, row_answer in zip(x, y, answer_only):
        n = np.flatnonzero(row_answer != IGNORED)[-1] + 1  # the document's tokens but the last
        np.testing.assert_array_equal(row_y[: n - 1], row_x[1:n])  # every next byte is graded
        assert np.all(row_y[n:] == IGNORED)  # the padding is not
        graded = row_answer != IGNORED
        np.testing.assert_array_equal(row_y[graded], row_answer[graded])  # the same document
    with pytest.raises(ValueError, match="graded='some' is not known"):
        needle.NeedleTask(graded="some")


def test_document_grid_cells_have_their_length_and_depth():
    grid = needle.document_grid(FILLER, [64, 100], [0.0, 1.0], per_cell=3, seed=1)
    assert len(grid) == 2 and all(len(row) == 2 and all(len(cell) == 3 for cell in row) for row in grid)
    assert {len(d.prompt) for d in grid[1][0]} == {100}
    assert all(d.needle_start == 0 for d in grid[0][0])
    assert all(text(d.prompt[d.value_start + 5:]).startswith(". \nWhat is") for d in grid[1][1])  # depth 1


# --- retrieval.py ----------------------------------------------------------------------------

# 3 layers, so that an ablation in the middle one has layers before and after it. max_seq_len 64 keeps
# every prompt (56-59 tokens) and its answer in generate's smallest bucket: one compiled program.
CFG = ModelConfig(vocab_size=256, max_seq_len=64, d_model=32, num_layers=3, num_heads=2, mlp_dim=64,
                  position="rope")


@pytest.fixture(scope="module")
def params():
    return random_params(Decoder(CFG))  # far from the initialiser's scale: attention is far from uniform


def test_accuracy_grid_has_the_grid_shape_and_counts_exact_matches(params):
    grid = needle.document_grid(FILLER, [57, 59], [0.1, 0.5, 0.9], per_cell=2)
    accuracy = retrieval.accuracy_grid(params, CFG, grid)
    assert accuracy.shape == (2, 3)
    for i, row in enumerate(grid):
        for j, cell in enumerate(row):
            got = retrieval.answers(params, CFG, cell)
            assert got.shape == (2, 5)
            assert accuracy[i, j] == np.mean([np.array_equal(g, d.answer) for g, d in zip(got, cell)])
    np.testing.assert_allclose(retrieval.standard_error(np.array([0.5, 1.0]), 100), [0.05, 0.0])


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


def test_retrieval_scores_read_the_answer_steps(params, monkeypatch):
    # The random model rarely writes a right digit, so it is made to answer right (every step counts)
    # and the score then says how often each head's argmax lands on the digit being copied.
    monkeypatch.setattr(retrieval, "answers", lambda p, c, docs, mask=None: np.stack([d.answer for d in docs]))
    docs = needle.document_grid(FILLER, [58], [0.5], per_cell=4)[0][0]
    scores = retrieval.retrieval_scores(params, CFG, docs, batch_size=2)
    tokens = np.stack([np.concatenate([d.prompt, d.answer[:-1]]) for d in docs])
    _, _, attention = Decoder(CFG).apply({"params": params}, tokens, return_attention=True)
    top = np.argmax(np.asarray(attention)[:, :, :, 57:62], axis=-1)  # [L, B, H, 5]: queries 57..61 write the answer
    want = np.array([[d.value_start + i for i in range(5)] for d in docs])
    expected = (top == want[None, :, None]).mean(axis=(1, 3))  # [L, H]: every one of the 20 steps counts
    assert scores.shape == (3, 2) and expected.any()
    np.testing.assert_allclose(scores, expected)
    per_step = retrieval.retrieval_scores(params, CFG, docs, per_step=True)  # [L, H, 5]
    np.testing.assert_allclose(per_step, (top == want[None, :, None]).mean(axis=1))
    np.testing.assert_allclose(per_step.mean(-1), scores)  # every step counts as often here

    # Documents of several lengths: each answer step of each document weighs the same.
    more = needle.document_grid(FILLER, [57], [0.5], per_cell=2)[0][0]
    both = retrieval.retrieval_scores(params, CFG, docs + more, batch_size=2)
    np.testing.assert_allclose(both, (4 * scores + 2 * retrieval.retrieval_scores(params, CFG, more)) / 6)

    # A step the model gets wrong does not count.
    wrong = lambda p, c, docs, mask=None: np.stack([(d.answer + 1) % 256 for d in docs])  # noqa: E731
    monkeypatch.setattr(retrieval, "answers", wrong)
    np.testing.assert_array_equal(retrieval.retrieval_scores(params, CFG, docs), np.zeros((3, 2)))


def test_ablating_a_head_changes_what_uses_it_and_nothing_else(params):
    tokens = jnp.asarray(needle.make_document(FILLER, np.random.default_rng(0), 59, 0.5).prompt[None])
    forward = jax.jit(lambda mask: Decoder(CFG).apply({"params": params}, tokens, head_mask=mask,
                                                       return_attention=True))
    logits, _, attention = forward(jnp.ones((3, 2)))
    mask = retrieval.ablation_mask(CFG, [(1, 0)])
    assert mask.tolist() == [[1, 1], [0, 1], [1, 1]]
    ablated_logits, _, ablated = forward(mask)
    np.testing.assert_array_equal(ablated[:2], attention[:2])  # layers 0 and 1 read nothing layer 1's head writes
    assert not np.allclose(ablated[2], attention[2])  # layer 2 reads the residual stream that lost it
    assert not np.allclose(ablated_logits, logits)


def test_generate_with_a_head_mask_is_greedy_decoding_of_the_masked_model(params):
    doc = needle.make_document(FILLER, np.random.default_rng(1), 59, 0.3)
    mask = retrieval.ablation_mask(CFG, [(0, 1), (2, 0)])
    tokens = list(doc.prompt)
    for _ in range(4):  # the reference: full forward passes without a cache
        logits, _ = Decoder(CFG).apply({"params": params}, jnp.asarray([tokens]), head_mask=mask)
        tokens.append(int(jnp.argmax(logits[0, -1])))
    out = generate(params, CFG, [doc.prompt], jax.random.key(0), 4, head_mask=mask, temperature=0.0)
    assert out.tokens[0].tolist() == tokens[-4:]
    unmasked = generate(params, CFG, [doc.prompt], jax.random.key(0), 4, temperature=0.0)
    assert unmasked.tokens[0].tolist() != tokens[-4:]  # the mask changes these tokens: generate applied it


def test_top_and_random_heads():
    scores = np.array([[0.1, 0.9], [0.5, 0.0], [0.7, 0.2]])
    assert retrieval.top_heads(scores, 3) == [(0, 1), (2, 0), (1, 0)]
    drawn = retrieval.random_heads(CFG, 3, np.random.default_rng(0), exclude=[(0, 1), (2, 0)])
    assert len(set(drawn)) == 3 and not {(0, 1), (2, 0)} & set(drawn)
    with pytest.raises(ValueError, match="cannot draw 5 heads from the 4 left"):
        retrieval.random_heads(CFG, 5, np.random.default_rng(0), exclude=[(0, 1), (2, 0)])


# --- configs/needle.py through train.py ------------------------------------------------------

TINY = ["--config.model.d_model=32", "--config.model.num_layers=2", "--config.model.num_heads=2",
        "--config.model.mlp_dim=64", "--config.model.max_seq_len=128", "--config.data.needle.max_length=96",
        "--config.train.seq_len=100", "--config.train.batch_size=4", "--config.train.steps=3",
        "--config.train.log_every=1", "--config.train.eval_every=3", "--config.train.eval_batches=1",
        "--config.train.checkpoint_every=3", "--config.optim.warmup_steps=1"]


def test_configs_needle_trains_from_the_command_line(tmp_path):
    out = run(tmp_path / "run", *TINY, config=os.path.join(ROOT, "configs", "needle.py"))
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3]
    first = next(r for r in rows if "loss" in r)["loss"]
    assert 4.0 < first < 7.0  # a guess over 256 bytes (ln 256 = 5.5): the answer's digits, not the filler
    assert any("val_loss" in r for r in rows)
    saved = json.load(open(tmp_path / "run" / "config.json"))
    assert saved["data"]["task"] == "needle" and saved["model"]["position"] == "rope"


def test_a_needle_run_needs_byte_tokens_and_room_for_the_answer(tmp_path):
    needle_cfg = os.path.join(ROOT, "configs", "needle.py")
    out = run(tmp_path / "a", *TINY, "--config.data.tokenizer=bpe", config=needle_cfg)
    assert out.returncode == 1 and "data.task='needle' needs data.tokenizer='bytes'" in out.stderr
    out = run(tmp_path / "b", *TINY, "--config.data.task=puzzle", config=needle_cfg)
    assert out.returncode == 1 and "data.task='puzzle' is not known; use one of 'needle', 'text'" in out.stderr
