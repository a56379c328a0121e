"""A table model (ModelConfig(inputs='table')) against k-nearest neighbours and logistic regression
fitted on the same standardised training rows (scikit-learn: the `dev` and `notebooks` extras).

    predict(params, cfg, x_train, y_train, x_test)       # class probabilities [n_test, C]
    evaluation(params, cfg, prior)                        # {data set: accuracies per table or split}
    markdown_table(results), summary(results)             # mean ± spread per method, chance included
    row_attention(params, cfg, rows)                      # the last layer's weights [H, T, T]
    lookup_over_tables(params, cfg, prior)                # does attention act as a nearest-neighbour look-up?"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
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
    """Class probabilities [n_test, C] for x_test [n_test, f] given x_train [n, f] with classes y_train [n]:
    one forward pass per `chunk` test rows (a test row sees only the training rows and itself)."""
    rows = tables.table_rows(x_train, y_train, x_test, cfg.num_features)  # [n + n_test, F + 1]
    n = len(x_train)
    out = []
    for start in range(0, len(x_test), chunk):
        part = rows[n + start: n + start + chunk]
        # Unlabelled padding rows up to a multiple of PAD_TO: no other row sees them, and few shapes compile.
        padding = np.zeros((-(n + len(part)) % PAD_TO, part.shape[1]), np.float32)
        padding[:, -1] = tables.UNLABELLED
        batch = np.concatenate([rows[:n], part, padding])[None]  # [1, T, F + 1]
        out.append(np.asarray(_probabilities(params, cfg, batch))[0, n: n + len(part)])
    return np.concatenate(out)


def baselines(x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray, k: int = 5) -> dict[str, np.ndarray]:
    """{'knn', 'logistic', 'majority'}: the classes [n_test] of k-nearest neighbours, logistic regression
    (scikit-learn's defaults) and the training rows' most frequent class."""
    from sklearn.linear_model import LogisticRegression  # optional: the dev and notebooks extras
    from sklearn.neighbors import KNeighborsClassifier

    rows = tables.table_rows(x_train, y_train, x_test, x_train.shape[1])
    train, test = rows[: len(x_train), :-1], rows[len(x_train):, :-1]
    knn = KNeighborsClassifier(min(k, len(train))).fit(train, y_train).predict(test)
    if len(np.unique(y_train)) < 2:  # one class seen: logistic regression cannot be fitted; it is the answer
        logistic = np.full(len(test), y_train[0])
    else:
        logistic = LogisticRegression(max_iter=2000).fit(train, y_train).predict(test)
    return {"knn": knn, "logistic": logistic, "majority": np.full(len(test), np.bincount(y_train).argmax())}


def accuracies(params: Any, cfg: ModelConfig, x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray,
               y_test: np.ndarray) -> dict[str, float]:
    """{method: accuracy on the test rows} of one split."""
    predicted = {"model": predict(params, cfg, x_train, y_train, x_test).argmax(-1),
                 **baselines(x_train, y_train, x_test)}
    return {m: float(np.mean(predicted[m] == y_test)) for m in METHODS}


def held_out_tables(prior: tables.TablePrior, num_tables: int, rows: int, seed: int = tables.EVAL_SEED):
    """(rows [T, F + 1], targets [T]) of held-out table i, drawn from (seed, 0, i): `eval_batches`' first batch."""
    return (tables._table_row([seed, 0, i], prior, rows) for i in range(num_tables))


def evaluation(params: Any, cfg: ModelConfig, prior: tables.TablePrior, num_tables: int = 200, splits: int = 20,
               max_train_rows: int = 100, rows: int = 128) -> dict[str, list[dict[str, float]]]:
    """{data set: `accuracies` per table or split}: held-out tables of the prior, and random splits (i
    from (0, i)) of each real table, half for training but at most max_train_rows (the trained context)."""
    synthetic = []
    for r, targets in held_out_tables(prior, num_tables, rows):
        train = targets == tables.IGNORED
        x, labels = r[:, :-1], r[:, -1].astype(int)  # standardised already: standardising again is the identity
        synthetic.append(accuracies(params, cfg, x[train], labels[train], x[~train], targets[~train]))
    results = {"synthetic (held out)": synthetic}
    for name in tables.REAL_TABLES:
        x, y = tables.real_table(name, cfg.num_features, cfg.num_classes)
        results[name] = []
        for i in range(splits):
            order = np.random.default_rng([0, i]).permutation(len(x))
            train, test = np.split(order, [min(int(round(0.5 * len(x))), max_train_rows)])
            results[name].append(accuracies(params, cfg, x[train], y[train], x[test], y[test]))
    return results


@dataclass(frozen=True)
class Summary:
    """One quantity over many tables or splits: mean, standard deviation, their number."""

    mean: float
    std: float
    n: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Summary:
        return cls(float(np.mean(values)), float(np.std(values)), len(values))

    def __str__(self) -> str:
        return f"{self.mean:.3f} ± {self.std:.3f}"


def summary(results: Sequence[Mapping[str, float]]) -> dict[str, Summary]:
    """{method: Summary} over `results` (one dict of accuracies per table or split)."""
    return {m: Summary.of([r[m] for r in results]) for m in METHODS}


def markdown_table(rows: Mapping[str, Sequence[Mapping[str, float]]]) -> str:
    """One line per data set (`rows`: name -> results): accuracy mean ± standard deviation per method."""
    lines = ["| data | tables / splits | model | kNN (k=5) | logistic regression | majority class |",
             "| --- | --- | --- | --- | --- | --- |"]
    for name, results in rows.items():
        s = summary(results)
        lines.append(f"| {name} | {s['model'].n} | " + " | ".join(str(s[m]) for m in METHODS) + " |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- the soft look-up


def row_attention(params: Any, cfg: ModelConfig, rows: np.ndarray, layer: int = -1) -> np.ndarray:
    """rows [T, F + 1] of one table -> layer `layer`'s weights [H, T, T] of every query row over every key row."""
    return np.asarray(attention_maps(params, cfg, np.asarray(rows)[None])[layer, 0])  # maps: [L, 1, H, T, T]


@dataclass(frozen=True)
class Lookup:
    """A test row's attention (the heads' mean) against a nearest-neighbour look-up, averaged over the
    test rows. All but on_itself read the weights over the training rows renormalised to sum to 1."""

    on_itself: float  # attention weight on the test row itself (the one other key it sees)
    on_nearest: float  # attention weight on the nearest training row
    uniform: float  # what a uniform look-up over the training rows would give it: 1 / n_train
    top_is_nearest: float  # share of test rows whose most-attended training row is their nearest one
    top_in_5_nearest: float  # ... is among their 5 nearest (chance: 5 / n_train)
    same_class: float  # attention on training rows of the test row's true class
    same_class_uniform: float  # the share of such rows among the training rows
    rank_correlation: float  # Spearman correlation of attention with -distance, per test row


def lookup_statistics(weights: np.ndarray, rows: np.ndarray, targets: np.ndarray) -> Lookup:
    """`Lookup` of one table from weights [H, T, T] (`row_attention`), rows [T, F + 1] and targets [T]
    (IGNORED on training rows), distances Euclidean in the standardised features."""
    train = targets == tables.IGNORED
    mean = weights.mean(axis=0)  # [T, T]: the heads' mean
    w = mean[~train][:, train]  # [n_test, n_train]: a row sums to 1 - its weight on itself
    w = w / w.sum(axis=1, keepdims=True)
    x, labels = rows[:, :-1], rows[:, -1].astype(int)
    d = np.linalg.norm(x[~train][:, None] - x[train][None], axis=-1)  # [n_test, n_train]
    nearest, five, top = d.argmin(axis=1), np.argsort(d, axis=1)[:, :5], w.argmax(axis=1)
    same = labels[train][None] == targets[~train][:, None]  # [n_test, n_train]
    rank = lambda a: np.argsort(np.argsort(a), axis=-1)  # noqa: E731 (ties broken by order)
    return Lookup(
        on_itself=float(np.diagonal(mean)[~train].mean()), on_nearest=float(w[np.arange(len(w)), nearest].mean()),
        uniform=1.0 / train.sum(), top_is_nearest=float(np.mean(top == nearest)),
        top_in_5_nearest=float(np.mean([t in f for t, f in zip(top, five)])),
        same_class=float((w * same).sum(axis=1).mean()), same_class_uniform=float(same.mean()),
        rank_correlation=float(np.mean([np.corrcoef(rank(w_i), rank(-d_i))[0, 1] for w_i, d_i in zip(w, d)])),
    )


def lookup_over_tables(params: Any, cfg: ModelConfig, prior: tables.TablePrior, num_tables: int = 50, rows: int = 128,
                       layer: int = -1, seed: int = tables.EVAL_SEED) -> dict[str, Summary]:
    """{Lookup field: Summary} over the held-out tables (`held_out_tables`), for layer `layer`'s attention."""
    found = [lookup_statistics(row_attention(params, cfg, r, layer), r, targets)
             for r, targets in held_out_tables(prior, num_tables, rows, seed)]
    return {f.name: Summary.of([getattr(x, f.name) for x in found]) for f in fields(Lookup)}


# ----------------------------------------------------------------------------- the loop's metric: val_accuracy


def accuracy_counts(cfg: ModelConfig, inputs: jax.Array):
    """(params, rows [B, T, F + 1], targets [B, T]) -> {right, graded}: the graded test rows classified right."""
    def count(params: Any, rows: jax.Array, targets: jax.Array) -> dict[str, jax.Array]:
        logits, _ = Decoder(cfg).apply({"params": params}, rows)
        graded = targets != tables.IGNORED
        return {"right": jnp.sum((logits.argmax(-1) == targets) & graded), "graded": jnp.sum(graded)}

    return count


def accuracy_report(cfg: ModelConfig, counts: list[dict]) -> dict[str, float]:
    right, graded = (sum(int(c[k]) for c in counts) for k in ("right", "graded"))
    return {"val_accuracy": float(right / max(graded, 1))}


TABLE_ACCURACY = EvalMetric("table_accuracy", accuracy_counts, accuracy_report)
