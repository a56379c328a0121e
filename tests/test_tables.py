"""The table task: the prior's tables, the table mask, a table model that learns, the real tables' checks.

A table model (ModelConfig(inputs='table')) reads rows [B, T, F + 1]: features, then a label (a class
id for a training row, -1 for a test row). A test row sees every training row and itself, no other
test row; training rows see each other in full (a set has no order).
"""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs.tables import get_config
from tests.helpers.marks import first_fast
from transformer.experiments.tables import table_rows as tables
from transformer.data.batches import IGNORED
from transformer.experiments.catalog import data_task
from transformer.model import ops, table
from transformer.model.config import ModelConfig
from transformer.model.decoder import Decoder, example_input
from transformer.training.optimizer import make_optimizer
from transformer.training.sharding import make_mesh, make_rules, param_axes
from transformer.training.steps import create_state, init_params, make_train_step

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def table_cfg(**changes) -> ModelConfig:
    fields = dict(vocab_size=4, max_seq_len=64, d_model=32, num_layers=2, num_heads=2, mlp_dim=64, position="none",
                  tie_embeddings=False, inputs="table", num_features=6, num_classes=3, scan_layers=False)
    return ModelConfig(**{**fields, **changes})


# --- the prior's tables ----------------------------------------------------------------------------


def test_the_prior_gives_rows_of_the_asked_shape_and_classes():
    prior = tables.TablePrior()
    rows, targets = tables.batch_at(None, seed=0, step=3, batch_size=16, seq_len=64, prior=prior)
    assert rows.shape == (16, 64, 33) and rows.dtype == np.float32
    assert targets.shape == (16, 64) and targets.dtype == np.int32
    labels = rows[..., -1].astype(int)
    train = labels >= 0
    assert set(np.unique(labels)) <= {-1, 0, 1, 2, 3}
    assert np.all(targets[train] == IGNORED), "the loss grades the test rows only"
    assert np.all((targets[~train] >= 0) & (targets[~train] < 4))
    n_train = train.sum(axis=1)
    assert np.all(n_train >= prior.min_train_rows) and np.all(64 - n_train >= prior.min_test_rows)
    assert np.all(train[:, :1]) and np.all(np.diff(train.astype(int), axis=1) <= 0), "training rows first"
    assert np.abs(rows[..., :-1]).max() <= tables.CLIP
    for b in range(16):  # standardised with the training rows' statistics: mean 0 over them
        used = np.abs(rows[b, :, :-1]).sum(axis=0) > 0
        assert np.allclose(rows[b][train[b]][:, :-1][:, used].mean(axis=0), 0, atol=0.35)
    widths = [int((np.abs(rows[b, :, :-1]).sum(axis=0) > 0).sum()) for b in range(16)]
    assert max(widths) <= 32 and len(set(widths)) > 1, "tables of different widths, zero-padded"


def test_the_tables_depend_on_seed_and_step_only_and_hosts_split_the_rows():
    prior = tables.TablePrior()
    a = tables.batch_at(None, seed=1, step=7, batch_size=8, seq_len=32, prior=prior)
    b = tables.batch_at(None, seed=1, step=7, batch_size=8, seq_len=32, prior=prior)
    c = tables.batch_at(None, seed=1, step=8, batch_size=8, seq_len=32, prior=prior)
    second = tables.batch_at(None, seed=1, step=7, batch_size=8, seq_len=32, prior=prior, host_index=1, host_count=2)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]) and not np.array_equal(a[0], c[0])
    assert np.array_equal(second[0], a[0][4:]) and np.array_equal(second[1], a[1][4:])
    held_out = tables.eval_batches(None, num_batches=2, batch_size=8, seq_len=32, prior=prior)
    assert len(held_out) == 2 and not np.array_equal(held_out[0][0], a[0])


def test_every_class_of_a_table_is_drawn_and_the_class_count_spans_the_prior():
    prior = tables.TablePrior(max_classes=4)
    counts = []
    for i in range(40):
        x, y = tables.draw_table(np.random.default_rng(i), 200, prior)
        assert x.ndim == 2 and 1 <= x.shape[1] <= 32 and y.shape == (200,)
        counts.append(len(np.unique(y)))
        assert y.min() >= 0 and y.max() < 4
    assert set(counts) >= {2, 3, 4}


def test_the_row_format_is_the_same_in_data_and_model():
    assert tables.UNLABELLED == table.UNLABELLED


def test_the_task_checks_the_model_against_the_prior():
    config = get_config()
    assert data_task(config).text is False
    config.model.num_features = 16
    with pytest.raises(ValueError, match="model.num_features=32"):
        data_task(config)
    config = get_config()
    config.model.inputs = "tokens"
    with pytest.raises(ValueError, match="model.inputs='table'"):
        data_task(config)


def test_the_config_refuses_what_a_table_model_cannot_read():
    with pytest.raises(ValueError, match="position='none'"):
        table_cfg(position="learned")
    with pytest.raises(ValueError, match="num_features >= 1 and num_classes >= 2"):
        table_cfg(num_classes=1)
    with pytest.raises(ValueError, match="inputs='table' only"):
        ModelConfig(vocab_size=8, max_seq_len=8, d_model=8, num_layers=1, num_heads=1, num_classes=3)


def test_every_parameter_of_a_table_model_has_logical_axes():
    for cfg in (table_cfg(), table_cfg(scan_layers=True)):
        shapes = jax.eval_shape(lambda: Decoder(cfg).init(jax.random.key(0), example_input(cfg)))["params"]
        names = [tuple(k.key for k in path) for path, _ in jax.tree_util.tree_leaves_with_path(shapes)]
        assert ("row_embed", "kernel") in names and ("head", "kernel") in names and ("embed", "embedding") not in names
        for path, x in jax.tree_util.tree_leaves_with_path(shapes):
            param_axes(tuple(k.key for k in path), x.ndim)  # raises for a parameter the table misses
        make_rules(cfg, make_mesh())


# --- the mask -----------------------------------------------------------------------------------


def visible(mask: jax.Array) -> np.ndarray:
    return np.asarray(mask[:, 0] == 0)  # [B, T, S]


def test_the_table_mask_shows_test_rows_every_training_row_and_no_other_test_row():
    train = np.array([[True] * 5 + [False] * 4])  # 5 training rows, 4 test rows
    positions = jnp.arange(9)[None]
    rows = jnp.where(jnp.asarray(train)[..., None], 0.0, float(table.UNLABELLED))  # [1, 9, 1]: the label column
    seen = visible(table.row_order(rows))[0]  # [T, S]
    test = ~train[0]
    assert seen[test][:, train[0]].all(), "a test row sees every training row"
    assert np.array_equal(seen[test][:, test], np.eye(4, dtype=bool)), "and of the test rows only itself"
    assert seen[train[0]][:, train[0]].all(), "training rows see each other in full (a set has no order)"
    assert not seen[train[0]][:, test].any(), "no row sees a test row but itself"
    causal = visible(ops.causal_mask(positions, positions))[0]
    assert not np.array_equal(causal, seen), "the causal mask cannot say this"


def rows_for(cfg: ModelConfig, n_train: int, n_test: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n_train + n_test, cfg.num_features))
    y = rng.integers(0, cfg.num_classes, n_train)
    return tables.table_rows(x[:n_train], y, x[n_train:], cfg.num_features)[None]


@pytest.mark.parametrize("scan_layers", first_fast([False, True], ["loop", "scan"]))  # the scan: make test-all
def test_no_test_row_sees_another_and_each_sees_every_training_row(scan_layers):
    cfg = table_cfg(scan_layers=scan_layers)
    params = init_params(cfg, jax.random.key(0))
    rows = rows_for(cfg, 10, 6)
    forward = jax.jit(lambda r, p=params: Decoder(cfg).apply({"params": p}, r)[0])
    logits = np.asarray(forward(rows))[0]  # [T, C]
    other = rows.copy()
    other[0, 12, :-1] += 3.0  # another test row's features
    changed = np.abs(np.asarray(forward(other))[0] - logits).max(axis=-1)
    assert changed[12] > 0 and np.all(changed[[10, 11, 13, 14, 15]] == 0), "no test row sees another"
    labelled = rows.copy()
    labelled[0, 12, -1] = 1  # the same row given a label: now a training row, which every row sees
    assert np.all(np.abs(np.asarray(forward(labelled))[0] - logits).max(axis=-1)[[10, 11, 13, 14, 15]] > 0)
    for j in range(10):  # every training row's features reach every test row
        moved = rows.copy()
        moved[0, j, :-1] += 3.0
        assert np.all(np.abs(np.asarray(forward(moved))[0, 10:] - logits[10:]).max(axis=-1) > 0)
    relabelled = rows.copy()
    relabelled[0, 0, -1] = (relabelled[0, 0, -1] + 1) % cfg.num_classes  # a training row's label
    assert np.all(np.abs(np.asarray(forward(relabelled))[0, 10:] - logits[10:]).max(axis=-1) > 0)


def test_a_table_is_classified_the_same_in_any_batches_of_test_rows():
    cfg = table_cfg()
    params = init_params(cfg, jax.random.key(1))
    rows = rows_for(cfg, 8, 6)
    forward = jax.jit(lambda r, p=params: Decoder(cfg).apply({"params": p}, r)[0])
    whole = np.asarray(forward(rows))[0, 8:]
    parts = [np.asarray(forward(np.concatenate([rows[:, :8], rows[:, 8 + i:9 + i]], 1)))[0, 8] for i in range(6)]
    np.testing.assert_allclose(np.stack(parts), whole, atol=1e-5)


def test_bad_rows_get_a_clear_error():
    cfg = table_cfg()
    params = init_params(cfg, jax.random.key(0))
    rows = rows_for(cfg, 4, 2)
    with pytest.raises(ValueError, match=r"reads rows \[B, T, 7\]"):
        Decoder(cfg).apply({"params": params}, rows[..., 1:])
    rows[0, 0, -1] = 5
    with pytest.raises(ValueError, match="label 5, outside 0..2"):
        Decoder(cfg).apply({"params": params}, rows)


# --- a table model learns -------------------------------------------------------------------------


def test_a_few_steps_on_separable_tables_beat_chance():
    prior = tables.TablePrior(max_features=2, max_classes=2, mlp_share=0.0, min_separation=8.0, max_separation=8.0)
    cfg = table_cfg(num_features=2, num_classes=2, num_layers=1, d_model=32)
    config = get_config()
    config.optim.warmup_steps, config.optim.learning_rate = 5, 3e-3
    tx, schedule = make_optimizer(config.optim, 40)
    mesh = make_mesh()
    state = create_state(cfg, tx, 0, mesh)
    step = make_train_step(cfg, tx, schedule, mesh, state)  # the run's own train step
    for s in range(40):
        rows, targets = tables.batch_at(None, seed=0, step=s, batch_size=8, seq_len=32, prior=prior)
        state, _ = step(state, rows, targets)
    rows, targets = tables.eval_batches(None, num_batches=1, batch_size=64, seq_len=32, prior=prior)[0]
    logits = jax.jit(lambda p, r: Decoder(cfg).apply({"params": p}, r)[0])(state.params, rows)
    graded = targets != IGNORED
    accuracy = float((np.asarray(logits).argmax(-1) == targets)[graded].mean())
    assert accuracy > 0.75, f"accuracy {accuracy:.2f} on separable two-class tables (chance 0.5)"


# --- real tables ----------------------------------------------------------------------------------


def test_a_table_wider_than_the_model_is_refused_naming_the_fix():
    x, y = np.zeros((10, 13)), np.arange(10) % 3
    with pytest.raises(ValueError, match="13 features but the model was trained for at most 4.*model.num_features >= 13"):
        tables.check_fits("wine", x, y, num_features=4, num_classes=4)
    with pytest.raises(ValueError, match="3 classes but the model was trained for at most 2.*model.num_classes >= 3"):
        tables.check_fits("wine", x, y, num_features=32, num_classes=2)
    tables.check_fits("wine", x, y, num_features=32, num_classes=4)


def test_the_bundled_real_tables_load_and_are_checked():
    pytest.importorskip("sklearn")
    x, y = tables.real_table("iris", num_features=32, num_classes=4)
    assert x.shape == (150, 4) and set(y) == {0, 1, 2}
    with pytest.raises(ValueError, match="30 features"):
        tables.real_table("breast_cancer", num_features=16, num_classes=4)
    with pytest.raises(ValueError, match="no bundled table 'titanic'"):
        tables.real_table("titanic", 32, 4)


@pytest.mark.slow
def test_train_py_trains_the_table_config_without_text(tmp_path):
    workdir = tmp_path / "tables"
    command = [sys.executable, "train.py", "--config", "configs/tables.py", f"--workdir={workdir}",
               "--config.optim.warmup_steps=1", "--config.train.eval_batches=1", "--config.train.batch_size=4",
               "--config.train.seq_len=32", "--config.model.d_model=32", "--config.model.num_layers=1"]
    result = subprocess.run(command + ["--config.train.steps=4"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "bits/byte" not in result.stdout and "--- sample ---" not in result.stdout
    assert not (workdir / "tokenizer").exists() and (workdir / "checkpoints").is_dir()
    other_prior = subprocess.run(command + ["--config.train.steps=6", "--config.data.tables.mlp_share=0.2"], cwd=ROOT,
                                 capture_output=True, text=True, timeout=300)
    assert other_prior.returncode == 1 and "data.tables.mlp_share: checkpoint 0.5, config 0.2" in other_prior.stderr
    sampled = subprocess.run([sys.executable, "sample.py", f"--workdir={workdir}", "--prompt=x"], cwd=ROOT,
                             capture_output=True, text=True, timeout=300)
    assert sampled.returncode == 1 and "holds a table model" in sampled.stderr and "eval_tables.py" in sampled.stderr


def test_the_lookup_statistics_of_a_nearest_neighbour_look_up():
    from transformer.experiments.tables.table_classifier import lookup_statistics

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(12, 3)), np.array([0, 1] * 4)
    rows = tables.table_rows(x[:8], y, x[8:], 4)
    targets = np.r_[np.full(8, IGNORED), [0, 1, 0, 1]]
    nearest = np.linalg.norm(rows[8:, None, :-1] - rows[None, :8, :-1], axis=-1).argmin(axis=1)
    weights = np.zeros((2, 12, 12))
    weights[:, np.arange(8, 12), nearest] = 1.0  # every head: all weight on the nearest training row
    found = lookup_statistics(weights, rows, targets)
    assert found.top_is_nearest == 1.0 and found.on_nearest == 1.0 and found.on_itself == 0.0
    assert found.uniform == 1 / 8 and found.same_class == np.mean(y[nearest] == targets[8:])


def test_the_loop_metric_is_the_share_of_test_rows_classified_right():
    from transformer.experiments.catalog import eval_metrics
    from transformer.training.eval_metrics import compile_metric

    assert [m.name for m in eval_metrics(get_config())] == ["table_accuracy"]
    cfg = table_cfg(num_features=32, num_classes=4, num_layers=1)
    mesh = make_mesh()
    tx, _ = make_optimizer(get_config().optim, 1000)
    state = create_state(cfg, tx, 0, mesh)
    eval_set = tables.eval_batches(None, num_batches=2, batch_size=4, seq_len=32, prior=tables.TablePrior())
    measure = compile_metric(eval_metrics(get_config())[0], cfg, mesh, state, make_rules(cfg, mesh), eval_set[0][0])
    forward = jax.jit(lambda r, p=state.params: Decoder(cfg).apply({"params": p}, r)[0])
    right = [(np.asarray(forward(r)).argmax(-1) == t)[t != IGNORED] for r, t in eval_set]
    assert measure(state.params, eval_set)["val_accuracy"] == pytest.approx(np.concatenate(right).mean())
