"""The ablation experiment (transformer/analysis/ablation.py): the ranking, the random sets outside the
top k (all of them where there are few), the empirical p-value of a hand-built case, and that an
ablation removes exactly the heads it is given and nothing else."""

import itertools

import jax.numpy as jnp
import numpy as np
import pytest

from transformer.analysis import ablation
from transformer.experiments.recall import retrieval

# A hand-built model of 2 layers x 3 heads: removing a set of heads costs the sum of their harms.
HARM = np.array([[1, 3, 0], [2, 4, 7]])
# The ranking being tested, deliberately not the harm's order: (0,0) first, then (1,2), (1,0), (0,1), then the
# tie (0,2) = (1,1) in (layer, head) order.
SCORES = np.array([[0.9, 0.2, 0.1], [0.3, 0.1, 0.8]])


def evaluate(heads):
    """Two cells: the first is 10 minus the harm of the heads removed; the second, which `where` leaves
    out, would reverse every comparison."""
    harm = sum(HARM[h] for h in heads)
    return np.array([10.0 - harm, float(harm)])


def test_heads_are_ranked_by_score_ties_in_order():
    assert ablation.ranked_heads(SCORES) == [(0, 0), (1, 2), (1, 0), (0, 1), (0, 2), (1, 1)]


def test_the_p_value_of_a_hand_built_case():
    """k = 1: top (0,0) costs 1 (accuracy 9); the 5 other heads, all taken since 5 <= 20 draws, cost
    7, 2, 3, 0, 4 -> accuracies 3, 8, 7, 10, 6, of which 4 are <= 9: p = (1 + 4) / (5 + 1).
    k = 2: top (0,0)+(1,2) costs 8 (2); the 6 pairs of (1,0), (0,1), (0,2), (1,1) cost 5, 2, 6, 3, 7, 4
    -> 5, 8, 4, 7, 3, 6: none <= 2: p = 1 / 7, the smallest 6 draws can give.
    k = 3: top costs 10 (0); the one set left, (0,1)+(0,2)+(1,1), costs 7 (3): p = 1 / 2."""
    result = ablation.top_k_against_random(evaluate, SCORES, ks=[1, 2, 3], draws=20, rng=np.random.default_rng(0),
                                           where=np.array([True, False]))
    assert result.top == (((0, 0),), ((0, 0), (1, 2)), ((0, 0), (1, 2), (1, 0)))
    assert [len(d) for d in result.drawn] == [5, 6, 1]
    np.testing.assert_array_equal(result.top_accuracy(), [9, 2, 0])
    assert sorted(result.random_accuracy(0).tolist()) == [3, 6, 7, 8, 10]
    assert sorted(result.random_accuracy(1).tolist()) == [3, 4, 5, 6, 7, 8]
    np.testing.assert_allclose(result.p_values(), [5 / 6, 1 / 7, 1 / 2])
    assert result.intact_accuracy() == 10
    row = result.table()[0]
    assert row["k"] == 1 and row["top"] == 9 and row["draws"] == 5 and row["p"] == pytest.approx(5 / 6)
    assert row["random_mean"] == pytest.approx(34 / 5) and row["random_std"] == pytest.approx(np.std([3, 6, 7, 8, 10], ddof=1))
    assert (row["random_min"], row["random_max"]) == (3, 10)
    assert result.random_accuracy(0)[result.median_draw(0)] == 7  # the median of 3, 6, 7, 8, 10
    # Counting the left-out cell too would change the answer: `where` is what decides.
    everything = ablation.top_k_against_random(evaluate, SCORES, ks=[1], draws=20, rng=np.random.default_rng(0))
    assert everything.p_values()[0] != pytest.approx(5 / 6)


def test_the_p_value_counts_ties_as_at_least_as_harmful():
    assert ablation.empirical_p_value(0.5, np.array([0.5, 0.4, 0.9, 1.0])) == (1 + 2) / (4 + 1)
    assert ablation.empirical_p_value(0.1, np.array([0.5, 0.4])) == 1 / 3  # none as harmful: the add-one floor
    with pytest.raises(ValueError, match="no random draws"):
        ablation.empirical_p_value(0.1, np.array([]))


def test_random_sets_are_distinct_outside_the_top_k_and_all_of_them_when_few():
    pool = [(l, h) for l in range(4) for h in range(8)][3:]  # 29 heads: the top 3 of 32 left out
    drawn = ablation.random_subsets(pool, 3, 20, np.random.default_rng(1))
    assert len(drawn) == 20 and len(set(drawn)) == 20
    assert all(len(set(s)) == 3 and set(s) <= set(pool) for s in drawn)
    assert ablation.random_subsets(pool, 3, 20, np.random.default_rng(1)) == drawn  # a function of the rng
    assert ablation.random_subsets(pool[:5], 2, 20, np.random.default_rng(1)) == list(itertools.combinations(pool[:5], 2))
    with pytest.raises(ValueError, match="cannot draw 6 heads from a pool of 5"):
        ablation.random_subsets(pool[:5], 6, 20, np.random.default_rng(1))


def test_every_evaluation_removes_the_heads_of_its_arm():
    """The experiment asks `evaluate` for no heads, then per k for exactly the top k and for random sets of k
    drawn outside them; 20 draws when there are more sets than that."""
    scores = np.arange(32.0).reshape(4, 8)
    calls = []
    result = ablation.top_k_against_random(lambda heads: calls.append(list(heads)) or np.array([1.0]), scores,
                                           ks=[1, 2, 4], draws=20, rng=np.random.default_rng(0))
    assert calls[0] == []
    ranked = ablation.ranked_heads(scores)
    assert ranked[0] == (3, 7)
    at = 1
    for i, k in enumerate([1, 2, 4]):
        assert calls[at] == ranked[:k] and list(result.top[i]) == ranked[:k]
        drawn = calls[at + 1: at + 21]
        assert [tuple(d) for d in drawn] == list(result.drawn[i]) and len({tuple(d) for d in drawn}) == 20
        assert all(len(d) == k and not set(d) & set(ranked[:k]) for d in drawn)
        at += 21
    assert len(calls) == at


def test_a_removed_head_is_zero_and_the_heads_beside_it_and_before_it_are_untouched():
    """ablation_mask(cfg, heads) through edits.ablate_heads: the heads asked have z = 0 in their layer, every
    other head of that layer and every head of the layers before it is bitwise what it was; a later layer
    reads the changed stream."""
    from tests.helpers.decoder import random_params
    from transformer.analysis.capture import capture
    from transformer.model.config import ModelConfig
    from transformer.model.decoder import Decoder
    from transformer.model.edits import ablate_heads

    cfg = ModelConfig(vocab_size=64, max_seq_len=16, d_model=32, num_layers=3, num_heads=4, position="rope")
    params = random_params(Decoder(cfg), seed=2)
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 64, (2, 12)))
    intact = capture(params, cfg, tokens, ["blocks.*.attn.z"])[2]["blocks.*.attn.z"]  # [L, B, T, H, Kv]
    heads = [(1, 0), (1, 2)]
    got = capture(params, cfg, tokens, ["blocks.*.attn.z"], edits=[ablate_heads(cfg, retrieval.ablation_mask(cfg, heads))])
    got = got[2]["blocks.*.attn.z"]
    assert retrieval.ablation_mask(cfg, heads).tolist() == [[1, 1, 1, 1], [0, 1, 0, 1], [1, 1, 1, 1]]
    np.testing.assert_array_equal(got[0], intact[0])
    np.testing.assert_array_equal(got[1][..., [0, 2], :], 0.0)
    np.testing.assert_array_equal(got[1][..., [1, 3], :], intact[1][..., [1, 3], :])
    assert np.abs(intact[1][..., [0, 2], :]).max() > 0.01  # they had an output to lose
    assert not np.allclose(got[2], intact[2])


def test_a_where_without_cells_is_refused():
    with pytest.raises(ValueError, match="at least one cell"):
        ablation.top_k_against_random(evaluate, SCORES, ks=[1], draws=3, rng=np.random.default_rng(0),
                                      where=np.array([False, False]))
