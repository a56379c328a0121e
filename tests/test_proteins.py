"""The protein families and contacts from attention (transformer/experiments/proteins/).

The generator: a Gibbs sampler over a Potts model whose couplings sit on a fold's contacts. Its samples
must reproduce the model's pair statistics (exact enumeration at L = 4; two chains started differently
at L = 8) and be a function of the seed. The evaluation: precision@k, APC, mutual information, the
causal map's alignment to residue pairs, the read-outs over heads, and the pseudo-likelihood fit.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer.data.batches import IGNORED
from transformer.experiments.proteins import contacts as cp
from transformer.experiments.proteins import families
from transformer.experiments.proteins.fold import contact_map, fold, separation_mask
from transformer.experiments.proteins.potts import (Q, draw_potts, exact_pair_frequencies, gibbs,
                                                    pair_frequencies)

SMALL = families.FamilySpec(families=3, train_families=1, min_length=12, max_length=16, sequences=300,
                            held_out=50, sweeps=5)


def largest_z(observed: np.ndarray, expected: np.ndarray, n: float) -> float:
    """The largest |observed - expected| over the binomial standard error sqrt(p (1 - p) / n) of the cells
    off the diagonal of [L, L, Q, Q] frequencies. p is floored at 10 / n: below 10 expected counts the
    normal approximation understates the tail, and the floor makes the check conservative (as the ceiling
    at 1 - 10 / n does)."""
    off = ~np.eye(observed.shape[0], dtype=bool)
    p = np.clip(expected[off], 10 / n, 1 - 10 / n)
    return float((np.abs(observed - expected)[off] / np.sqrt(p * (1 - p) / n)).max())


# --- the generator ---------------------------------------------------------------------------------------


def test_the_fold_is_a_self_avoiding_walk_and_its_contacts_are_long_range_neighbours():
    coords = fold(np.random.default_rng(0), 40)
    assert len({tuple(c) for c in coords}) == 40  # self-avoiding
    assert (np.abs(np.diff(coords, axis=0)).sum(axis=1) == 1).all()  # unit lattice steps
    contacts = contact_map(coords)
    i, j = np.nonzero(contacts)
    assert (contacts == contacts.T).all() and (np.abs(i - j) >= 6).all() and len(i) > 0
    assert (np.linalg.norm(coords[i] - coords[j], axis=1) < 1.5).all()


def test_gibbs_pair_frequencies_match_exact_enumeration_at_length_4():
    contacts = ~np.eye(4, dtype=bool)  # every pair coupled, strongly: a hard case for the sampler
    potts = draw_potts(np.random.default_rng(0), contacts, coupling=1.0, field=0.5)
    n = 20_000
    sampled = pair_frequencies(gibbs(potts, jax.random.key(0), n, sweeps=20))
    exact = exact_pair_frequencies(potts)
    assert np.allclose(exact.sum((-1, -2)), 1.0)
    # 12 x 400 cells: a correct sampler stays within 5 standard errors in each (p < 6e-7 a cell to pass 5,
    # so < 3e-3 for any of the 4,800).
    assert largest_z(sampled, exact, n) < 5.0
    wrong = exact_pair_frequencies(potts._replace(couplings=potts.couplings * 0.8))  # 20% weaker couplings
    assert largest_z(sampled, wrong, n) > 10.0  # the check sees a small error in the model


def test_two_chains_started_differently_agree_on_pair_statistics():
    contacts = contact_map(fold(np.random.default_rng(1), 24))
    potts = draw_potts(np.random.default_rng(2), contacts)
    n = 10_000
    uniform = pair_frequencies(gibbs(potts, jax.random.key(0), n, sweeps=50))  # the config's sweeps
    all_first = pair_frequencies(gibbs(potts, jax.random.key(1), n, 50, start=jnp.zeros((n, 24), jnp.int32)))
    # The difference of two independent estimates has twice the variance: n / 2 samples' worth. 552 x 400
    # cells: one normal passes 6 with p = 2e-9, so all 220,800 stay below 6 but with p < 5e-4 (Bonferroni);
    # two chains from the same start reach 5.4 (the largest of many cells), 30 sweeps from these starts 6.0.
    assert largest_z(uniform, all_first, n / 2) < 6.0
    unmixed = pair_frequencies(gibbs(potts, jax.random.key(1), n, 0, start=jnp.zeros((n, 24), jnp.int32)))
    assert largest_z(uniform, unmixed, n / 2) > 10.0


def test_a_family_is_a_function_of_its_seed_and_index():
    first = families.family(SMALL, 0)
    families.family.cache_clear()
    again = families.family(SMALL, 0)
    assert first is not again and (first.sequences == again.sequences).all() and (first.coords == again.coords).all()
    other = families.family(SMALL, 1)
    assert first.sequences.shape != other.sequences.shape or (first.sequences != other.sequences).any()
    assert first.sequences.shape == (300, len(first.coords)) and 12 <= len(first.coords) <= 16


def test_rows_put_the_start_token_first_and_ignore_the_padding():
    inputs, targets = families.rows([np.array([3, 4, 5]), np.array([7, 8, 9, 10])], seq_len=5)
    assert inputs.tolist() == [[Q, 3, 4, Q, Q], [Q, 7, 8, 9, Q]]
    assert targets.tolist() == [[3, 4, 5, IGNORED, IGNORED], [7, 8, 9, 10, IGNORED]]


def test_training_batches_are_seeded_and_validation_reads_only_the_held_out_sequences():
    a = families.batch_at(None, seed=0, step=3, batch_size=8, seq_len=16, spec=SMALL)
    b = families.batch_at(None, seed=0, step=3, batch_size=8, seq_len=16, spec=SMALL)
    assert all((x == y).all() for x, y in zip(a, b))
    held_out = {tuple(s) for i in range(3) for s in families.family(SMALL, i).sequences[-50:].tolist()}
    for _, targets in families.eval_batches(None, num_batches=2, batch_size=6, seq_len=16, spec=SMALL):
        assert all(tuple(t[t != IGNORED].tolist()) in held_out for t in targets)


def test_the_task_refuses_a_row_too_short_for_a_family():
    from configs.proteins import get_config
    from transformer.experiments.catalog import data_task

    config = get_config()
    config.train.seq_len = 32
    with pytest.raises(ValueError, match="train.seq_len=32 is below data.proteins.max_length=64"):
        data_task(config)
    with pytest.raises(ValueError, match="train_families < families"):
        families.FamilySpec(families=2, train_families=2)


# --- contacts --------------------------------------------------------------------------------------------


def test_precision_counts_the_contacts_among_the_top_pairs():
    length = 20
    contacts = np.zeros((length, length), bool)
    for i, j in [(0, 10), (2, 15), (3, 9), (5, 19)]:
        contacts[i, j] = contacts[j, i] = True
    scores = np.zeros((length, length))
    ranked = [(0, 10), (1, 12), (2, 15), (4, 18), (5, 19), (0, 2)]  # (0, 2): |i - j| < 6, never counted
    for rank, (i, j) in enumerate(ranked[::-1]):
        scores[i, j] = scores[j, i] = 1 + rank
    assert cp.precision(scores, contacts, 1) == 1.0  # (0, 10)
    assert cp.precision(scores, contacts, 4) == 2 / 4  # (0, 10), (1, 12), (2, 15), (4, 18)
    assert cp.precision(scores, contacts, 5) == 3 / 5


def test_apc_by_hand():
    s = np.array([[0.0, 2.0, 1.0], [2.0, 0.0, 3.0], [1.0, 3.0, 0.0]])
    # row sums 3, 5, 4; column sums the same; total 12: s_ij - r_i c_j / 12
    by_hand = s - np.outer([3, 5, 4], [3, 5, 4]) / 12
    assert np.allclose(cp.apc(s), by_hand) and np.isclose(cp.apc(s)[0, 1], 2 - 15 / 12)


def test_mutual_information_of_a_hand_made_alignment():
    x = np.array([[0, 0, 0], [1, 1, 0], [0, 0, 1], [1, 1, 1]] * 25)  # columns 0, 1 equal; 2 independent of both
    mi = cp.mutual_information(x, pseudocount=1e-12)
    assert np.isclose(mi[0, 1], np.log(2)) and np.isclose(mi[0, 2], 0.0, atol=1e-9) and mi[0, 0] == 0.0


def test_the_causal_map_is_read_as_the_pair_its_query_predicts():
    maps = np.zeros((8, 8))
    maps[7, 1] = 1.0  # the query predicting x_7 attends to the key holding x_0
    pairs = cp.attention_contacts(maps)
    raw = np.zeros((8, 8))
    raw[7, 0] = raw[0, 7] = 1.0
    assert np.allclose(pairs, cp.apc(raw)) and np.unravel_index(pairs.argmax(), pairs.shape) in {(0, 7), (7, 0)}


def test_best_head_and_regression_find_the_head_that_holds_the_contacts():
    pytest.importorskip("sklearn")
    rng = np.random.default_rng(0)
    truth = [contact_map(fold(rng, length)) for length in (30, 34, 32)]
    heads = [np.stack([rng.random(c.shape), c + 0.3 * rng.random(c.shape), rng.random(c.shape)]) for c in truth]
    assert cp.best_head(heads[:2], truth[:2]) == 1
    model = cp.head_regression(heads[:2], truth[:2])
    length = len(truth[2])
    assert cp.precision(cp.regression_scores(model, heads[2]), truth[2], length // 5) == 1.0
    assert cp.pairs(separation_mask(length)).all() and cp.pairs(truth[2]).sum() == truth[2].sum() // 2


def test_the_pseudolikelihood_fit_ranks_the_coupled_pairs_first():
    contacts = np.zeros((10, 10), bool)
    for i, j in [(0, 7), (1, 9), (2, 8)]:
        contacts[i, j] = contacts[j, i] = True
    potts = draw_potts(np.random.default_rng(0), contacts, coupling=1.0)
    x = gibbs(potts, jax.random.key(0), 2000, sweeps=20)
    scores = cp.apc(cp.pseudolikelihood_couplings(x, steps=100, batch=1000))
    assert cp.precision(scores, contacts, 3) == 1.0 and np.allclose(scores, scores.T, atol=1e-5)


@pytest.mark.slow
def test_the_protein_config_trains_through_the_catalog(tmp_path):
    from configs.proteins import get_config
    from transformer.experiments import catalog

    config = get_config()
    for name, value in dict(families=2, train_families=1, min_length=12, max_length=16, sequences=200,
                            held_out=20, sweeps=3).items():
        config.data.proteins[name] = value
    config.train.update(steps=3, batch_size=4, seq_len=16, eval_batches=1, eval_every=3, checkpoint_every=3,
                        log_every=1)
    config.model.update(d_model=16, num_layers=1, num_heads=2, mlp_dim=32, max_seq_len=16)
    config.optim.warmup_steps = 1
    result = catalog.train(config, str(tmp_path / "run"))
    assert np.isfinite(result["val_loss"]) and (tmp_path / "run" / "checkpoints" / "3").is_dir()
    assert not (tmp_path / "run" / "tokenizer").exists()
