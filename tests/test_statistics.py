"""The statistics module (transformer/analysis/statistics.py): the add-one p-value and its printing, Holm's
correction against a hand-worked case, the bootstrap interval's coverage, and the verdict's refusals."""

import numpy as np
import pytest

from transformer.analysis import statistics


def test_the_p_value_is_never_below_one_over_n_plus_one():
    rng = np.random.default_rng(0)
    for n in (1, 5, 20, 200):
        drawn = rng.normal(size=n)
        assert statistics.empirical_p_value(drawn.min() - 1, drawn) == 1 / (n + 1)  # beyond every draw
        assert statistics.empirical_p_value(drawn.max() + 1, drawn) == 1.0  # below none
    # 20 draws, 3 of them at most the observed value (a tie counts): (1 + 3) / 21
    drawn = np.array([0.1, 0.3, 0.3] + [0.9] * 17)
    assert statistics.empirical_p_value(0.3, drawn) == pytest.approx(4 / 21)
    with pytest.raises(ValueError, match="no random draws"):
        statistics.empirical_p_value(0.0, np.array([]))


def test_a_p_value_is_never_printed_as_zero():
    assert statistics.format_p(1 / 21, 20) == "p <= 1/21"
    assert statistics.format_p(0.0, 20) == "p <= 1/21"  # a value below the floor is printed as the floor
    assert statistics.format_p(2 / 21, 20) == "p = 0.095"
    assert statistics.format_p(1.0, 20) == "p = 1"
    assert statistics.format_p(1 / 10_001, 10_000) == "p <= 1/10001"
    for p in np.linspace(1 / 1001, 1, 50):
        printed = statistics.format_p(p, 1000)
        assert printed.startswith("p <= 1/") or float(printed.removeprefix("p = ")) > 0


def test_holm_against_a_hand_worked_example():
    """m = 4: sorted 0.01, 0.02, 0.03, 0.5 -> 0.04, 0.06, 0.06 (0.03 x 2, raised to keep order), 0.5;
    returned in the input's order."""
    adjusted = statistics.holm([0.03, 0.5, 0.01, 0.02])
    np.testing.assert_allclose(adjusted, [0.06, 0.5, 0.04, 0.06])
    np.testing.assert_allclose(statistics.holm([0.2, 0.4]), [0.4, 0.4])
    np.testing.assert_allclose(statistics.holm([0.6, 0.9, 0.01]), [1.0, 1.0, 0.03])  # capped at 1
    # Twelve tests at the floor of 20 draws: none survives at 0.05.
    assert statistics.holm([1 / 21] * 12).min() > 0.05


def test_paired_differences_are_seed_by_seed():
    np.testing.assert_allclose(statistics.paired_differences([1.0, 2.0, 4.0], [0.5, 2.5, 3.0]), [0.5, -0.5, 1.0])
    with pytest.raises(ValueError, match="one value per seed"):
        statistics.paired_differences([1.0, 2.0], [1.0, 2.0, 3.0])


def test_the_bootstrap_interval_covers_the_true_mean_difference_most_of_the_time():
    rng = np.random.default_rng(1)
    covered = 0
    for _ in range(200):
        differences = rng.normal(0.3, 1.0, size=20)
        low, high = statistics.bootstrap_interval(differences, resamples=2000)
        covered += low <= 0.3 <= high
    assert 0.85 * 200 <= covered <= 0.99 * 200  # a 95% interval: about 190 of 200
    d = rng.normal(size=5)
    assert statistics.bootstrap_interval(d) == statistics.bootstrap_interval(d)  # seeded


def test_the_verdict_needs_three_seeds_and_an_interval_excluding_zero():
    assert statistics.verdict([-0.5, -0.6]) == "not established"  # two seeds, however clear
    assert statistics.verdict([-0.5, -0.6, -0.55]) == "better"  # lower loss
    assert statistics.verdict([-0.5, -0.6, -0.55], lower_is_better=False) == "worse"
    assert statistics.verdict([0.5, 0.6, 0.55]) == "worse"
    assert statistics.verdict([-0.5, 0.6, 0.1, -0.2]) == "no difference"
