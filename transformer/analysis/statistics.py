"""The statistics every experiment's verdicts come from: a difference is claimed only from >= MIN_SEEDS
seeds of the experiment itself, with a bootstrap interval of the mean paired difference that excludes 0;
an empirical p-value is never below 1/(n+1), never printed as 0, and Holm-corrected when read with others.
"""

from __future__ import annotations

import numpy as np

MIN_SEEDS = 3


def paired_differences(new: np.ndarray, baseline: np.ndarray) -> np.ndarray:
    """new - baseline, float [seeds]: the two measured on the same seeds, in the same order."""
    new, baseline = np.asarray(new, dtype=float), np.asarray(baseline, dtype=float)
    if new.shape != baseline.shape or new.ndim != 1:
        raise ValueError(f"need one value per seed on both sides; got shapes {new.shape}, {baseline.shape}")
    return new - baseline


def bootstrap_interval(differences: np.ndarray, confidence: float = 0.95, resamples: int = 10_000,
                       seed: int = 0) -> tuple[float, float]:
    """The percentile bootstrap interval of the mean of `differences` [seeds] (seeded: deterministic)."""
    differences = np.asarray(differences, dtype=float)
    if differences.size == 0:
        raise ValueError("no differences to resample; measure at least one seed")
    draws = np.random.default_rng(seed).choice(differences, size=(resamples, differences.size))
    low, high = np.quantile(draws.mean(axis=1), [(1 - confidence) / 2, (1 + confidence) / 2])
    return float(low), float(high)


def verdict(differences: np.ndarray, lower_is_better: bool = True, confidence: float = 0.95) -> str:
    """'not established' under MIN_SEEDS seeds; 'no difference' when the interval holds 0; else 'better'/'worse'."""
    if np.size(differences) < MIN_SEEDS:
        return "not established"
    low, high = bootstrap_interval(differences, confidence)
    if low <= 0 <= high:
        return "no difference"
    return "better" if (high < 0) == lower_is_better else "worse"


def empirical_p_value(observed: float, drawn: np.ndarray) -> float:
    """(1 + #drawn at most `observed`) / (n + 1): how often n random draws [n] are at least as low; >= 1/(n+1)."""
    drawn = np.asarray(drawn, dtype=float)
    if drawn.size == 0:
        raise ValueError("no random draws to compare with; draw at least one")
    return float((1 + np.sum(drawn <= observed)) / (drawn.size + 1))


def format_p(p: float, draws: int) -> str:
    """'p <= 1/(draws+1)' at the smallest value `draws` draws can give, else 'p = 0.095' (2 significant digits)."""
    floor = 1 / (draws + 1)
    return f"p <= 1/{draws + 1}" if p <= floor * (1 + 1e-9) else f"p = {p:.2g}"


def holm(p_values: np.ndarray) -> np.ndarray:
    """Holm's step-down correction of m p-values [m] read together: the i-th smallest times (m - i), kept monotone."""
    p = np.asarray(p_values, dtype=float)
    order = np.argsort(p, kind="stable")
    scaled = np.minimum(1.0, np.maximum.accumulate(p[order] * (p.size - np.arange(p.size))))  # sorted
    return scaled[np.argsort(order)]  # back in the order given
