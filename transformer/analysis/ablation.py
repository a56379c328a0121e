"""Does a head matter? Remove the top-k heads of a ranking, and compare with removing k random heads.

    result = top_k_against_random(evaluate, scores, ks=range(1, 9), draws=20, rng=np.random.default_rng(0))
    result.table()       # per k: top-k accuracy, the random draws' mean and spread, add-one p-value

`evaluate(heads)` is the accuracy [...cells] with `heads` [(layer, head)] removed, counted only `where`
the intact model succeeds (a head cannot look harmless for breaking what already fails).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from transformer.analysis.statistics import empirical_p_value

Head = tuple[int, int]  # (layer, head)


@dataclass(frozen=True)
class Ablation:
    """Per ks[i]: the top and random head sets top[i], drawn[i]; their cells [...cells], [draws, ...cells]."""

    ks: tuple[int, ...]
    intact: np.ndarray
    where: np.ndarray
    top: tuple[tuple[Head, ...], ...]
    top_cells: np.ndarray
    drawn: tuple[tuple[tuple[Head, ...], ...], ...]
    drawn_cells: tuple[np.ndarray, ...]

    def accuracy(self, cells: np.ndarray) -> np.ndarray:
        """The mean over the counted cells of `cells` [..., *cells] -> [...]."""
        return np.asarray(cells)[..., self.where].mean(axis=-1)

    def intact_accuracy(self) -> float:
        return float(self.accuracy(self.intact))

    def top_accuracy(self) -> np.ndarray:
        """Accuracy with the top-k removed, float [len(ks)]."""
        return self.accuracy(self.top_cells)

    def random_accuracy(self, i: int) -> np.ndarray:
        """Accuracy of each random draw of ks[i] heads, float [draws]."""
        return self.accuracy(self.drawn_cells[i])

    def p_values(self) -> np.ndarray:
        """For each k, (1 + #random draws at least as harmful as the top-k) / (draws + 1): float [len(ks)]."""
        return np.array([empirical_p_value(self.top_accuracy()[i], self.random_accuracy(i)) for i in range(len(self.ks))])

    def median_draw(self, i: int) -> int:
        """The index of the random draw of ks[i] heads whose accuracy is the (lower) median."""
        accuracy = self.random_accuracy(i)
        return int(np.argsort(accuracy, kind="stable")[(len(accuracy) - 1) // 2])

    def table(self) -> list[dict]:
        """One row per k: k, top, random_mean, random_std (ddof 1), random_min, random_max, draws, p."""
        rows, top, p = [], self.top_accuracy(), self.p_values()
        for i, k in enumerate(self.ks):
            drawn = self.random_accuracy(i)
            rows.append(dict(k=k, top=float(top[i]), random_mean=float(drawn.mean()),
                             random_std=float(drawn.std(ddof=1)) if len(drawn) > 1 else 0.0,
                             random_min=float(drawn.min()), random_max=float(drawn.max()), draws=len(drawn),
                             p=float(p[i])))
        return rows


def ranked_heads(scores: np.ndarray) -> list[Head]:
    """Every head of scores [L, H], highest score first (ties in (layer, head) order)."""
    order = np.argsort(-np.asarray(scores), axis=None, kind="stable")
    return [tuple(int(i) for i in np.unravel_index(o, np.shape(scores))) for o in order]


def random_subsets(pool: Sequence[Head], k: int, draws: int, rng: np.random.Generator) -> list[tuple[Head, ...]]:
    """`draws` distinct sorted k-subsets of `pool`, uniformly; all of them when there are no more."""
    if not 1 <= k <= len(pool):
        raise ValueError(f"cannot draw {k} heads from a pool of {len(pool)}; lower k")
    if math.comb(len(pool), k) <= draws:
        return [tuple(c) for c in itertools.combinations(pool, k)]
    seen: list[tuple[Head, ...]] = []
    while len(seen) < draws:
        subset = tuple(sorted(pool[i] for i in rng.choice(len(pool), size=k, replace=False)))
        if subset not in seen:
            seen.append(subset)
    return seen


def top_k_against_random(evaluate: Callable[[list[Head]], np.ndarray], scores: np.ndarray, ks: Iterable[int],
                         draws: int, rng: np.random.Generator, where: np.ndarray | None = None) -> Ablation:
    """Runs the experiment (see the module docstring); `where` defaults to every cell."""
    ks = tuple(int(k) for k in ks)
    ranked = ranked_heads(scores)
    intact = np.asarray(evaluate([]), dtype=float)
    where = np.ones(intact.shape, bool) if where is None else np.asarray(where, bool)
    if where.shape != intact.shape or not where.any():
        raise ValueError(f"where has shape {where.shape} and {int(where.sum())} cells; give a bool mask of the "
                         f"cells' shape {intact.shape} with at least one cell")
    cells = lambda heads: np.asarray(evaluate(list(heads)), dtype=float)  # noqa: E731
    top, top_cells, drawn, drawn_cells = [], [], [], []
    for k in ks:
        top.append(tuple(ranked[:k]))
        drawn.append(tuple(random_subsets(ranked[k:], k, draws, rng)))
        top_cells.append(cells(top[-1]))
        drawn_cells.append(np.stack([cells(s) for s in drawn[-1]]))
    return Ablation(ks, intact, where, tuple(top), np.stack(top_cells), tuple(drawn), tuple(drawn_cells))
