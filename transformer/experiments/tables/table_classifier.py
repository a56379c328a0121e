"""A table model (ModelConfig(inputs='table')) as a classifier, against k-nearest neighbours and
logistic regression fitted on the same training rows, and its attention over the rows.

    predict(params, cfg, x_train, y_train, x_test)           # class probabilities [n_test, C]
    synthetic_accuracies(params, cfg, prior, tables=200)     # held-out tables of the prior
    real_accuracies(params, cfg, "wine", splits=20)          # scikit-learn's bundled tables
    summary(results)                                         # mean, spread, chance: one row per method
    row_attention(params, cfg, rows)                         # the last layer's weights over the rows
    lookup_statistics(...)                                   # does attention act as a nearest-neighbour look-up?

TABLE_ACCURACY is the training loop's evaluation metric for runs of the table task: `val_accuracy`, the
share of the held-out tables' test rows classified right.

Every method sees the same rows: the training rows (subsampled to `max_train_rows`, what fits the
model's context), standardised with their own mean and deviation (`tables.table_rows`); the test rows
are the rest. A test row sees the training rows and itself only, so the test rows are classified in
chunks of any size with the same result. scikit-learn (kNN, logistic regression, the real tables) is an
optional dependency: the `dev` and `notebooks` extras.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from transformer.analysis.capture import attention_maps
from transformer.experiments.tables import table_rows as tables
from transformer.model.config import ModelConfig
from transformer.model.decoder import Decoder
from transformer.training.eval_metrics import EvalMetric

METHODS = ("model", "knn", "logistic", "majority")  # majority: the training rows' most frequent class (chance)
PAD_TO = 64  # `predict` pads a table to a multiple of this many rows: one compile serves many tables


@functools.partial(jax.jit, static_argnums=1)
def _probabilities(params: Any, cfg: ModelConfig, rows: jax.Array) -> jax.Array:
    """rows [B, T, F + 1] -> softmax of the class logits [B, T, C]."""
    return jax.nn.softmax(Decoder(cfg).apply({"params": params}, rows)[0], axis=-1)


def predict(params: Any, cfg: ModelConfig, x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray,
            chunk: int = 128) -> np.ndarray:
    """The model's class probabilities [n_test, C] for x_test [n_test, f], given the training rows
    x_train [n, f] with classes y_train [n]: one forward pass per `chunk` test rows, each pass holding
    every training row (a test row sees no other, so the chunks do not change the result)."""
    rows = tables.table_rows(x_train, y_train, x_test, cfg.num_features)  # [n + n_test, F + 1]
    n = len(x_train)
    out = []
    for start in range(0, len(x_test), chunk):
        part = rows[n + start: n + start + chunk]
        # Padding up to a multiple of PAD_TO rows, so that few shapes compile: unlabelled rows, which
        # no other row sees (a row to classify), so they change nothing.
        padding = np.zeros((-(n + len(part)) % PAD_TO, part.shape[1]), np.float32)
        padding[:, -1] = tables.UNLABELLED
        batch = np.concatenate([rows[:n], part, padding])[None]  # [1, T, F + 1]
        out.append(np.asarray(_probabilities(params, cfg, batch))[0, n: n + len(part)])
    return np.concatenate(out)


def baselines(x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray, k: int = 5) -> dict[str, np.ndarray]:
    """{'knn': ..., 'logistic': ..., 'majority': ...}: the classes [n_test] that k-nearest neighbours
    (Euclidean, k neighbours, or fewer training rows) and logistic regression (scikit-learn's
    defaults: L2, C = 1) give, fitted on the training rows standardised as the model reads them,
    and the training rows' most frequent class (the chance line)."""
    from sklearn.linear_model import LogisticRegression  # optional: the dev and notebooks extras
    from sklearn.neighbors import KNeighborsClassifier

    rows = tables.table_rows(x_train, y_train, x_test, x_train.shape[1])
    train, test = rows[: len(x_train), :-1], rows[len(x_train):, :-1]
    knn = KNeighborsClassifier(min(k, len(train))).fit(train, y_train)
    if len(np.unique(y_train)) < 2:  # one class seen: logistic regression cannot be fitted; it is the answer
        logistic = np.full(len(test), y_train[0])
    else:
        logistic = LogisticRegression(max_iter=2000).fit(train, y_train).predict(test)
    majority = np.full(len(test), np.bincount(y_train).argmax())
    return {"knn": knn.predict(test), "logistic": logistic, "majority": majority}


def accuracies(params: Any, cfg: ModelConfig, x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray,
               y_test: np.ndarray) -> dict[str, float]:
    """{method: accuracy on the test rows} for the model and the two baselines on one split."""
    predicted = {"model": predict(params, cfg, x_train, y_train, x_test).argmax(-1),
                 **baselines(x_train, y_train, x_test)}
    return {m: float(np.mean(predicted[m] == y_test)) for m in METHODS}


def synthetic_accuracies(params: Any, cfg: ModelConfig, prior: tables.TablePrior, num_tables: int = 200,
                         rows: int = 128, seed: int = tables.EVAL_SEED) -> list[dict[str, float]]:
    """Accuracies (`accuracies`) on `num_tables` held-out tables of the prior, each of `rows` rows
    with its training rows drawn as in training (table i from (seed, 0, i): `tables.eval_batches`'s
    first batch)."""
    results = []
    for i in range(num_tables):
        r, targets = tables._table_row([seed, 0, i], prior, rows)
        train = targets == tables.IGNORED
        x, labels = r[:, :-1], r[:, -1].astype(int)  # standardised already: standardising again is the identity
        results.append(accuracies(params, cfg, x[train], labels[train], x[~train], targets[~train]))
    return results


def split(x: np.ndarray, y: np.ndarray, rng: np.random.Generator, max_train_rows: int, train_fraction: float = 0.5
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A random split of a table: (x_train, y_train, x_test, y_test); the training part is
    train_fraction of the rows, at most max_train_rows (the context the model was trained with)."""
    order = rng.permutation(len(x))
    n = min(int(round(train_fraction * len(x))), max_train_rows)
    return x[order[:n]], y[order[:n]], x[order[n:]], y[order[n:]]


def real_accuracies(params: Any, cfg: ModelConfig, name: str, splits: int = 20, max_train_rows: int = 100,
                    seed: int = 0) -> list[dict[str, float]]:
    """Accuracies (`accuracies`) on `splits` random splits of the bundled table `name`
    (`tables.real_table`: refused if wider than the model), split i drawn from (seed, i)."""
    x, y = tables.real_table(name, cfg.num_features, cfg.num_classes)
    return [accuracies(params, cfg, *split(x, y, np.random.default_rng([seed, i]), max_train_rows))
            for i in range(splits)]


@dataclass(frozen=True)
class Summary:
    """One method's accuracy over many tables or splits: mean, standard deviation, their number."""

    mean: float
    std: float
    n: int

    def __str__(self) -> str:
        return f"{self.mean:.3f} ± {self.std:.3f}"


def summary(results: Sequence[Mapping[str, float]]) -> dict[str, Summary]:
    """{method: Summary} over `results` (one dict of accuracies per table or split)."""
    return {m: Summary(float(np.mean([r[m] for r in results])), float(np.std([r[m] for r in results])), len(results))
            for m in METHODS}


def markdown_table(rows: Mapping[str, Sequence[Mapping[str, float]]]) -> str:
    """A Markdown table: one line per data set (`rows`: name -> results), accuracy mean ± standard
    deviation over its tables or splits for each method, the majority class as the chance line."""
    lines = ["| data | tables / splits | model | kNN (k=5) | logistic regression | majority class |",
             "| --- | --- | --- | --- | --- | --- |"]
    for name, results in rows.items():
        s = summary(results)
        lines.append(f"| {name} | {s['model'].n} | " + " | ".join(str(s[m]) for m in METHODS) + " |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- the soft look-up


def row_attention(params: Any, cfg: ModelConfig, rows: np.ndarray, layer: int = -1) -> np.ndarray:
    """rows [T, F + 1] (one table, `tables.table_rows`) -> the weights [H, T, T] of layer `layer`
    (default the last) for every query row over every key row, from the named point
    blocks.*.attn.pattern (`capture.attention_maps`)."""
    maps = attention_maps(params, cfg, np.asarray(rows)[None])  # [L, 1, H, T, T]
    return np.asarray(maps[layer, 0])


@dataclass(frozen=True)
class Lookup:
    """How a test row's attention over the training rows compares with a nearest-neighbour look-up,
    averaged over the test rows (weights: the heads' mean). All but on_itself read the weights over
    the training rows renormalised to sum to 1, so that they compare with a uniform look-up."""

    on_itself: float  # attention weight on the test row itself (the one other key it sees)
    on_nearest: float  # attention weight on the nearest training row
    uniform: float  # what a uniform look-up over the training rows would give it: 1 / n_train
    top_is_nearest: float  # share of test rows whose most-attended training row is their nearest one
    top_in_5_nearest: float  # ... is among their 5 nearest (chance: 5 / n_train)
    same_class: float  # attention on training rows of the test row's true class
    same_class_uniform: float  # the share of such rows among the training rows
    rank_correlation: float  # Spearman correlation of attention with -distance, per test row


def lookup_statistics(weights: np.ndarray, rows: np.ndarray, targets: np.ndarray) -> Lookup:
    """weights [H, T, T] (`row_attention`), rows [T, F + 1] and targets [T] (IGNORED on training rows)
    of one table -> `Lookup`, the heads' mean attention of each test row over the training rows
    against the training rows' Euclidean distances in the standardised features and their labels."""
    train = targets == tables.IGNORED
    mean = weights.mean(axis=0)  # [T, T]: the heads' mean
    w = mean[~train][:, train]  # [n_test, n_train]: a row sums to 1 - its weight on itself
    w = w / w.sum(axis=1, keepdims=True)  # over the training rows alone
    x, labels = rows[:, :-1], rows[:, -1].astype(int)
    d = np.linalg.norm(x[~train][:, None] - x[train][None], axis=-1)  # [n_test, n_train]
    nearest = d.argmin(axis=1)
    five = np.argsort(d, axis=1)[:, :5]
    top = w.argmax(axis=1)
    same = labels[train][None] == targets[~train][:, None]  # [n_test, n_train]
    return Lookup(
        on_itself=float(np.diagonal(mean)[~train].mean()), on_nearest=float(w[np.arange(len(w)), nearest].mean()), uniform=1.0 / train.sum(),
        top_is_nearest=float(np.mean(top == nearest)),
        top_in_5_nearest=float(np.mean([t in f for t, f in zip(top, five)])),
        same_class=float((w * same).sum(axis=1).mean()), same_class_uniform=float(same.mean()),
        rank_correlation=float(np.mean([_spearman(w_i, -d_i) for w_i, d_i in zip(w, d)])),
    )


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rank correlation of a and b [n] (ties broken by order)."""
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


def lookup_over_tables(params: Any, cfg: ModelConfig, prior: tables.TablePrior, num_tables: int = 50, rows: int = 128,
                       layer: int = -1, seed: int = tables.EVAL_SEED) -> dict[str, Summary]:
    """{Lookup field: Summary over `num_tables` held-out tables of the prior} (table i as in
    `synthetic_accuracies`), for layer `layer`'s attention."""
    found = []
    for i in range(num_tables):
        r, targets = tables._table_row([seed, 0, i], prior, rows)
        found.append(lookup_statistics(row_attention(params, cfg, r, layer), r, targets))
    return {name: Summary(float(np.mean([getattr(f, name) for f in found])),
                          float(np.std([getattr(f, name) for f in found])), len(found))
            for name in Lookup.__dataclass_fields__}


def evaluation(params: Any, cfg: ModelConfig, prior: tables.TablePrior, num_tables: int = 200, splits: int = 20,
               max_train_rows: int = 100, rows: int = 128) -> dict[str, list[dict[str, float]]]:
    """{data set: accuracies per table or split}: `num_tables` held-out synthetic tables of `rows`
    rows, and `splits` random splits of each bundled real table (at most max_train_rows training rows)."""
    results = {"synthetic (held out)": synthetic_accuracies(params, cfg, prior, num_tables, rows)}
    for name in tables.REAL_TABLES:
        results[name] = real_accuracies(params, cfg, name, splits, max_train_rows)
    return results


# ----------------------------------------------------------------------------- the loop's metric


def accuracy_counts(cfg: ModelConfig, inputs: jax.Array):
    """The loop's measure: (params, rows [B, T, F + 1], targets [B, T]) -> {right, graded}: the
    graded targets (the held-out tables' test rows) whose class is the argmax, and their number."""

    def count(params: Any, rows: jax.Array, targets: jax.Array) -> dict[str, jax.Array]:
        logits, _ = Decoder(cfg).apply({"params": params}, rows)
        graded = targets != tables.IGNORED
        return {"right": jnp.sum((logits.argmax(-1) == targets) & graded), "graded": jnp.sum(graded)}

    return count


def accuracy_report(cfg: ModelConfig, counts: list[dict]) -> dict[str, float]:
    """{val_accuracy}: the share of graded targets classified right over every validation batch."""
    right, graded = (sum(int(c[k]) for c in counts) for k in ("right", "graded"))
    return {"val_accuracy": float(right / max(graded, 1))}


TABLE_ACCURACY = EvalMetric("table_accuracy", accuracy_counts, accuracy_report)
