"""The training loop's arguments (transformer/data/tasks.py, transformer/training/eval_metrics.py)
and the table the command line picks them from (transformer/experiments/catalog.py): a data task and
an evaluation metric the loop has never heard of train and log like the built-in ones, and a name
the table does not hold is a one-line error."""

from __future__ import annotations

import contextlib
import io

import jax
import numpy as np
import pytest

from configs import tiny
from transformer.data import batches
from transformer.data.tasks import DataTask
from transformer.experiments.catalog import METRICS, TASKS, data_task, eval_metrics
from transformer.run.metrics import read_metrics
from transformer.training.eval_metrics import EvalMetric
from transformer.training.loop import train
from transformer.training.setup import set_up

CALLS = []  # the steps the loop asked the test's task for


def abcd(tokens, *, batch_size, seq_len, host_index=0, host_count=1, step=None, **_):
    """A task of this test: "abcdabcd..." in every row of every batch, whatever the corpus."""
    CALLS.append(step)
    rows = (97 + np.arange(seq_len + 1, dtype=np.int32) % 4)[None].repeat(batch_size // host_count, axis=0)
    return rows[:, :-1], rows[:, 1:]


ABCD = DataTask(batch_at=abcd,
                eval_batches=lambda tokens, *, num_batches, **kw: [abcd(tokens, **kw) for _ in range(num_batches)])


def param_count(cfg, inputs):
    """A metric of this test: the number of parameters and the batch's rows, from the loop's arguments."""
    return lambda params, x, y: {"params": sum(p.size for p in jax.tree.leaves(params)), "rows": x.shape[0]}


PROBE = EvalMetric("probe", param_count, lambda cfg, measures: {
    "probe_params": float(measures[0]["params"]), "probe_rows": float(measures[0]["rows"])}, first_batch=True)


def tiny_config(tmp_path, task="text"):
    config = tiny.get_config()
    config.data.task = task
    config.data.cache_dir = str(tmp_path / "tokens")
    config.train.update(dict(steps=6, eval_every=3, checkpoint_every=6, log_every=3, sample_tokens=0))
    return config


def test_the_table_holds_the_built_in_tasks_and_metrics():
    assert {"text", "needle"} <= set(TASKS)
    config = tiny.get_config()
    config.train.eval_attention_shares = True
    assert "attention_shares" in [m.name for m in eval_metrics(config)]
    config.train.eval_attention_shares = False
    assert "attention_shares" not in [m.name for m in eval_metrics(config)]


@pytest.mark.slow
def test_a_registered_task_and_metric_train_and_log(tmp_path):
    """The loop trains on the task's batches (steps 0-5 asked for; "abcd" is learnt far faster than
    the text), and the metric's values land in the evaluation rows."""
    losses = {}
    for task, data in (("abcd", ABCD), ("text", data_task(tiny.get_config()))):
        with contextlib.redirect_stdout(io.StringIO()):
            run = set_up(tiny_config(tmp_path, task), str(tmp_path / task), data, [PROBE])
            losses[task] = train(run, progress=False)["val_loss"]
    assert losses["abcd"] < losses["text"] - 0.3, losses  # measured: 4.09 against 4.75
    assert sorted(set(CALLS) - {None})[:6] == list(range(6))  # the prefetcher may ask for a step ahead
    rows = [r for r in read_metrics(str(tmp_path / "abcd" / "metrics.jsonl")) if "val_loss" in r]
    assert [r["step"] for r in rows] == [3, 6]
    assert all(r["probe_params"] == 87_552 and r["probe_rows"] == 8 for r in rows), rows


def test_the_text_task_is_the_corpus_windows():
    task = data_task(tiny.get_config())
    tokens = np.arange(1000)
    x, y = task.batch_at(tokens, seed=0, step=3, batch_size=4, seq_len=8)
    np.testing.assert_array_equal(x, batches.batch_at(tokens, seed=0, step=3, batch_size=4, seq_len=8)[0])


def test_an_unknown_task_names_the_known_ones():
    config = tiny.get_config()
    config.data.task = "needel"
    with pytest.raises(ValueError, match=r"data.task='needel' is not known; use one of .*'needle'.*'text'"):
        data_task(config)


def test_each_name_is_in_the_table_once():
    """The table is a dict of tasks and a list of metrics: a metric's name appears once."""
    names = [metric.name for metric, _ in METRICS]
    assert len(names) == len(set(names))
    assert sorted(TASKS) == ["images", "needle", "proteins", "tables", "text", "vqa"]
