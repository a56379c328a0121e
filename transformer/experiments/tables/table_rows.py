"""The table task (`data.task='tables'`): small classification tables drawn from a prior, as rows.

TabPFN's recipe (Hollmann et al. 2023): train once on many synthetic tables, then classify the rows of
a new table in one forward pass. A training example is one table of T = train.seq_len rows:

    rows    [B, T, F + 1] float32: row t's features (standardised with the table's training rows' mean
            and deviation, clipped to +-CLIP, zero-padded to F = max_features), then its label: a class
            id on the first n_train rows, UNLABELLED (-1) on the test rows
    targets [B, T] int32: a test row's class; IGNORED on the training rows

Each table draws its sizes, a generator (a Gaussian mixture, or a random MLP's score cut at quantiles),
then random scales, shifts, skews and orders, as real tables (`real_table`) have."""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from transformer.data.batches import IGNORED, host_rows
from transformer.data.tasks import DataTask

UNLABELLED = -1  # the label column of a test row (model/table.py reads the same value)
CLIP = 6.0  # standardised features are clipped to [-CLIP, CLIP]: a heavy tail must not dominate a row
EVAL_SEED = 2_000_003  # held-out tables draw from (EVAL_SEED, batch, row): never a training step's
REAL_TABLES = ("iris", "wine", "breast_cancer")  # scikit-learn's bundled tables (`real_table`)


@dataclass(frozen=True)
class TablePrior:
    """The tables a run trains on (`config.data.tables`): each size drawn uniformly from its range."""

    max_features: int = 32  # F: tables have 1..F features, zero-padded to F
    max_classes: int = 4  # C: tables have 2..C classes
    min_train_rows: int = 8  # labelled rows of a table: min_train_rows .. T - min_test_rows
    min_test_rows: int = 8
    mlp_share: float = 0.5  # the share of tables from the random-MLP generator; the rest are Gaussian mixtures
    min_separation: float = 0.5  # Gaussian mixtures: the class centres' spread, drawn in [min, max]
    max_separation: float = 3.0  # (in units of the clusters' own standard deviation)

    def __post_init__(self) -> None:
        if not 1 <= self.max_features:
            raise ValueError(f"data.tables.max_features={self.max_features} must be at least 1")
        if not 2 <= self.max_classes:
            raise ValueError(f"data.tables.max_classes={self.max_classes} must be at least 2")
        if self.min_train_rows < 1 or self.min_test_rows < 1:
            raise ValueError("data.tables.min_train_rows and min_test_rows must be at least 1")
        if not 0.0 <= self.mlp_share <= 1.0:
            raise ValueError(f"data.tables.mlp_share={self.mlp_share} must be in [0, 1]")
        if not 0.0 <= self.min_separation <= self.max_separation:
            raise ValueError("data.tables needs 0 <= min_separation <= max_separation")

    @classmethod
    def from_config(cls, tables: Any) -> TablePrior:
        """From a config's data.tables section (a ConfigDict or a dict)."""
        return cls(**{f.name: tables[f.name] for f in fields(cls) if f.name in tables})

    def check(self, seq_len: int, num_features: int, num_classes: int) -> None:
        """Raises unless seq_len rows hold min_train_rows + min_test_rows and the model reads the prior's tables."""
        if seq_len < self.min_train_rows + self.min_test_rows:
            raise ValueError(f"train.seq_len={seq_len} (rows per table) is below data.tables.min_train_rows + "
                             f"min_test_rows = {self.min_train_rows + self.min_test_rows}; raise it or lower those")
        if num_features != self.max_features or num_classes < self.max_classes:
            raise ValueError(f"the prior draws tables of up to {self.max_features} features and {self.max_classes} "
                             f"classes, but the model reads {num_features} features and {num_classes} classes; set "
                             f"model.num_features={self.max_features} and model.num_classes >= {self.max_classes}")


# ----------------------------------------------------------------------------- the prior


def _gaussian_mixture(rng: np.random.Generator, n: int, f: int, c: int, prior: TablePrior
                      ) -> tuple[np.ndarray, np.ndarray]:
    """n rows of f features from c classes, each 1-3 Gaussian clusters: x [n, f], y int [n]."""
    y = rng.choice(c, size=n, p=rng.dirichlet(np.full(c, 2.0)))
    clusters = int(rng.integers(1, 4))
    spread = rng.uniform(prior.min_separation, prior.max_separation)
    informative = rng.random(f) < rng.uniform(0.3, 1.0)  # the other features are noise for every class
    informative[rng.integers(f)] = True  # at least one
    centres = rng.normal(0.0, spread, (c, clusters, f)) * informative
    which = rng.integers(0, clusters, size=n)
    x = centres[y, which] + rng.normal(0.0, 1.0, (n, f)) * rng.uniform(0.5, 1.5, f)
    return x, y


def _random_mlp(rng: np.random.Generator, n: int, f: int, c: int) -> tuple[np.ndarray, np.ndarray]:
    """n rows of f correlated features classed by a random tanh MLP's score cut at c - 1 random quantiles."""
    x = rng.normal(0.0, 1.0, (n, f)) @ rng.normal(0.0, 1.0, (f, f)) / np.sqrt(f)
    hidden = int(rng.integers(4, 33))
    h = np.tanh(x @ rng.normal(0.0, 1.5, (f, hidden)) + rng.normal(0.0, 1.0, hidden))
    score = h @ rng.normal(0.0, 1.0, hidden) + rng.normal(0.0, rng.uniform(0.0, 0.5) * np.sqrt(hidden), n)
    cuts = np.quantile(score, np.sort(rng.uniform(0.1, 0.9, c - 1)))
    return x, np.searchsorted(cuts, score)


def draw_table(rng: np.random.Generator, n: int, prior: TablePrior) -> tuple[np.ndarray, np.ndarray]:
    """One table of n rows: raw features float [n, f <= max_features], classes int [n] in 0..c-1 (c <= max_classes)."""
    f = int(rng.integers(1, prior.max_features + 1))
    c = int(rng.integers(2, prior.max_classes + 1))
    x, y = _random_mlp(rng, n, f, c) if rng.random() < prior.mlp_share else _gaussian_mixture(rng, n, f, c, prior)
    skewed = rng.random(f) < 0.2  # log-normal features (sizes, counts)
    x = np.where(skewed, np.exp(np.clip(x, -10, 10) / 2), x)
    x = np.where(rng.random(f) < 0.1, np.round(x), x)  # integer-valued features
    x = x * np.exp(rng.normal(0.0, 1.0, f)) + rng.normal(0.0, 3.0, f)  # units and offsets
    return x[:, rng.permutation(f)], rng.permutation(c)[y]


# ----------------------------------------------------------------------------- rows


def table_rows(x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray, num_features: int
               ) -> np.ndarray:
    """x_train [n_train, f], y_train int [n_train], x_test [n_test, f] -> the model's rows float32
    [n_train + n_test, num_features + 1]: the labelled training rows, then the UNLABELLED test rows."""
    f = x_train.shape[1]
    if f > num_features:
        raise ValueError(f"the table has {f} features, more than the {num_features} the model reads; "
                         f"drop features, or train a model with model.num_features >= {f}")
    mean, std = x_train.mean(axis=0), x_train.std(axis=0)
    std = np.where(std > 1e-8 * (1.0 + np.abs(mean)), std, np.inf)  # a constant feature: 0 everywhere
    x = np.clip((np.concatenate([x_train, x_test]) - mean) / std, -CLIP, CLIP)
    rows = np.zeros((len(x), num_features + 1), np.float32)
    rows[:, :f] = x
    rows[:, -1] = np.concatenate([y_train, np.full(len(x_test), UNLABELLED)])
    return rows


def _table_row(seed: list[int], prior: TablePrior, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """The table drawn from `seed`: (rows [T, F + 1], targets int32 [T]: IGNORED on training rows)."""
    rng = np.random.default_rng(seed)
    n_train = int(rng.integers(prior.min_train_rows, seq_len - prior.min_test_rows, endpoint=True))
    x, y = draw_table(rng, seq_len, prior)
    rows = table_rows(x[:n_train], y[:n_train], x[n_train:], prior.max_features)
    targets = np.where(np.arange(seq_len) < n_train, IGNORED, y).astype(np.int32)
    return rows, targets


def batch_at(tokens: Any, *, seed: int, step: int, batch_size: int, seq_len: int, prior: TablePrior,
             host_index: int = 0, host_count: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Training batch `step` from (seed, step, row) alone (no text: `tokens` is unused): (rows float32
    [B / hosts, T, F + 1], targets int32 [B / hosts, T])."""
    rows, targets = zip(*(_table_row([seed, step, b], prior, seq_len)
                          for b in range(batch_size)[host_rows(batch_size, host_index, host_count)]))
    return np.stack(rows), np.stack(targets)


def eval_batches(tokens: Any, *, num_batches: int, batch_size: int, seq_len: int, prior: TablePrior,
                 host_index: int = 0, host_count: int = 1) -> list[tuple[np.ndarray, np.ndarray]]:
    """Held-out tables: `num_batches` batches as `batch_at` gives them, batch i drawn as step i of EVAL_SEED."""
    return [batch_at(tokens, seed=EVAL_SEED, step=i, batch_size=batch_size, seq_len=seq_len, prior=prior,
                     host_index=host_index, host_count=host_count) for i in range(num_batches)]


# ----------------------------------------------------------------------------- real tables


def real_table(name: str, num_features: int, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """A bundled table of scikit-learn (REAL_TABLES), checked to fit the model: (x float [n, f], y int [n])."""
    if name not in REAL_TABLES:
        raise ValueError(f"no bundled table {name!r}; use one of {', '.join(REAL_TABLES)}")
    try:
        from sklearn import datasets  # optional: only the real tables need it
    except ImportError:
        raise ImportError("the real tables come from scikit-learn: pip install -e '.[dev]' (or scikit-learn)") from None
    data = getattr(datasets, f"load_{name}")()
    x, y = np.asarray(data.data, np.float64), np.asarray(data.target, np.int64)
    check_fits(name, x, y, num_features, num_classes)
    return x, y


def check_fits(name: str, x: np.ndarray, y: np.ndarray, num_features: int, num_classes: int) -> None:
    """Raises unless the model reads table `name` (x [n, f], classes y [n] numbered 0..C-1)."""
    f, classes = x.shape[1], np.unique(y)
    if f > num_features:
        raise ValueError(f"table {name!r} has {f} features but the model was trained for at most {num_features}; "
                         f"select {num_features} of its features, or train a model with model.num_features >= {f} "
                         f"(and data.tables.max_features = {f})")
    if len(classes) > num_classes:
        raise ValueError(f"table {name!r} has {len(classes)} classes but the model was trained for at most "
                         f"{num_classes}; merge classes, or train a model with model.num_classes >= {len(classes)} "
                         f"(and data.tables.max_classes = {len(classes)})")
    if classes.min() < 0 or classes.max() >= num_classes:
        raise ValueError(f"table {name!r} has class ids {classes.tolist()}; number them 0..{num_classes - 1}")


def table_task(config: Any) -> DataTask:
    """data.task='tables': the prior of config.data.tables, checked against train.seq_len and the model."""
    prior = TablePrior.from_config(config.data.tables)
    model = config.model
    if model.get("inputs", "tokens") != "table":
        raise ValueError("data.task='tables' needs a table model: set model.inputs='table' (configs/tables.py)")
    prior.check(config.train.seq_len, model.num_features, model.num_classes)
    return DataTask(functools.partial(batch_at, prior=prior), functools.partial(eval_batches, prior=prior),
                    text=False)

